"""Running the server: a TCP_NODELAY listening socket, uvicorn, `Running` (a background thread, for tests
and benchmarks), `serve` (the foreground), and the command-line options of `vecgpt tpuf-local`."""

from __future__ import annotations

import argparse
import secrets
import socket
import threading
import time

from vecgpt.backends.turbopuffer.server.app import app
from vecgpt.backends.turbopuffer.server.faults import FAULTS, KINDS
from vecgpt.backends.turbopuffer.server.limits import MAX_TOP_K
from vecgpt.backends.turbopuffer.server.state import Server
from vecgpt.errors import VecgptError


def listen(host: str, port: int) -> socket.socket:
    """A listening socket with TCP_NODELAY, which accepted sockets inherit: the response's headers and body
    go out as two writes, and without it Nagle plus the peer's delayed ACK stall each reply by ~40 ms. It listens
    before it is handed to uvicorn: a client told the address (serve prints it) may connect while uvicorn starts,
    and a socket only bound refuses it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as e:
        sock.close()
        raise VecgptError(
            f"cannot listen on {host}:{port} ({getattr(e, 'strerror', None) or e}); "
            f"is another server using it? pick another with --port"
        ) from None
    sock.listen(2048)  # uvicorn's own backlog
    return sock


# Seconds an idle connection stays open. The official client keeps idle connections for 60 s, so the service keeps
# them at least that long; with a shorter timeout (uvicorn's default is 5 s) a request sent on a connection just as
# the server closes it fails as a connection error (the tests send without retries).
KEEP_ALIVE_S = 75


def uvicorn_server(server: Server):
    import uvicorn

    config = uvicorn.Config(
        app(server), log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=KEEP_ALIVE_S
    )
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


def serve(port: int, host: str = "127.0.0.1", memory_limit_mb: float | None = None, **kw) -> None:
    """Run in the foreground until interrupted. It accepts one key: --api-key, else one it makes and prints
    (a fixed port is reachable by every user of the machine; a key keeps their data apart). `memory_limit_mb`
    caps the process's address space (memory.py: past it, writes get 507)."""
    made = kw.get("api_key") is None
    kw["api_key"] = secrets.token_urlsafe(18) if made else kw["api_key"]
    uv = uvicorn_server(Server(**kw))  # before the socket: a missing uvicorn leaves nothing open
    sock = listen(host, port)
    if memory_limit_mb:
        limit_address_space(int(memory_limit_mb * 2**20))
    shown = ", ".join(f"{k} {v}" for k, v in kw.items() if v and k not in ("api_key", "fail_kinds", "max_top_k"))
    shown += f", memory_limit_mb {memory_limit_mb:g}" if memory_limit_mb else ""
    key = f"TURBOPUFFER_API_KEY={kw['api_key']}" if made else "TURBOPUFFER_API_KEY to the key given with --api-key"
    print(
        f"turbopuffer-compatible server on http://{host}:{sock.getsockname()[1]} ({shown or 'defaults'}); "
        f"set base_url to it and {key}",
        flush=True,
    )
    uv.run(sockets=[sock])


def limit_address_space(nbytes: int) -> None:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY and nbytes > hard:
        raise VecgptError(f"--memory-limit-mb is above this process's hard limit of {hard / 2**20:,.0f} MB")
    resource.setrlimit(resource.RLIMIT_AS, (nbytes, hard))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `vecgpt tpuf-local`: where it listens, how it behaves, which faults it injects."""
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--latency-ms", type=float, default=0.0, help="delay added to every request (simulated network)")
    p.add_argument(
        "--write-latency-ms",
        type=float,
        default=0.0,
        help="a write (or delete) returns only after this commit delay; the service: up to ~200 ms",
    )
    p.add_argument(
        "--float32",
        action="store_true",
        help="accumulate distances in float32, dimension by dimension (default: float64, rounded once)",
    )
    p.add_argument(
        "--api-key", default=None, help="accept only this bearer token (default: one made at start and printed)"
    )
    p.add_argument("--max-top-k", type=int, default=MAX_TOP_K, help="rows per query (the service allows 10,000)")
    p.add_argument(
        "--memory-limit-mb",
        type=float,
        default=None,
        help="cap the server's address space (RLIMIT_AS) at this many MB: a write that would pass it gets 507",
    )
    _consistency_arguments(p)
    _fault_arguments(p)


def _consistency_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--list-lag-s",
        type=float,
        default=0.0,
        help="namespace listing lags this far behind creates and deletes (the docs: not consistent)",
    )
    p.add_argument(
        "--list-forbidden",
        action="store_true",
        help="answer namespace listing with 403 (a key without list permission)",
    )
    p.add_argument(
        "--index-lag-ms",
        type=float,
        default=0.0,
        help='writes stay unindexed this long: metadata says "updating" with the unindexed rows',
    )


def _fault_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fail-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="this fraction of requests fails (429, 500, or the reply is lost: dropped connection)",
    )
    p.add_argument("--fail-seed", type=int, default=0, help="seed of the injected faults")
    p.add_argument(
        "--fail-kinds",
        default=",".join(FAULTS),
        help=f"comma-separated, of {', '.join(KINDS)} (409: applied, then answered Conflict)",
    )


def server_options(args) -> dict:
    """Server(**options) from the parsed command line; bad values are one-line errors."""
    kinds = tuple(k.strip() for k in args.fail_kinds.split(",") if k.strip())
    if not 0 <= args.fail_rate < 1 or set(kinds) - set(KINDS) or not kinds:
        raise VecgptError(f"--fail-rate must be in [0, 1) and --fail-kinds a list of {', '.join(KINDS)}")
    if min(args.latency_ms, args.write_latency_ms, args.list_lag_s, args.index_lag_ms) < 0 or args.max_top_k < 1:
        raise VecgptError("latencies and lags must be >= 0 and --max-top-k >= 1")
    return {
        "latency_ms": args.latency_ms,
        "write_latency_ms": args.write_latency_ms,
        "float32": args.float32,
        "api_key": args.api_key,
        "max_top_k": args.max_top_k,
        "list_lag_s": args.list_lag_s,
        "list_forbidden": args.list_forbidden,
        "index_lag_ms": args.index_lag_ms,
        "fail_rate": args.fail_rate,
        "fail_seed": args.fail_seed,
        "fail_kinds": kinds,
    }


def run_args(args) -> int:
    if args.memory_limit_mb is not None and args.memory_limit_mb <= 0:
        raise VecgptError("--memory-limit-mb must be > 0")
    serve(args.port, args.host, args.memory_limit_mb, **server_options(args))
    return 0
