"""The turbopuffer backend's test server: vecgpt.backends.turbopuffer.server in its own process on a free loopback
port, started once per run on first use and stopped at exit. Its own process, as the service is: in a thread of the
test process the server and the client took turns at one interpreter lock, and a test ran about a third slower.
It accumulates distances in float32, one dimension after another (`--float32`): the service does not document its
arithmetic, and the tests must hold under the worst plausible order, never only under float64-then-round. Each test
gets its own namespace prefix, derived from its tmp_path, so two connections in one test see the same data."""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import signal
import subprocess
import sys

from procs import ROOT, env

_url = None


def server_url() -> str:
    global _url
    if _url is None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vecgpt.backends.turbopuffer.server", "--port", "0", "--float32"]
            + ["--api-key", os.environ["TURBOPUFFER_API_KEY"]],
            env=env(),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
        )
        atexit.register(stop, proc)
        line = proc.stdout.readline()  # "turbopuffer-compatible server on http://127.0.0.1:<port> (...)"
        found = re.search(r"http://127\.0\.0\.1:\d+", line)
        if not found:
            stop(proc)
            raise RuntimeError(f"the local turbopuffer server did not start: {line!r}")
        _url = found.group()
    return _url


def die_with_parent() -> None:
    """A test run killed with SIGKILL leaves no server behind (Linux; elsewhere atexit alone stops it)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def options(tmp_path) -> dict:
    os.environ.setdefault("TURBOPUFFER_API_KEY", "local-test-key")  # the one key the server accepts
    os.environ.pop("TURBOPUFFER_REGION", None)  # the client refuses a region with a base URL lacking {region}
    prefix = "t" + hashlib.sha1(str(tmp_path).encode()).hexdigest()[:10] + "-"
    return {"base_url": server_url(), "prefix": prefix, "max_retries": 0}
