"""benchmarks/speed_table.py end to end on the shipped model: the JSON, the README table and the plot appear."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_speed_table_writes_json_markdown_and_plot(tmp_path):
    pytest.importorskip("faiss")
    pytest.importorskip("matplotlib")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "speed_table.py"),
        "--model",
        str(ROOT / "vecgpt" / "models" / "shakespeare"),
    ]
    cmd += [
        "--stores",
        "memory",
        "faiss",
        "-n",
        "1",
        "--threads",
        "1",
        "--layout",
        "four",
        "five",
        "--settle",  # no wait for a quiet machine: under load it waited 20 s a row, beside a 120 s limit
        "0",
        "--out",
        str(tmp_path),
    ]
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "speed.json").read_text())
    stores = [(r["store"], r.get("layout")) for r in result["rows"]]
    hf = [("transformers (torch, KV cache)", None)] if importlib.util.find_spec("transformers") else []
    assert stores == [("numpy reference (float32)", None), *hf] + [
        (s, layout) for s in ("memory (l2)", "faiss (ip)") for layout in ("four", "five")
    ]  # each config's encoding: FAISS's fastest, inner products
    assert result["machine"]["threads"] == 1 and result["machine"]["cores"] >= 1 and result["machine"]["commit"]
    for row in result["rows"][1 + len(hf) :]:
        assert row["load_s"] > 0 and row["stored_documents"] > 0 and row["round_trips_per_token"] > 0
        assert row["ratio"] == pytest.approx(row["per_token_s"] / row["numpy_per_token_s"])  # numpy timed beside it
    numpy_row = result["rows"][0]
    assert len(numpy_row["numpy_runs"]) == 4 and min(numpy_row["numpy_runs"]) <= numpy_row["per_token_s"]
    table = (tmp_path / "speed.md").read_text()
    assert "| store | layout | ms/token | × numpy | × transformers |" in table and "| faiss (ip) | five |" in table
    four, five = (r for r in result["rows"] if r["store"] == "faiss (ip)")
    assert five["requests_per_token"] < four["requests_per_token"]  # one c_proj search a layer, not one per head
    assert table in run.stdout
    assert (tmp_path / "speed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    readme = (tmp_path / "readme.md").read_text()  # README's table: a row a store and layout, numpy's first
    assert "| × numpy | × transformers | round trips a token |" in readme
    assert len(readme.splitlines()) == 4 + len(stores)
