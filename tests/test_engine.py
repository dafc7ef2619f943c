"""The engine through every registered store against the numpy reference, on a tiny random GPT-2."""

from collections import Counter

import numpy as np
import pytest

from vecgpt import engine, text_keys, tokenizer, tolerance
from vecgpt.api import generate
from vecgpt.engine import Engine
from vecgpt.errors import VecgptError
from vecgpt.loading import push
from vecgpt.reference import Reference, softmax
from vecgpt.sampling import choose, draw

from conftest import SLOW

PROMPTS = ["Hello world", "The quick brown fox jumps over", ""]
# Tolerances are derived per step by vecgpt.tolerance from each search's error bound; see there.


@pytest.fixture(params=["l2", "ip"])
def metric(request):
    return request.param


def engine_for(make_store, backend, model, metric, **kw):
    return Engine(make_store.loaded(backend, model, metric), **kw)


def test_logits_match_reference_by_token(make_store, backend, metric, tiny_model, model64):
    engine = engine_for(make_store, backend, tiny_model, metric)
    for prompt in PROMPTS[:1] if backend in SLOW else PROMPTS:  # conftest.SLOW: the first prompt
        ids = tokenizer.encode(prompt)
        greedy = generate(Reference(model64, np.float64), ids, 16, stop=False).tokens
        text = engine.open()
        r = tolerance.forced_comparison(text, model64, ids, greedy, metric, tolerance.unit_roundoff(backend))
        text.close()
        print(
            f"{backend}-{metric} {prompt!r}: tol {r['tol'].min():.2e}..{r['tol'].max():.2e}, "
            f"max error {r['max_error'].max():.2e}"
        )
        assert not r["violations"], (prompt, r["violations"][:5])


@pytest.mark.parametrize("metric_", ["l2", "ip"])
def test_free_greedy_on_the_float64_memory_store(make_store, tiny_model, model64, metric_):
    """The one strict free-running check: where numpy's top-2 gap exceeds twice the derived
    tolerance at every step, greedy tokens must be identical."""
    engine = engine_for(make_store, "memory", tiny_model, metric_)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        ref = generate(Reference(model64, np.float64), ids, 16, stop=False).tokens
        exact = tolerance.forced_logits(model64, ids, ref)
        tol = tolerance.logit_tolerance(model64, ids, ref, metric_, tolerance.unit_roundoff("memory"), exact)
        assert np.all(tolerance.greedy_margin(exact) > 2 * tol), prompt  # the precondition
        text = engine.open()
        assert generate(text, ids, 16, stop=False).tokens == ref, prompt
        text.close()


def test_sampling_draws_the_same_tokens(make_store, backend, tiny_model, model64):
    """Teacher-forced on numpy's sampled tokens: the store's draw with the same uniform number is
    numpy's wherever the derived tolerance cannot move it (no near tie at the chosen rank, the
    number not within the CDF's error of a boundary); the other steps are counted, never guessed."""
    engine = engine_for(make_store, backend, tiny_model, "l2")
    ids, temperature, k, seed = tokenizer.encode("Once upon a time"), 0.9, 40, 7
    ref = generate(Reference(model64, np.float64), ids, 24, temperature=temperature, top_k=k, seed=seed, stop=False)
    text = engine.open()
    r = tolerance.forced_comparison(text, model64, ids, ref.tokens, "l2", tolerance.unit_roundoff(backend), k)
    text.close()
    checked, skipped = 0, Counter()
    for step, (cands, row, tol) in enumerate(zip(r["candidates"], r["exact"], r["tol"])):
        u = draw(seed, len(ids) + step)
        want, why = tolerance.sure_draw(row, u, temperature, k, tol)
        if want is None:
            skipped[why] += 1
            continue
        assert want == ref.tokens[step]
        assert choose(cands, temperature, k, u) == want, step
        checked += 1
    print(f"{backend}: {checked} draws checked, skipped {dict(skipped)}")
    assert checked >= 6  # deterministic: which steps count depends on float64 numpy and the store's roundoff alone


def test_token_by_token_equals_block(make_store, tiny_model):
    store = make_store("memory")
    push(store, tiny_model, "l2", progress=False)
    ids = tokenizer.encode("a b c d e f g")
    block = Engine(store, prompt_block=True).open().read(ids)
    single_text = Engine(store, prompt_block=False).open()
    single = single_text.read(ids)
    assert np.array_equal(block.ids, single.ids)
    np.testing.assert_allclose(block.logits, single.logits, atol=1e-9)
    assert len(single_text.meter.tokens) == 1


def test_attention_softmax_is_the_references_bit_for_bit_in_the_scores_own_array():
    rng = np.random.default_rng(5)
    scores = rng.standard_normal((12, 7, 50)) * 40
    scores[..., 3:, 45:] = -np.inf  # a block's masked keys
    got = engine.softmax_in_place(held := scores.copy())
    assert got is held and np.array_equal(got, softmax(scores))


def test_truncate_and_reread_pays_only_new_positions(make_store, tiny_model, model64):
    store = make_store("memory")
    push(store, tiny_model, "l2", progress=False)
    text = Engine(store).open()
    ids = tokenizer.encode("To be or not to be, that is")
    text.read(ids)
    text.truncate(4)  # step back: positions 4.. are read again and overwrite their keys
    cands = text.read(ids[4:])
    exact, tol = tolerance.block_tolerance(model64, ids, "l2", tolerance.unit_roundoff("memory"))
    assert not tolerance.disagreements(cands, exact[-1], 40, tol[-1])


def test_round_trips_per_token(make_store, tiny_model):
    store = make_store("memory")
    push(store, tiny_model, "l2", progress=False)
    text = Engine(store).open()
    generate(text, tokenizer.encode("To be or not to be, that is"), 3, stop=False)
    summary = text.meter.summary()
    L = tiny_model.hparams.n_layer
    # decode: per layer c_attn, the key search with the values' projections by head, c_fc, c_proj; the token search
    # (the keys written with it: the memory store has no writer thread), which brings the next token's rows along
    assert [t["round_trips"] for t in summary["per_token"][1:]] == [4 * L + 1] * 2
    assert all(
        "lookup" not in t["round_trips_by_kind"] and t["by_kind"]["lookup"] == 1 for t in summary["per_token"][1:]
    )
    # the prompt block: open, lookup, per layer c_attn, projections, the key search of the block's own keys (their
    # write in the same round, ahead of it: the memory store runs a round's calls in order), c_fc, c_proj; the
    # token search
    assert summary["per_token"][0]["round_trips"] == 1 + 1 + 5 * L + 1
    assert summary["per_token"][0]["by_kind"]["key_search"] == L
    assert summary["per_token"][0]["by_kind"]["key_write"] == L
    # the memory store answers a layer's head searches (one search_many) with one scan
    assert summary["per_token"][1]["by_kind"]["key_search"] == L
    assert summary["per_token"][1]["subqueries_by_kind"]["key_search"] == L * tiny_model.hparams.n_head
    assert summary["per_token"][1]["by_kind"]["key_write"] == 1  # every layer's keys of a step in one write


@pytest.mark.parametrize("backend", ["memory", "lancedb"])
def test_rows_read_ahead_give_what_a_fetch_gives_bit_for_bit(make_store, tiny_model, backend):
    """The next token's rows, come with the token search, against the same text read with them fetched: the same
    logits to the last bit; a token that was no candidate, or a text stepped back, fetches its rows."""
    store = make_store(backend)
    push(store, tiny_model, "l2", progress=False)
    engine = Engine(store, top_k=5)
    ahead, fetched = engine.open(), engine.open()
    prompt = tokenizer.encode("To be or not to be")
    first = ahead.read(prompt)
    fetched.read(prompt)
    for token in [int(first.ids[1]), None]:  # a candidate, then a token that is none
        token = next(i for i in range(100) if i not in first.ids) if token is None else token
        fetched.ahead = None
        assert ahead.ahead is not None and ahead.ahead.position == len(ahead.tokens)
        was = ahead.meter.summary()["round_trips_by_kind"].get("lookup", 0)
        got, want = ahead.read([token]), fetched.read([token])
        assert got.ids.tolist() == want.ids.tolist() and np.array_equal(got.logits, want.logits)
        looked_up = ahead.meter.summary()["round_trips_by_kind"].get("lookup", 0) - was
        assert looked_up == (0 if token in first.ids else 1)
        first = got
    ahead.truncate(len(prompt))  # stepped back: the rows read ahead are for a later position
    fetched.truncate(len(prompt))
    fetched.ahead = None
    got, want = ahead.read([first.ids[0]]), fetched.read([first.ids[0]])
    assert np.array_equal(got.logits, want.logits)


def test_a_long_candidate_list_brings_no_rows_along(make_store, tiny_model):
    """More candidates than AHEAD_MOST: their vectors would outweigh a round, so the next read fetches its rows."""
    from vecgpt.engine import AHEAD_MOST

    store = make_store("memory")
    push(store, tiny_model, "l2", progress=False)
    text = Engine(store, top_k=AHEAD_MOST + 1).open()
    cands = text.read(tokenizer.encode("To be"))
    assert len(cands.ids) == AHEAD_MOST + 1 and text.ahead is None
    text.meter.start_token()
    text.read([int(cands.ids[0])])
    assert text.meter.summary()["per_token"][-1]["round_trips_by_kind"]["lookup"] == 1


def test_a_text_is_a_context_manager_that_closes(make_store, tiny_model):
    store = make_store("memory")
    push(store, tiny_model, "l2", progress=False)
    with Engine(store).open() as text:
        text.read(tokenizer.encode("Hello"))
        assert text.name in store.collections()
    assert text.name not in store.collections()  # closing removed its keys


def test_key_rows_tag_each_key_with_its_layer_head_and_position(make_store, tiny_model):
    """One write's rows from reads of blocks and of single positions at several layers: each row's id, attributes,
    key and value are its entry's, in the entries' order."""
    store = make_store("memory")
    push(store, tiny_model, "l2", progress=False)
    text, rng = Engine(store).open(), np.random.default_rng(3)
    hp = tiny_model.hparams
    hd, width = hp.n_embd // hp.n_head, text.value_width()
    shapes = [(0, 0, 3), (1, 0, 3), (1, 3, 1), (2, 7, 2)]  # (layer, start, m)
    entries = [
        (layer, start, rng.standard_normal((m, hp.n_head, hd)), rng.standard_normal((m, hp.n_head, width)))
        for layer, start, m in shapes
    ]
    name, ids, vectors, attrs, values = text_keys.key_rows(text, entries)
    at = 0
    for layer, start, k, v in entries:
        for i in range(len(k)):
            for h in range(hp.n_head):
                assert ids[at] == text.key_ids(layer, h, start + i)
                assert (attrs["layer"][at], attrs["head"][at], attrs["position"][at]) == (layer, h, start + i)
                assert np.array_equal(vectors[at], k[i, h]) and np.array_equal(values[at], v[i, h])
                at += 1
    assert name == text.name and at == len(ids) == len(vectors) == len(values)
    text.close()


def test_a_text_whose_store_lost_a_key_says_to_start_again(make_store, tiny_model):
    """A key row gone from one head's filter (here: moved to another layer under the text): the layer's key search
    finds fewer keys for that head than for the others, and the read fails with what to do."""
    store = make_store("memory")
    push(store, tiny_model, "l2", progress=False)
    text = Engine(store).open()
    cands = text.read(tokenizer.encode("To be or not to be, that is"))
    row = np.array([text.key_ids(1, 0, 0)])
    vectors, payload = store.fetch(text.name, row, payload=True)
    moved = {"layer": np.array([99]), "head": np.array([0]), "position": np.array([0])}
    store.upsert(text.name, row, vectors, moved, payload)
    with pytest.raises(VecgptError, match="start the text again"):
        text.read([int(cands.ids[0])])
