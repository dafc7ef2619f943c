"""Driving the real CLI in subprocesses against real stores (this checkout's code, via PYTHONPATH)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import LIBRARIES, store_options

ROOT = Path(__file__).resolve().parents[1]


def needs(backend: str) -> None:
    lib = LIBRARIES.get(backend)
    if lib:
        pytest.importorskip(lib)


def write_config(path: Path, backend: str, store: dict) -> Path:
    lines = [f"backend = {json.dumps(backend)}", 'metric = "l2"', "[store]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in store.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def env() -> dict:  # read at each start: a store's test setup may have set TURBOPUFFER_API_KEY
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def cli(*argv: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "vecgpt.cli", *argv],
        env=env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )


def default_sigint() -> None:
    """Ctrl-C as a terminal gives it: a suite started in the background (`cmd &`, nohup) ignores SIGINT, a child
    inherits that, and Python then installs no KeyboardInterrupt handler, so an interrupt test would see no
    interrupt at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def assert_one_line_error(rc: int, err: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and lines and lines[-1].startswith("vecgpt: error: "), err
    assert "Traceback" not in err, err


def connected(sock: socket.socket) -> None:
    """A client connects to sock at once, as one told its printed address may (then sock is closed): a socket only
    bound, not yet listening, refuses it."""
    try:
        with socket.create_connection(sock.getsockname(), timeout=5):
            pass
    finally:
        sock.close()


def wait_for(condition, timeout: float, step: float = 0.002) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return False


def store_config(backend: str, tmp_path: Path, **extra) -> tuple[Path, dict]:
    needs(backend)
    options = {**store_options(backend, tmp_path), **extra}
    return write_config(tmp_path / f"{backend}.toml", backend, options), options
