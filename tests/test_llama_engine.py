"""The Llama family through the engine in layout five (vecgpt.llama_rounds) on every store, against the float64
numpy reference (vecgpt.reference_llama) under the bound vecgpt.llama_tolerance derives; random checkpoints the
tests write: a Llama with grouped-query attention (4 query heads, 2 key heads, tied), a Qwen2 with q, k and v biases
(4 query heads sharing 1 key head, untied) and a Llama with a key head per query head (untied)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from llamas import PROMPT, SHAPE, SHAPES, STD, STEPS, engine_for, last_token_on_turbopuffer, models, write_checkpoints
from llamas import agrees as agrees_in

from vecgpt import families, llama_tolerance, tolerance, weights
from vecgpt.cli import main
from vecgpt.errors import VecgptError
from vecgpt.llama_rounds import LlamaSession
from vecgpt.policy import Policy
from vecgpt.reference_llama import LlamaReference
from vecgpt.reference_llama import generate as reference_greedy


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return write_checkpoints(tmp_path_factory.mktemp("llama"))


def agrees(engine, model64, backend, metric, steps=STEPS, sure_least=STEPS // 2) -> dict:
    return agrees_in(engine, model64, backend, metric, steps, sure_least, kind=LlamaSession)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_every_store_gives_numpys_tokens(make_store, backend, metric, checkpoints):
    m32, m64 = models(checkpoints, "llama")
    agrees(engine_for(make_store, backend, m32, metric), m64, backend, metric)


@pytest.mark.parametrize("name", ["qwen2", "mha"])
@pytest.mark.parametrize("backend_, metric", [("memory", "l2"), ("faiss", "ip"), ("faiss", "l2")])
def test_biases_untied_and_every_head_ratio(make_store, checkpoints, name, backend_, metric):
    m32, m64 = models(checkpoints, name)
    engine = engine_for(make_store, backend_, m32, metric)
    assert engine.manifest["family"] == SHAPES[name].family and engine.hparams == SHAPES[name]
    agrees(engine, m64, backend_, metric)


def test_the_float64_store_is_far_inside_the_bound(make_store, checkpoints):
    """On the float64 memory store the error seen is the float32 rounding of weights as sent and stored only: the
    derived bound (which takes every summation's worst order) stands well above it, and above 0."""
    m32, m64 = models(checkpoints, "llama")
    r = agrees(engine_for(make_store, "memory", m32, "l2"), m64, "memory", "l2")
    assert 0 < r["max_error"].max() < r["tol"].min()


POLICIES = {
    "top-k": Policy(top_k=3),
    "threshold": Policy(threshold=2.0),
    "sinks and window with top-k": Policy(top_k=2, sinks=1, window=3),
}


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
@pytest.mark.parametrize("backend_, metric", [("memory", "l2"), ("memory", "ip"), ("faiss", "l2"), ("faiss", "ip")])
def test_attention_policies_agree_with_numpys_under_the_same_policy(make_store, checkpoints, policy, backend_, metric):
    m32, m64 = models(checkpoints, "llama")
    engine = engine_for(make_store, backend_, m32, metric, **{f"attention_{k}": v for k, v in policy._asdict().items()})
    assert engine.policy == policy
    agrees(engine, m64, backend_, metric, sure_least=0)  # a threshold's tol is wide where a key sits at its edge
    full = reference_greedy(LlamaReference(m64, np.float64), PROMPT, STEPS)
    assert reference_greedy(LlamaReference(m64, np.float64, policy), PROMPT, STEPS) != full  # the policy matters


def test_a_key_head_serves_its_group_in_one_search(make_store, checkpoints, tiny_model):
    """On the local turbopuffer with one copy of a text's keys (a head's queries then go in one request to its
    namespace; with key_replicas 2 they are spread over the copies): a generated token's key searches are
    n_layer x n_kv_head requests carrying n_layer x n_head queries, GPT-2's of the same heads n_layer x n_head of
    each; a position writes n_kv_head keys a layer, not n_head; a layer is five rounds."""
    llama, gpt2 = (
        last_token_on_turbopuffer(make_store, m, "five", 4) for m in (models(checkpoints, "llama")[0], tiny_model)
    )
    hp = SHAPES["llama"]
    assert llama["by_kind"]["key_search"] == hp.n_layer * hp.n_kv_head == 4
    assert llama["subqueries_by_kind"]["key_search"] == hp.n_layer * hp.n_head == 8
    assert gpt2["by_kind"]["key_search"] == gpt2["subqueries_by_kind"]["key_search"] == hp.n_layer * hp.n_head
    assert llama["scores"] == gpt2["scores"]  # every query head still scores every earlier key
    assert llama["round_trips"] == 5 * hp.n_layer + 1  # the next token's row comes with the token search
    assert llama["by_kind"]["matrix"] == 4 * hp.n_layer


def test_a_text_keeps_key_heads_resumes_and_truncates(make_store, checkpoints):
    """A text row is a rotated key and its raw value, head_dim each; a text keeps n_kv_head heads; a kept text read
    back in another engine has the same bits; a step back reads only the new positions, the same candidates."""
    m32, _ = models(checkpoints, "qwen2")
    engine = engine_for(make_store, "memory", m32, "l2")
    hp = SHAPES["qwen2"]
    with engine.open() as text:
        first = text.read(PROMPT)
        assert text.row_widths() == (hp.head_dim + 1, hp.head_dim)
        assert text.key_norms.shape == (hp.n_layer, hp.n_kv_head, hp.n_ctx)
        again = engine.session(text.name, create=False)
        again.restore(list(PROMPT))
        assert np.array_equal(again.projected, text.projected) and np.array_equal(again.key_norms, text.key_norms)
        nxt = again.read([int(first.ids[0])])
        text.truncate(5)
        reread = text.read(PROMPT[5:])
        assert np.array_equal(reread.ids, first.ids) and np.array_equal(reread.logits, first.logits)
        assert np.array_equal(text.read([int(first.ids[0])]).logits, nxt.logits)


def test_unsupported_checkpoints_are_refused_in_a_line(tmp_path, checkpoints):
    config = json.loads((checkpoints["llama"] / "config.json").read_text())
    (tmp_path / "slide").mkdir()
    (tmp_path / "slide" / "config.json").write_text(
        json.dumps({**config, "model_type": "mistral", "sliding_window": 16})
    )
    with pytest.raises(VecgptError, match="sliding-window attention") as e:
        weights.load(str(tmp_path / "slide"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("backend_", ["faiss", "memory"])
def test_the_cli_generates_with_a_llama_folder(capsys, tmp_path, backend_):
    """`vecgpt generate --model <folder> "ROMEO:"`: a Llama of GPT-2's 50,257 tokens (no tokenizer.json: GPT-2's),
    loaded on first use in the store's default layout (five in process), numpy's greedy tokens."""
    hp = families.LlamaHParams(**{**SHAPE, "n_vocab": 50257}, n_kv_head=2, tied=True)
    folder = weights.make_llama_model(tmp_path / "m", hp, seed=4, std=STD)
    store = ["--backend", backend_, "--store", str(tmp_path / backend_), "--model", str(folder)]
    assert main(["generate", *store, "ROMEO:", "-n", "6", "--json", "--yes", "--temperature", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    m64 = weights.load(str(folder), dtype=np.float64)
    want = reference_greedy(LlamaReference(m64, np.float64), out["prompt_tokens"], 6)
    u = tolerance.unit_roundoff(backend_)
    tol = llama_tolerance.logit_tolerance(m64, out["prompt_tokens"], want, "l2" if backend_ == "memory" else "ip", u)
    sure = tolerance.sure_greedy_steps(llama_tolerance.forced_logits(m64, out["prompt_tokens"], want), tol)
    assert sure >= 3 and out["tokens"][:sure] == want[:sure]
