"""Fault injection: a load killed with SIGKILL, a store stopped mid-text, two generations at once, a damaged folder.

Each test drives the real CLI in subprocesses (this worktree's code, via PYTHONPATH) against real stores:
the shared pgvector and local turbopuffer test servers, or a dedicated one where the test stops it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import LIBRARIES, store_options, tiny_params

from vecgpt import api, encoding, weights
from vecgpt.backends.base import get_store, worst_case_s
from vecgpt.config import load_config
from vecgpt.engine import Engine, get, ln_table, matrices
from vecgpt.errors import VecgptError

pytestmark = pytest.mark.fault

ROOT = Path(__file__).resolve().parents[1]
LONG = weights.HParams(n_layer=4, n_head=4, n_embd=64, n_ctx=256, n_vocab=50257)  # a text that takes a moment
PROMPT = "Hello world"  # numpy's top-2 gaps on the tiny model: >= 0.048 for 3 steps


def needs(backend: str) -> None:
    lib = LIBRARIES.get(backend)
    if lib:
        pytest.importorskip(lib)


@pytest.fixture(scope="module")
def long_model(tmp_path_factory) -> Path:
    return weights.save(tmp_path_factory.mktemp("long"), LONG, tiny_params(LONG))


def write_config(path: Path, backend: str, store: dict) -> Path:
    lines = [f"backend = {json.dumps(backend)}", 'metric = "l2"', "[store]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in store.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def env() -> dict:  # read at each start: a store's test setup may have set TURBOPUFFER_API_KEY
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def cli(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vecgpt.cli", *argv], env=env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def assert_one_line_error(rc: int, err: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and lines and lines[-1].startswith("vecgpt: error: "), err
    assert "Traceback" not in err, err


def expected_rows(model: weights.Model) -> dict[str, np.ndarray]:
    """Every collection a load of `model` writes ("l2"), as float32 rows."""
    out = {}
    for name in matrices(model.hparams):
        p = get(model.params, name)
        out[name] = encoding.encode_rows(p["weight"].T if name == "wte" else p["weight"], p.get("bias"), "l2")[0]
    out["wpe"], out["ln"] = model.params["wpe"]["weight"], ln_table(model)
    return {name: np.asarray(rows, np.float32) for name, rows in out.items()}


def assert_holds_exactly(store, model: weights.Model) -> None:
    """The store holds the model's full encoding, row for row, and not a row more."""
    assert sorted(n for n in store.collections() if not n.startswith("text-")) == sorted(expected_rows(model))
    for name, rows in expected_rows(model).items():
        assert store.count(name) == len(rows), name
        np.testing.assert_array_equal(store.fetch(name, np.arange(len(rows))), rows, err_msg=name)


def assert_greedy_matches_numpy(config, model_dir: Path, n: int = 3) -> list[int]:
    """Greedy tokens through the store equal numpy's, at steps where numpy's top-2 gap is far above any store error."""
    ref = api.generate_reference(PROMPT, n=n, model=str(model_dir), stop=False)
    gaps = [s["candidates"][0][1] - s["candidates"][1][1] for s in ref["steps"]]
    assert min(gaps) > 1e-2, f"precondition: numpy's top-2 gaps {gaps} must exceed 1e-2 (a float32 store errs ~1e-5)"
    out = api.generate_text(PROMPT, n=n, config=config, model=str(model_dir), stop=False)
    assert out["tokens"] == ref["tokens"]
    return out["tokens"]


def wait_for(condition, timeout: float, step: float = 0.002) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return False


# 1. kill -9 during a load ------------------------------------------------------------------------------------
def store_config(backend: str, tmp_path: Path, **extra) -> tuple[Path, dict]:
    needs(backend)
    options = {**store_options(backend, tmp_path), **extra}
    return write_config(tmp_path / f"{backend}.toml", backend, options), options


def kill_midway(load: tuple, store, tries: int = 3) -> int:
    """Start the load, SIGKILL it once it has written a collection; again if it finished first. The try that landed."""
    for attempt in range(1, tries + 1):
        proc = cli(*load)
        wait_for(lambda: proc.poll() is not None or store.collections(), timeout=120, step=0.005)
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode in (0, -signal.SIGKILL), err
        if proc.returncode == -signal.SIGKILL and store.read_manifest() is None:
            return attempt
        subprocess.run([sys.executable, "-m", "vecgpt.cli", "drop", *load[1:3]], env=env(), cwd=ROOT, check=True,
                       capture_output=True)
    pytest.fail(f"the load finished before the kill in {tries} tries")


@pytest.mark.parametrize("backend", ["memory", "faiss", "lancedb", "pgvector", "turbopuffer"])
def test_a_load_killed_midway_serves_no_model_and_the_same_load_then_completes(backend, tmp_path, tiny_model_dir):
    path, options = store_config(backend, tmp_path)
    load = ("load", "--config", str(path), "--model", str(tiny_model_dir))
    observer = get_store(backend, **options)
    kill_midway(load, observer)
    with pytest.raises(VecgptError, match="holds no model"):
        Engine(observer)
    observer.close()
    rc, _, err = finish(cli(*load), timeout=120)
    assert rc == 0, err
    store = get_store(backend, **options)
    try:
        assert_holds_exactly(store, weights.load(str(tiny_model_dir)))
    finally:
        store.close()
    assert_greedy_matches_numpy(load_config(path), tiny_model_dir)
