"""The turbopuffer backend's test server: vecgpt.backends.turbopuffer.server on a free loopback port, started once per
run on first use (in a background thread) and stopped at exit. It accumulates distances in float32,
one dimension after another (`--float32`): the service does not document its arithmetic, and the tests
must hold under the worst plausible order, never only under float64-then-round. Each test gets its own namespace prefix,
derived from its tmp_path, so two connections in one test see the same data."""

from __future__ import annotations

import atexit
import hashlib
import os

_running = None


def server():
    global _running
    if _running is None:
        from vecgpt.backends.turbopuffer.server import Running

        _running = Running(float32=True, api_key=os.environ["TURBOPUFFER_API_KEY"])
        atexit.register(_running.stop)
    return _running


def options(tmp_path) -> dict:
    os.environ.setdefault("TURBOPUFFER_API_KEY", "local-test-key")  # the one key the server accepts
    os.environ.pop("TURBOPUFFER_REGION", None)  # the client refuses a region with a base URL lacking {region}
    url = server().url
    prefix = "t" + hashlib.sha1(str(tmp_path).encode()).hexdigest()[:10] + "-"
    return {"base_url": url, "prefix": prefix, "max_retries": 0}
