"""The Llama family in layout four (vecgpt.llama_rounds.LlamaFourSession): each position's value projected by its
query heads' slices of o_proj when it is computed, one search a key head, in the key search's round. Every store
and metric against float64 numpy under the bound vecgpt.llama_tolerance derives in four's order; grouped-query
ratios 1, 2 and 4; q/k/v biases (Qwen2) and o_proj's bias (a Llama with attention_bias); attention policies; a text
resumed bit for bit; four rounds a layer. Layout three is refused for a rotary family, and "auto" picks four for it
behind a network."""

from __future__ import annotations

import numpy as np
import pytest
from llamas import PROMPT, SHAPE, SHAPES, agrees, engine_for, last_token_on_turbopuffer, models, write_checkpoints
from stepping import assert_alone_as_together

from vecgpt import families, llama_tolerance, tolerance, weights
from vecgpt.cli import main
from vecgpt.config import Config, auto_layout, settle_layout
from vecgpt.engine import Engine
from vecgpt.errors import VecgptError
from vecgpt.llama_rounds import LlamaFourSession
from vecgpt.loading import collection, plan, push
from vecgpt.policy import Policy
from vecgpt.reference_llama import LlamaReference, inv_freq, rotary
from vecgpt.reference_llama import generate as reference_greedy

O_BIAS = (*families.QKV, "self_attn.o_proj")  # a Llama config's attention_bias
FOUR = {**SHAPES, "biased": families.LlamaHParams(**SHAPE, n_kv_head=2, biases=O_BIAS)}
STEPS = 12


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return write_checkpoints(tmp_path_factory.mktemp("llama"), FOUR)


def four(make_store, backend, model, metric, **kw) -> Engine:
    return engine_for(make_store, backend, model, metric, "four", **kw)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_every_store_gives_numpys_tokens(make_store, backend, metric, checkpoints):
    m32, m64 = models(checkpoints, "llama")
    agrees(four(make_store, backend, m32, metric), m64, backend, metric, STEPS, kind=LlamaFourSession)


@pytest.mark.parametrize("name", ["qwen2", "mha", "biased"])
@pytest.mark.parametrize("backend_, metric", [("memory", "l2"), ("faiss", "ip")])
def test_biases_untied_and_every_head_ratio(make_store, checkpoints, name, backend_, metric):
    m32, m64 = models(checkpoints, name)
    engine = four(make_store, backend_, m32, metric)
    assert engine.hparams == FOUR[name] and engine.manifest["layout"] == "four"
    agrees(engine, m64, backend_, metric, STEPS, kind=LlamaFourSession)


def test_o_projs_slices_go_by_key_head_its_bias_with_query_head_0(make_store, checkpoints):
    """c_proj.<kv> holds the rows of o_proj of query heads kv group .. kv group + group - 1 side by side (group d
    documents of head_dim), and o_proj's bias only in query head 0's d documents."""
    m32, _ = models(checkpoints, "biased")
    hp, engine = FOUR["biased"], four(make_store, "memory", m32, "ip")
    o_proj = m32.block(0)["self_attn"]["o_proj"]
    d, hd = hp.n_embd, hp.head_dim
    for kv in range(hp.n_kv_head):
        docs = engine.store.fetch(collection(engine.key, f"h.0.attn.c_proj.{kv}"), np.arange(hp.group * d))
        assert docs.shape == (hp.group * d, hd + 1)
        for g in range(hp.group):
            h = kv * hp.group + g
            assert np.array_equal(docs[g * d : (g + 1) * d, :hd], o_proj["weight"][:, h * hd : (h + 1) * hd])
            assert np.array_equal(docs[g * d : (g + 1) * d, hd], o_proj["bias"] if h == 0 else np.zeros(d))
    names = [name for name, _, _ in plan(hp, "ip", "four")]
    assert [n for n in names if n.startswith("h.0.attn.c_proj")] == ["h.0.attn.c_proj.0", "h.0.attn.c_proj.1"]


POLICIES = {
    "top-k": Policy(top_k=3),
    "threshold": Policy(threshold=2.0),
    "sinks and window with top-k": Policy(top_k=2, sinks=1, window=3),
}


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
@pytest.mark.parametrize("backend_, metric", [("memory", "l2"), ("faiss", "ip")])
def test_attention_policies_agree_with_numpys_under_the_same_policy(make_store, checkpoints, policy, backend_, metric):
    m32, m64 = models(checkpoints, "llama")
    engine = four(make_store, backend_, m32, metric, **{f"attention_{k}": v for k, v in policy._asdict().items()})
    agrees(engine, m64, backend_, metric, STEPS, sure_least=0, kind=LlamaFourSession)


def test_a_text_keeps_projected_values_by_query_head_and_resumes_bit_for_bit(make_store, checkpoints):
    """A text row is a key head's rotated key and its group's projected values (group x d); a text keeps them by query
    head; a kept text read back in another engine has the same bits and reads on to the same candidates; a step back
    reads only the new positions, the same candidates."""
    m32, _ = models(checkpoints, "qwen2")
    hp, engine = FOUR["qwen2"], four(make_store, "memory", m32, "l2")
    with engine.open() as text:
        first = text.read(PROMPT)
        assert text.row_widths() == (hp.head_dim + 1, hp.group * hp.n_embd)
        assert text.projected.shape == (hp.n_layer, hp.n_head, hp.n_ctx, hp.n_embd)
        assert text.key_norms.shape == (hp.n_layer, hp.n_kv_head, hp.n_ctx)
        _, payload = engine.store.fetch(text.name, text.key_ids(1, np.arange(hp.n_kv_head), 2), payload=True)
        assert np.array_equal(payload.reshape(hp.n_head, -1), text.projected[1, :, 2])
        again = Engine(engine.store, model=engine.key).session(text.name, create=False)
        again.restore(list(PROMPT))
        assert np.array_equal(again.projected, text.projected) and np.array_equal(again.key_norms, text.key_norms)
        nxt = again.read([int(first.ids[0])])
        text.truncate(5)
        reread = text.read(PROMPT[5:])
        assert np.array_equal(reread.ids, first.ids) and np.array_equal(reread.logits, first.logits)
        later = text.read([int(first.ids[0])])
        assert np.array_equal(later.ids, nxt.ids) and np.array_equal(later.logits, nxt.logits)


def test_four_rounds_a_layer_and_a_projection_search_a_key_head(make_store, checkpoints, tiny_model):
    """On the local turbopuffer (one copy of a text's keys): a generated token takes 4 L + 1 rounds, its value
    projections L x n_kv_head searches (GPT-2's of as many heads in layout four: L x n_head), its key searches
    L x n_kv_head requests carrying L x n_head queries."""
    llama, gpt2 = (
        last_token_on_turbopuffer(make_store, m, "four", 3) for m in (models(checkpoints, "llama")[0], tiny_model)
    )
    hp = FOUR["llama"]
    assert llama["round_trips"] == 4 * hp.n_layer + 1
    assert llama["by_kind"]["matrix"] == (3 + hp.n_kv_head) * hp.n_layer  # c_attn, c_proj.<kv>, c_fc, mlp.c_proj
    assert gpt2["by_kind"]["matrix"] == (3 + tiny_model.hparams.n_head) * tiny_model.hparams.n_layer
    assert llama["by_kind"]["key_search"] == hp.n_layer * hp.n_kv_head
    assert llama["subqueries_by_kind"]["key_search"] == hp.n_layer * hp.n_head


def test_layout_three_is_refused_for_a_rotary_family_in_a_line(make_store, checkpoints, capsys):
    m32, _ = models(checkpoints, "llama")
    store = make_store("memory")
    for refused in (lambda: push(store, m32, "l2", progress=False, layout="three"), lambda: plan(m32, "l2", "three")):
        with pytest.raises(VecgptError, match="layout three scores keys from the layer's input") as e:
            refused()
        assert "\n" not in str(e.value) and "--layout four" in str(e.value)
    assert not store.collections()  # nothing written
    assert main(["load", "--dry-run", "--model", str(checkpoints["llama"]), "--layout", "three"]) == 2
    assert "--layout four" in capsys.readouterr().err


def test_auto_picks_four_for_a_rotary_family_behind_a_network(checkpoints):
    hp, gpt2 = FOUR["llama"], weights.HParams(n_layer=1, n_head=2, n_embd=8, n_ctx=4, n_vocab=10)
    assert auto_layout("turbopuffer", {}, rotary=True) == "four" and auto_layout("turbopuffer", {}) == "three"
    assert auto_layout("faiss", {}, rotary=True) == "five"
    assert settle_layout(Config(backend="turbopuffer"), hp) == "four"
    assert settle_layout(Config(backend="turbopuffer"), gpt2) == "three"
    assert settle_layout(Config(backend="pgvector", store={"dsn": "postgresql://db.example/x"}), hp) == "four"
    assert settle_layout(Config(backend="memory"), hp) == "five"
    assert settle_layout(Config(backend="turbopuffer", layout="three"), hp) == "three"  # named: push refuses it


def test_a_wrong_projection_document_is_caught(make_store, checkpoints):
    """One element of one stored row of layer 0's c_proj.1 (query head 2's slice of o_proj) off by 1e-3 of the
    collection's largest row norm M: the logits move by about 6 times four's derived tol (9.0e-4 against 1.4e-4; the
    float64 store's own error is 4e-6), and the rule says so."""
    m32, m64 = models(checkpoints, "llama")
    engine = four(make_store, "memory", m32, "l2")
    name = collection(engine.key, "h.0.attn.c_proj.1")
    row = np.array([5])
    doc = engine.store.fetch(name, row)
    doc[0, 0] += 1e-3 * np.sqrt(engine.m2["h.0.attn.c_proj.1"])
    engine.store.upsert(name, row, doc, {"row": row})
    with engine.open() as text:
        want = reference_greedy(LlamaReference(m64, np.float64), PROMPT, 4)
        r = llama_tolerance.forced_comparison(text, m64, PROMPT, want, "l2", tolerance.unit_roundoff("memory"))
    print(f"planted: max error {r['max_error'].max():.2e}, tol up to {r['tol'].max():.2e}")
    assert r["violations"] and r["max_error"].max() > 3 * r["tol"].max()


def test_a_rotary_score_from_the_layer_input_needs_a_document_hd_times_wider():
    """Layout three's algebra for a rotary block (docs/llama-engine.md): with k_j stored rotated, q_i . k_j =
    (x_i, 1) . [W_q | b_q]^T R_i^T k_j turns with the query's position i; over the hd/2 frequencies R_i^T k =
    sum_f cos(i theta_f) C_f k + sin(i theta_f) S_f k, so the only document free of i has hd (d + 1) floats."""
    rng, d, hd = np.random.default_rng(0), 12, 8
    wb, x1 = rng.normal(size=(hd, d + 1)), np.append(rng.normal(size=d), 1.0)  # [W_q | b_q], (x, 1)
    freq = inv_freq(hd, 1e4, {})
    k = rotary(rng.normal(size=(1, hd)), np.array([3.0]), freq)[0]  # a key of position 3, as stored
    pair = np.tile(np.eye(hd // 2), 2)  # [hd / 2, hd]: frequency f's two coordinates, f and f + hd / 2
    swapped = np.concatenate([k[hd // 2 :], -k[: hd // 2]])
    document = np.concatenate([(pair * k) @ wb, (pair * swapped) @ wb]).ravel()  # C_f k, S_f k through W^T
    plain = []
    for i in (4.0, 9.0, 40.0):
        q = rotary((wb @ x1)[None], np.array([i]), freq)[0]
        query = np.concatenate([np.outer(np.cos(i * freq), x1), np.outer(np.sin(i * freq), x1)]).ravel()
        assert document.size == query.size == hd * (d + 1) and abs(query @ document - q @ k) < 1e-12
        plain.append(wb.T @ rotary(k[None], np.array([-i]), freq)[0])  # [W_q | b_q]^T R_i^T k: q_i . k = x1 . it
        assert abs(x1 @ plain[-1] - q @ k) < 1e-12
    assert not np.allclose(plain[0], plain[1])  # GPT-2's document W_q^T k would serve every query: this one turns


def test_alone_and_stepped_together_agree_bit_for_bit(make_store, checkpoints):
    """Every logit of the vocabulary, for a text read alone and beside others of other lengths (prompts in chunks of
    4): a text's projected values, keys and scores never depend on the texts stepped with it."""
    m32, _ = models(checkpoints, "qwen2")
    engine = four(make_store, "faiss", m32, "ip", prefill_chunk=4)
    prompts, vocab = [PROMPT, [3, 9], [100, 200, 300, 400, 11]], FOUR["qwen2"].n_vocab
    assert_alone_as_together(engine, prompts, 4, vocab)
