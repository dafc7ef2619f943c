"""The local turbopuffer server in a process of its own, for experiments that time a store behind a network."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys


def start_server(latency_ms: float) -> tuple[subprocess.Popen, str]:
    """`vecgpt.backends.turbopuffer.server` on a free port, one BLAS thread a request (as benchmarks/round_trips),
    `latency_ms` added to each request; (the process, its URL)."""
    os.environ.setdefault("TURBOPUFFER_API_KEY", "local")
    os.environ.pop("TURBOPUFFER_REGION", None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "vecgpt.backends.turbopuffer.server", "--port", str(port)]
    command += ["--latency-ms", str(latency_ms), "--api-key", os.environ["TURBOPUFFER_API_KEY"]]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    found = re.search(r"http://127\.0\.0\.1:\d+", proc.stdout.readline())
    if not found:
        proc.kill()
        from vecgpt.errors import VecgptError

        raise VecgptError("the local turbopuffer server did not start (python -m vecgpt.backends.turbopuffer.server)")
    return proc, found.group()
