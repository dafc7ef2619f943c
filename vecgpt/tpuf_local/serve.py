"""Running the server: a TCP_NODELAY listening socket, uvicorn, `Running` (a background thread, for tests
and benchmarks), `serve` (the foreground), and the command-line options of `vecgpt tpuf-local`."""

from __future__ import annotations

import argparse
import socket
import threading
import time

from vecgpt.tpuf_local.app import app
from vecgpt.tpuf_local.limits import MAX_TOP_K
from vecgpt.tpuf_local.server import Server


def listen(host: str, port: int) -> socket.socket:
    """A listening socket with TCP_NODELAY, which accepted sockets inherit: the response's headers and body
    go out as two writes, and without it Nagle plus the peer's delayed ACK stall each reply by ~40 ms."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def uvicorn_server(server: Server):
    import uvicorn

    config = uvicorn.Config(app(server), log_level="warning", access_log=False, lifespan="off")
    return uvicorn.Server(config)


class Running:
    """A server on a loopback port in a background thread: `url`, `server` (the data), `stop()`."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", **kw):
        self.server = Server(**kw)
        sock = listen(host, port)
        self.port = sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._uv = uvicorn_server(self.server)
        self._uv.install_signal_handlers = lambda: None  # not the main thread
        self._thread = threading.Thread(target=self._uv.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._uv.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the local turbopuffer server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._uv.should_exit = True
        self._thread.join(timeout=5)


def serve(port: int, host: str = "127.0.0.1", **kw) -> None:
    """Run in the foreground until interrupted."""
    sock = listen(host, port)
    print(f"turbopuffer-compatible server on http://{host}:{sock.getsockname()[1]} (latency {kw.get('latency_ms', 0)} ms); "
          f"set base_url to it and TURBOPUFFER_API_KEY to anything", flush=True)
    uvicorn_server(Server(**kw)).run(sockets=[sock])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--latency-ms", type=float, default=0.0, help="delay added to every request (simulated network)")
    p.add_argument("--api-key", default=None, help="accept only this bearer token (default: any)")
    p.add_argument("--max-top-k", type=int, default=MAX_TOP_K, help="rows per query (the service allows 10,000)")
    p.add_argument("--slot-rule", choices=["subquery", "request"], default="subquery",
                   help="count every multi_query subquery against the 16 slots (default) or the request once")


def run_args(args) -> int:
    serve(args.port, args.host, latency_ms=args.latency_ms, api_key=args.api_key, max_top_k=args.max_top_k,
          slot_rule=args.slot_rule)
    return 0
