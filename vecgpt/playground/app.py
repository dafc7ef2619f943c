"""The Starlette app and how `vecgpt serve` runs it on uvicorn (one process, or --workers N over one socket).

Workers are separate processes: each builds its app from the settings in VECGPT_SERVE (JSON), opens the same
stores, and serves any text from them (a text's state is in its store).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
from dataclasses import asdict

from starlette.applications import Starlette
from starlette.middleware import Middleware

from vecgpt.playground.guard import Guard
from vecgpt.playground.routes import ROUTES
from vecgpt.playground.server import Library, Settings

ENV = "VECGPT_SERVE"


def build_app(settings: Settings) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        library = Library(settings)
        app.state.library = library
        stop = threading.Event()
        threading.Thread(target=collector, args=(library, stop), daemon=True).start()
        try:
            yield
        finally:
            stop.set()
            library.close()

    return Starlette(routes=ROUTES, lifespan=lifespan, middleware=[Middleware(Guard, settings=settings)])


def collector(library: Library, stop: threading.Event) -> None:
    """Close idle texts now and then; a failing store is retried next time."""
    every = max(0.5, min(library.settings.idle_s / 4, 60.0))
    while not stop.wait(every):
        try:
            library.collect()
        except Exception as e:  # noqa: BLE001 - the collector must outlive a store hiccup
            print(
                f"vecgpt serve: closing idle texts failed: {str(e).splitlines()[0] if str(e) else e}", file=sys.stderr
            )


def from_env() -> Starlette:
    """The app of a worker process (uvicorn factory)."""
    return build_app(Settings(**json.loads(os.environ[ENV])))


def bound_socket(host: str, port: int) -> socket.socket:
    """Listening already when its address is printed: a browser or test that connects while uvicorn starts waits
    in the backlog rather than being refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # uvicorn's own backlog
    sock.set_inheritable(True)
    return sock


def serve(settings: Settings, port: int = 8000, show_token: bool = False) -> None:
    """Bind (port 0: any free port), say where, and serve until interrupted."""
    import uvicorn

    sock = bound_socket(settings.host, port)
    print(f"vecgpt serve: {address(settings, sock.getsockname()[1], show_token)}", file=sys.stderr, flush=True)
    os.environ[ENV] = json.dumps(asdict(settings))
    uvicorn.run(  # uvicorn binds nothing: it serves the socket above (in each worker, for --workers)
        "vecgpt.playground.app:from_env",
        factory=True,
        fd=sock.fileno(),
        workers=settings.workers,
        log_level="warning",
        access_log=False,  # an address may carry ?token=
        server_header=False,
        timeout_graceful_shutdown=2,
    )


def address(settings: Settings, port: int, show_token: bool) -> str:
    """The line saying where to point a browser: the only place a token made here is ever shown."""
    host = settings.host
    wildcard = host in ("0.0.0.0", "::")
    shown = ("127.0.0.1" if host == "0.0.0.0" else "[::1]") if wildcard else f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={settings.token}" if show_token else "")
    notes = [f"{settings.workers} worker{'s' * (settings.workers > 1)}"]
    if settings.token and not show_token:
        notes.append("open it once with ?token=<your token>")
    if wildcard:
        notes.append(f"listening on {host}: other machines use this one's IP address, or a name given to --allow-host")
    return f"{url} ({'; '.join(notes)})"
