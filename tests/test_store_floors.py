"""benchmarks/store_floors.py's measure on a tiny model: every form of FAISS and LanceDB timed, the record complete
(no timing is asserted: only that each time was taken)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def store_floors(monkeypatch):
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")  # the script pins these on import; the test's end restores them
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("store_floors")


def test_store_floors_times_every_form(store_floors, tiny_model, tmp_path):
    pytest.importorskip("faiss")
    pytest.importorskip("lancedb")
    result = json.loads(json.dumps(store_floors.measure(tiny_model, ["faiss", "lancedb"], threads=1, n=1)))
    hp = tiny_model.hparams
    assert result["scans_per_token"] == 4 * hp.n_layer + 1
    assert result["tiny_query"] == [hp.n_embd, hp.n_embd // hp.n_head + 2]
    assert result["machine"]["threads"] == 1 and result["numpy_reference_ms_token"] > 0
    rows = result["rows"]
    assert [r["library"] for r in rows] == ["numpy"] + ["faiss"] * 4 + ["lancedb"] * 3
    for r in rows:
        assert min(r["ms_token_scans"], r["ms_tiny_query"], r["x_numpy_token"], r["x_numpy_sgemv"]) > 0
        assert list(r["ms_by_matrix"]) == [*store_floors.PARTS, "wte"] and min(r["ms_by_matrix"].values()) > 0
    assert sum(r["best"] for r in rows) == 3  # one best form a library
    assert rows[0]["x_numpy_sgemv"] == 1.0
    printed = store_floors.table(result)
    assert all(r["form"][:48] in printed for r in rows)
    store_floors.plot(result, tmp_path / "floors.png")
    assert (tmp_path / "floors.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
