"""Top-k attention (attention_top_k = K) in every layout: each head's key search returns a query's K best earlier
keys by q.k, the softmax runs over them and the query's own key. K reaching every earlier key is today's attention
bit for bit; a smaller K keeps exactly numpy's top K and its logits keep the tolerance rule; the counts follow K.
Every store, the threshold, sinks and a window: tests/test_attention_policy.py."""

from __future__ import annotations

import numpy as np
import pytest

from vecgpt import reference, tokenizer, tolerance
from vecgpt.config import load_config
from vecgpt.engine import Engine, Read
from vecgpt.errors import VecgptError
from vecgpt.loading import push, store_fingerprint
from vecgpt.policy import Policy
from vecgpt.stepper import Stepper

from conftest import BACKENDS

LAYOUTS = ("four", "three", "five")
PROMPT = "To be or not to be, that is the question: whether 'tis nobler"


def engine_on(make_store, backend, model, layout, top_k=None) -> Engine:
    store = make_store.loaded(backend, model, "ip", layout)
    return Engine(store, model=store_fingerprint(model, "ip", layout), attention_top_k=top_k, prefill_chunk=8)


def logits_of(engine: Engine, ids: list[int], n: int, k: int = 40) -> list[np.ndarray]:
    """A prompt read in chunks, then n greedy tokens; every read's candidates' logits."""
    with engine.open() as text:
        out = [text.read(ids, k)]
        for _ in range(n):
            out.append(text.read([int(out[-1].ids[0])], k))
    return out


EVERY = [
    (b, layout) for b in BACKENDS if b in ("memory", "faiss") for layout in LAYOUTS
]  # every store: test_attention_policy


@pytest.mark.parametrize("backend, layout", EVERY)
def test_k_reaching_every_earlier_key_is_todays_attention_bit_for_bit(make_store, tiny_model, backend, layout):
    """With K at least every earlier key of each read (the text ends at position 20: K = 19), every store (memory and
    FAISS in every layout) computes what it computes without K, to the last bit; a store that cannot rank by q.k
    refuses K in one line."""
    ids = tokenizer.encode(PROMPT)[:16]
    try:
        every = logits_of(engine_on(make_store, backend, tiny_model, layout), ids, 4)
    except VecgptError as e:
        assert "cannot rank by 'ip'" in str(e) and "\n" not in str(e)
        return
    top = logits_of(engine_on(make_store, backend, tiny_model, layout, top_k=19), ids, 4)
    for a, b in zip(every, top, strict=True):
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.logits, b.logits)


def shortlist(model64, ids: list[int], k: int) -> float:
    """The smallest gap, over every layer, head and position of a read of ids, between a query's K-th and K+1-th
    best earlier q.k in float64 numpy: the test's K best are a fact only where it is far above any rounding."""
    hp, gaps = model64.hparams, []
    x = model64.params["wte"]["weight"][ids] + model64.params["wpe"]["weight"][: len(ids)]
    for block in model64.params["h"]:
        h = reference.layer_norm(x, **block["ln_1"], eps=hp.eps)
        q, key, _ = np.split(reference.linear(h, **block["attn"]["c_attn"]), 3, axis=-1)
        for qh, kh in zip(np.split(q, hp.n_head, -1), np.split(key, hp.n_head, -1)):
            s = qh @ kh.T
            for i in range(k + 1, len(ids)):
                best = np.sort(s[i, :i])[::-1]
                gaps.append(best[k - 1] - best[k])
        cache = {"k": np.zeros((0, hp.n_embd)), "v": np.zeros((0, hp.n_embd))}
        x = reference.transformer_block(x, **block, n_head=hp.n_head, eps=hp.eps, cache=cache, policy=Policy(top_k=k))
    return float(min(gaps))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", ["memory", "faiss", "duckdb"])
def test_a_smaller_k_keeps_numpys_top_k_within_the_tolerance_rule(make_store, tiny_model, model64, backend, layout):
    """K = 3 of up to 19 earlier keys: every store logit within the derived tolerance of float64 numpy's top-k
    attention (reference.keep_top_k), fed the same tokens; the inspected weights are non-zero at exactly each query's
    own key and its 3 best earlier keys by the store's q.k."""
    k, ids = 3, tokenizer.encode(PROMPT)[:20]
    assert shortlist(model64, ids, k) > 1e-6  # no near-tie at the K-th key: which 3 are best is not a rounding matter
    engine = engine_on(make_store, backend, tiny_model, layout, top_k=k)
    with engine.open() as text:
        u = tolerance.unit_roundoff(backend)
        out = tolerance.forced_comparison(text, model64, ids[:12], ids[12:], "ip", u)
        assert not out["violations"], out["violations"][:3]
        assert (out["max_error"] <= out["tol"]).all()
        seen = text.inspect(len(ids) - 2, ids[-2])
    earlier = seen.scores[..., :-1]  # [L, H, n - 1]
    best = np.argsort(-earlier, axis=-1)[..., :k]
    want = np.zeros(seen.weights.shape, bool)
    np.put_along_axis(want[..., :-1], best, True, axis=-1)
    want[..., -1] = True
    assert np.array_equal(seen.weights > 0, want)


def test_smaller_k_moves_the_logits_and_full_numpy_is_far(make_store, tiny_model, model64):
    """K = 1 is not full attention: the store's logits are numpy top-k's, far from full attention's (else the
    tests above would pass for an engine that ignored K)."""
    ids = tokenizer.encode(PROMPT)[:20]
    (got,) = logits_of(engine_on(make_store, "memory", tiny_model, "five", top_k=1), ids, 0)
    top1 = reference.Reference(model64, np.float64, attention_top_k=1).logits(ids)[-1]
    full = reference.Reference(model64, np.float64).logits(ids)[-1]
    assert np.abs(got.logits - top1[got.ids]).max() < 1e-6
    assert np.abs(top1 - full).max() > 1e-3


@pytest.mark.parametrize("layout", LAYOUTS)
def test_counts_follow_k(make_store, tiny_model, layout):
    """A generated token at position p: the store scores p earlier keys a head and layer, returns K of them, and
    attention reads K + 1 values (its own); each query of a prompt block searches for its own K best."""
    hp, k, ids = tiny_model.hparams, 4, tokenizer.encode(PROMPT)[:10]
    per = hp.n_layer * hp.n_head
    engine = engine_on(make_store, "memory", tiny_model, layout, top_k=k)
    with engine.open() as text:
        engine.chunk_size = len(ids)
        text.read(ids)
        text.meter.start_token()
        text.read([ids[0]])
        prompt, token = text.meter.tokens[-2]["scores"], text.meter.tokens[-1]["scores"]
    m, p = len(ids), len(ids)
    assert token == {"store": per * p, "memory": per, "returned": per * k, "values": per * (k + 1)}
    earlier = np.arange(m)  # query i has i earlier keys; it keeps min(i, K)
    assert prompt["store"] == per * earlier.sum() and prompt["memory"] == per * m
    assert prompt["returned"] == per * np.minimum(earlier, k).sum()  # each query of the block its own K best
    assert prompt["values"] == per * (np.minimum(earlier, k).sum() + m)


def test_texts_of_different_k_step_together_as_alone(make_store, tiny_model):
    """A full-attention text and top-k texts in one step: each computes what it computes alone, bit for bit."""
    ids = tokenizer.encode(PROMPT)[:12]
    engine = engine_on(make_store, "memory", tiny_model, "four")
    alone = {}
    for k in (None, 1, 5):
        with engine.open() as text:
            text.attention_top_k = k
            alone[k] = text.read(ids).logits
    texts = {k: engine.open() for k in (None, 1, 5)}
    for k, text in texts.items():
        text.attention_top_k = k
    stepper = Stepper()
    jobs = {k: stepper.add(one_read(text, ids)) for k, text in texts.items()}
    stepper.run()
    assert max(stepper.steps) == 3  # the three texts shared their steps
    for k, job in jobs.items():
        assert job.error is None and np.array_equal(job.result.logits, alone[k])
        texts[k].close()


def one_read(session, ids):
    out = yield Read(session, ids, 40, session.position)
    return out


def test_bad_k_is_one_line_before_any_search(make_store, tiny_model):
    with pytest.raises(VecgptError, match="1 or more"):
        load_config(None, backend="faiss", attention_top_k=0)
    with pytest.raises(VecgptError, match="at most 63 earlier keys"):
        engine_on(make_store, "memory", tiny_model, "five", top_k=64)


def test_an_hnsw_index_of_keys_finds_most_of_the_k_best(make_store, tiny_model):
    """attention_index = "hnsw" (FAISS): each head's K keys come from an HNSW graph of the text's keys; a decode step
    still returns K a head and layer, the store's count is the distances the graph computed, and the kept keys of
    layer 0 (whose keys and queries full attention shares) are mostly its exact K best (an approximate search
    promises no more)."""
    hp, k, ids = tiny_model.hparams, 4, list(range(1000, 1480, 10))
    store = make_store("faiss")
    push(store, tiny_model, "ip", progress=False, layout="five")
    key = store_fingerprint(tiny_model, "ip", "five")
    approximate = Engine(store, model=key, attention_top_k=k, attention_index="hnsw")
    exact = Engine(store, model=key)
    with approximate.open() as text, exact.open() as full:
        text.read(ids[:-1]), full.read(ids[:-1])
        text.meter.start_token()
        text.read(ids[-1:])
        seen, every = text.inspect(len(ids) - 1, ids[-1]), full.inspect(len(ids) - 1, ids[-1])
    tally = text.meter.tokens[-1]["scores"]
    assert tally["returned"] == hp.n_layer * hp.n_head * k and tally["values"] == hp.n_layer * hp.n_head * (k + 1)
    assert 0 < tally["store"]
    best = np.argsort(-every.scores[0, :, :-1], axis=-1)[:, :k]  # layer 0's [H, K]: its keys are every run's
    found = np.take_along_axis(seen.weights[0, :, :-1] > 0, best, axis=-1)
    assert (seen.weights[..., :-1] > 0).sum(axis=-1).max() <= k
    assert found.mean() >= 0.75, found.mean()


def test_an_index_on_a_store_without_one_is_refused(make_store, tiny_model):
    store = make_store("memory")
    push(store, tiny_model, "ip", progress=False, layout="five")
    with pytest.raises(VecgptError, match="no such index of keys"):
        Engine(store, model=store_fingerprint(tiny_model, "ip", "five"), attention_top_k=4, attention_index="hnsw")
    with pytest.raises(VecgptError, match="set attention_top_k too"):
        load_config(None, backend="faiss", attention_index="hnsw")
