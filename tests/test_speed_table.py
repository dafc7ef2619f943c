"""benchmarks/speed_table.py end to end on the shipped model: the JSON, the README table and the plot appear."""

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
    cmd += ["--stores", "memory", "faiss", "-n", "1", "--threads", "1", "--layout", "five", "--out", str(tmp_path)]
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "speed.json").read_text())
    assert [r["store"] for r in result["rows"]] == ["numpy reference (float32)", "memory (l2)", "faiss (l2)"]
    assert result["machine"]["threads"] == 1 and result["machine"]["cores"] >= 1 and result["machine"]["commit"]
    for row in result["rows"][1:]:
        assert (
            row["layout"] == "five"
            and row["load_s"] > 0
            and row["stored_documents"] > 0
            and row["round_trips_per_token"] > 0
        )
    table = (tmp_path / "speed.md").read_text()
    assert "| store | layout | ms/token | × numpy |" in table and "| faiss (l2) | five |" in table
    assert table in run.stdout
    assert (tmp_path / "speed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
