"""experiments/08_topk_attention: the quick run's figures, and its forward pass against vecgpt.reference's top-K."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parents[1] / "experiments" / "08_topk_attention"
pytest.importorskip("hnswlib")


@pytest.fixture(scope="module")
def experiment():
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    import run

    yield run
    del sys.path[:2]


@pytest.fixture(scope="module")
def quick(experiment, tmp_path_factory):
    out = tmp_path_factory.mktemp("topk")
    assert experiment.main(["--quick", "--quiet", "--out", str(out)]) == 0
    return json.loads((out / "topk_attention.json").read_text()), out


def rows(result, search="exact"):
    return [r for r in result["rows"] if r["search"] == search]


def test_all_keys_is_full_attention(quick):
    result, _ = quick
    every = [r for r in rows(result) if r["k"] == "all"]
    assert len(every) == 1
    assert every[0]["agreement"] == 1.0
    assert abs(every[0]["kl_mean"]) <= 1e-12  # the same scores, so the same logits: KL 0 up to log rounding
    assert every[0]["mass_mean"] == pytest.approx(1.0, abs=1e-12)


def test_mass_grows_with_k(quick):
    result, _ = quick
    for context in result["settings"]["contexts"]:
        mass = np.asarray(result["mass"][str(context)])  # [K, L, H], K ascending
        assert mass.shape == (len(result["ks_run"][str(context)]), 4, 4)
        assert np.all(np.diff(mass, axis=0) >= -1e-12)
        assert np.all((mass > 0) & (mass <= 1 + 1e-12))


def test_json_fields(quick):
    result, out = quick
    assert result["settings"]["ks"] == [1, "all"] and result["settings"]["teacher_forced"]
    for key in ("provenance", "model", "rows", "mass", "full_accuracy", "smallest_k", "smallest_k_hnsw"):
        assert key in result
    assert result["smallest_k"]["24"] in (1, "all")
    for r in rows(result):
        for key in ("context", "k", "steps", "agreement", "disagreements", "kl_mean", "mass_mean", "per_token"):
            assert key in r
        assert r["steps"] == 8
        assert set(r["per_token"]) == {"keys_scored", "keys_returned", "values_read", "bytes_returned", "value_bytes"}
    one = next(r for r in rows(result) if r["k"] == 1)  # 4 layers x 4 heads, 23 earlier keys each
    assert one["per_token"] == {
        "keys_scored": 16 * 23,
        "keys_returned": 16,
        "values_read": 32,
        "bytes_returned": 16 * 12,
        "value_bytes": 32 * 32 * 4,
    }
    ref = result["refined"]["24"]  # bisected between K 1 (below 99%) and all: hi reaches it, lo does not
    assert ref["sweep"] == [1, 23] and 1 <= ref["lo"] < ref["hi"] <= 23
    probe = {p["k"]: p["agreement"] for p in ref["probes"]}
    assert probe.get(ref["hi"], 1.0) >= 0.99 and probe.get(ref["lo"], 0.0) < 0.99
    (approx,) = rows(result, "hnsw")
    assert 0 <= approx["recall"] <= 1 and 0 <= approx["agreement"] <= 1
    assert (out / "topk_attention.md").read_text().startswith("model: ")


def test_forward_is_the_references_top_k(experiment):
    """The experiment's batched forward keeps vecgpt.reference's set: the same logits (float64, to 1e-9)."""
    import sparse_forward

    from vecgpt import tokenizer, weights
    from vecgpt.reference import Reference

    model = weights.load(None, dtype=np.float64)
    ids = np.asarray(tokenizer.encode("ROMEO:\nBut soft, what light through yonder window breaks?"))[:12]
    windows = np.stack([ids[:10], ids[2:12]])
    for k in (1, 3):
        got = sparse_forward.forward(model.params, model.hparams, windows, sparse_forward.exact_top_k(k))
        for window, logits in zip(windows, got):
            want = Reference(model, np.float64, attention_top_k=k).logits(window)[-1]
            np.testing.assert_allclose(logits, want, rtol=0, atol=1e-9)
