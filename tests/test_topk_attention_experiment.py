"""experiments/08_topk_attention: the quick run's figures, and its forward pass against vecgpt.reference's policies."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from vecgpt.policy import Policy

HERE = Path(__file__).resolve().parents[1] / "experiments" / "08_topk_attention"
REPO = HERE.parents[1]
pytest.importorskip("hnswlib")


@pytest.fixture(scope="module")
def experiment():
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    import run

    yield run
    del sys.path[:2]


@pytest.fixture(scope="module")
def quick(experiment, tmp_path_factory):
    out, stores = tmp_path_factory.mktemp("topk"), tmp_path_factory.mktemp("stores")
    argv = ["--quick", "--quiet", "--out", str(out), "--configs", str(REPO / "configs" / "memory.toml")]
    argv += ["--store-contexts", "16", "--store-tokens", "3", "--store-root", str(stores)]
    assert experiment.main(argv) == 0
    return json.loads((out / "topk_attention.json").read_text()), out


def rows(result, family=None, search="exact"):
    return [r for r in result["rows"] if r["search"] == search and family in (None, r["family"])]


def test_every_key_is_full_attention(quick):
    result, _ = quick
    every = [r for r in rows(result, "top-k") if r["value"] == 23]  # K = the longest context's earlier keys
    assert [r["context"] for r in every] == [16, 24]
    for r in every:
        assert r["agreement"] == 1.0 and r["disagreements"] == 0
        assert abs(r["kl_mean"]) <= 1e-12  # the same scores, so the same logits: KL 0 up to log rounding
        assert r["mass_mean"] == pytest.approx(1.0, abs=1e-12)
        assert r["per_token"]["keys_returned"] == r["per_token"]["keys_scored"]  # every earlier key


def test_a_tiny_k_disagrees(quick):
    result, _ = quick
    one = [r for r in rows(result, "top-k") if r["value"] == 1]
    assert min(r["agreement"] for r in one) < 1.0
    assert all(r["per_token"]["keys_returned"] == 16 and r["per_token"]["values_read"] == 32 for r in one)
    assert all(0 < r["mass_mean"] < 1 for r in one)


def test_threshold_bound(quick):
    """The worst-case dropped weight is n e^-beta / (1 + n e^-beta) for the most keys a query dropped, and no
    query's dropped keys held more weight than their count bounds (under full attention)."""
    result, _ = quick
    thresholds = rows(result, "threshold")
    assert {r["value"] for r in thresholds} >= {0.5, 4.0}
    for r in thresholds:
        n, beta = r["dropped_max"], r["value"]
        assert 0 < n < r["context"]
        assert r["dropped_bound"] == pytest.approx(n * math.exp(-beta) / (1 + n * math.exp(-beta)), rel=1e-12)
        assert r["dropped_weight_over_bound"] <= 1e-12
    lo, hi = (next(r for r in thresholds if r["value"] == b and r["context"] == 24) for b in (0.5, 4.0))
    assert lo["per_token"]["keys_returned"] < hi["per_token"]["keys_returned"] and lo["mass_mean"] < hi["mass_mean"]


def test_json_fields(quick):
    result, out = quick
    s = result["settings"]
    assert s["contexts"] == [16, 24] and s["span"] == 4 and s["teacher_forced"]
    assert {r["family"] for r in rows(result)} == {"top-k", "threshold", "sinks+window", "sinks+window+top-k"}
    for r in rows(result):
        assert r["steps"] == 3 * 4 and r["kl_steps"] == 3
        assert set(r["per_token"]) == {"keys_returned", "values_read", "keys_scored", "keys_returned_union"}
        assert r["per_token"]["keys_returned_union"] == r["per_token"]["keys_returned"]  # a key head a query head
        assert len(r["kept_per_head"]) == 16
    window = next(r for r in rows(result, "sinks+window") if r["value"] == 2 and r["context"] == 16)
    assert window["per_token"]["keys_returned"] == 16 * (4 + 2)  # S 4 and W 2 of 11-15 earlier keys
    for c in ("16", "24"):
        for best in result["fewest"][c].values():
            assert best["agreement"] >= 0.99
        if result["answer"][c]:
            assert result["answer"][c]["keys_returned"] <= result["answer"][c]["every_key"]
    probes = [r for r in rows(result) if r["probe"]]
    assert probes and all(r["steps"] == 12 for r in probes)
    (approx, _) = rows(result, search="hnsw")[:2]
    assert 0 <= approx["recall"] <= 1 and 0 <= approx["agreement"] <= 1
    assert (out / "topk_attention.md").read_text().startswith("model: ")


def test_stores(quick):
    """The memory store under each policy: the engine's tokens are numpy's, its counts the policy's."""
    result, _ = quick
    got = {r["policy_label"]: r for r in result["stores"]}
    assert "full" in got and not result["stores_skipped"]
    assert all(r["same_tokens_as_numpy"] for r in got.values())
    assert got["full"]["meter"]["returned"] == 16 * 14.5  # the reads of positions 14 and 15: 14.5 earlier keys
    for r in got.values():
        k = r["policy"]["top_k"]
        if k is not None and r["policy"]["sinks"] is None:
            assert r["meter"]["returned"] == 16 * k and r["meter"]["values"] == 16 * (k + 1)


@pytest.mark.parametrize(
    "policy",
    [
        Policy(top_k=1),
        Policy(top_k=3),
        Policy(threshold=0.5),
        Policy(threshold=2.0),
        Policy(sinks=2, window=3),
        Policy(top_k=2, sinks=1, window=4),
    ],
)
def test_forward_is_the_references_policy(experiment, policy):
    """The experiment's batched forward keeps reference.keep's sets: the same logits at every position read."""
    import sparse_forward

    from vecgpt import tokenizer, weights
    from vecgpt.reference import Reference

    model = weights.load(None, dtype=np.float64)
    text = "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun."
    ids = np.asarray(tokenizer.encode(text))[:24]
    windows, positions = np.stack([ids[:20], ids[4:24]]), [9, 14, 19]
    keep = sparse_forward.policy_keep(policy)
    got = (
        sparse_forward.hidden_at(model.params, model.hparams, windows, positions, keep)
        @ model.params["wte"]["weight"].T
    )
    for window, logits in zip(windows, got):
        want = Reference(model, np.float64, policy=policy).logits(window)[positions]
        np.testing.assert_allclose(logits, want, rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    "policy", [None, Policy(top_k=1), Policy(top_k=3), Policy(threshold=1.0), Policy(top_k=2, sinks=1, window=4)]
)
def test_the_llama_forward_is_the_references_policy(experiment, policy):
    """sparse_llama's batched forward (rotary, grouped-query attention) keeps LlamaReference(policy=...)'s sets."""
    import sparse_forward
    import sparse_llama

    from vecgpt import tokenizer, weights
    from vecgpt.reference_llama import LlamaReference

    model = weights.load("shakespeare-llama", dtype=np.float64)
    ids = np.asarray(tokenizer.encode("ROMEO:\nBut soft, what light through yonder window breaks? It is the east."))
    windows, positions = np.stack([ids[:16], ids[3:19]]), [5, 11, 15]
    keep = None if policy is None else sparse_forward.policy_keep(policy)
    h = sparse_llama.hidden_at(model.params, model.hparams, windows, positions, keep)
    got = h @ model.params["model"]["embed_tokens"]["weight"].T
    for window, logits in zip(windows, got):
        want = LlamaReference(model, np.float64, policy=policy).logits(window)[positions]
        np.testing.assert_allclose(logits, want, rtol=0, atol=1e-9)


@pytest.fixture(scope="module")
def compared(experiment, tmp_path_factory):
    out, stores = tmp_path_factory.mktemp("compare"), tmp_path_factory.mktemp("compare-stores")
    argv = ["--models", "shakespeare", "shakespeare-llama", "--quick", "--quiet", "--out", str(out)]
    argv += ["--configs", str(REPO / "configs" / "memory.toml"), "--store-contexts", "24", "--store-tokens", "3"]
    assert experiment.main([*argv, "--store-root", str(stores)]) == 0
    for suffix in (".json", ".md", ".png"):
        assert (out / f"topk_compare{suffix}").stat().st_size > 0
    return json.loads((out / "topk_compare.json").read_text())


def test_the_models_compared_on_the_same_steps(compared):
    gpt2, llama = compared["models"]
    assert (gpt2["name"], gpt2["llama"], llama["name"], llama["llama"]) == (
        "shakespeare",
        False,
        "shakespeare-llama",
        True,
    )
    assert gpt2["query_heads"] == llama["query_heads"] == 16 and llama["key_heads"] == 8
    for m in compared["models"]:
        assert {r["family"] for r in m["rows"]} == {"top-k", "threshold"}
        every = [r for r in m["rows"] if r["family"] == "top-k" and r["value"] == 23]
        assert all(r["agreement"] == 1.0 for r in every)  # every earlier key: full attention itself
        assert all(r["same_tokens_as_numpy"] for r in m["stores"]) and not m["stores_skipped"]
    for per in compared["comparison"].values():
        for name, row in per.items():
            for family in ("top-k", "threshold"):
                p = row[family]
                if p is None:
                    continue
                group = 2 if name == "shakespeare-llama" else 1
                # a key head's group keeps at least what one of its query heads keeps, at most all of theirs
                assert p["keys_a_query_head"] - 1e-9 <= p["keys_a_key_head_group"]
                assert p["keys_a_key_head_group"] <= group * p["keys_a_query_head"] + 1e-9
                assert group == 2 or p["keys_a_key_head_group"] == pytest.approx(p["keys_a_query_head"])


def test_sink_weights(compared):
    for m in compared["models"]:
        for c, k in m["sinks"].items():
            w, zero = np.array(k["weight"]), np.array(k["weight_position_0"])
            assert w.shape == (4, 4) and np.all(zero <= w + 1e-12) and np.all((0 <= w) & (w <= 1))
            positions = np.arange(int(c) - 4, int(c))  # the quick run's span of 4
            assert k["uniform"] == pytest.approx(np.mean(4 / (positions + 1)))
            assert k["mean"] == pytest.approx(w.mean()) and k["heads_over_10x"] == int((w > 10 * k["uniform"]).sum())
