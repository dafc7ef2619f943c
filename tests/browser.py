"""Browser-test plumbing: a playground server on a free port of 127.0.0.1 in this process, and Debian's chromium
driven by Playwright for Python (no browser download).

Without chromium (or Playwright) the browser tests skip with one line; under CI (env CI set) they fail.
VECGPT_CHROMIUM names another chromium executable.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from vecgpt.playground.server import Settings

# README's screenshots are these tests' (VECGPT_SCREENSHOTS=1 writes them there); otherwise a scratch folder,
# so a test run leaves the checkout as it found it
IMAGES = (
    Path(__file__).resolve().parent.parent / "docs" / "img"
    if os.environ.get("VECGPT_SCREENSHOTS")
    else Path(tempfile.gettempdir()) / "vecgpt-screenshots"
)
IMAGES.mkdir(parents=True, exist_ok=True)


def need(what: str) -> None:
    message = f"browser tests need {what}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI runs them: install it)")
    pytest.skip(message)


def chromium_path() -> str:
    path = os.environ.get("VECGPT_CHROMIUM") or shutil.which("chromium")
    if not path:
        need("Debian's chromium (apt-get install chromium; scripts/test.sh does it)")
    return path


class Running:
    """A playground app served by uvicorn in a thread, on a free port; `app.state` reachable for hooks."""

    def __init__(self, settings: Settings):
        import uvicorn

        from vecgpt.playground.app import bound_socket, build_app

        self.settings = settings
        self.app = build_app(settings)
        sock = bound_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the playground server did not start")
            time.sleep(0.02)

    @property
    def library(self):
        return self.app.state.library

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def call(url: str, method: str = "GET", body=None, raw: bytes | None = None, **headers: str) -> tuple[int, dict]:
    """(status, JSON) of one request (a command-line client's: JSON, no Origin; `headers` added, e.g.
    Authorization="token ..."); a 4xx/5xx is returned, not raised."""
    status, _, answer = request(url, method, body, raw, **{"Content-Type": "application/json", **headers})
    return status, json.loads(answer)


def request(url: str, method: str = "GET", body=None, raw: bytes | None = None, **headers: str):
    """(status, headers, body bytes) of one request with exactly these headers (and urllib's Host, unless given)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    sent = urllib.request.Request(
        url, data=data, method=method, headers={k.replace("_", "-"): v for k, v in headers.items()}
    )
    try:
        with urllib.request.urlopen(sent, timeout=120) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def events(url: str) -> list[tuple[str, dict]]:
    """The server-sent events of one stream, read to its end."""
    out, kind = [], None
    try:
        stream = urllib.request.urlopen(url, timeout=300)
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{url}: {e.code} {e.read().decode()}") from None
    with stream as r:
        for line in r:
            line = line.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                out.append((kind, json.loads(line[6:])))
    return out


@pytest.fixture(scope="session")
def browser():
    path = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need("Playwright for Python (pip install 'vecgpt[test]')")
    with sync_playwright() as p:
        # evil.example reaches this machine, as a DNS-rebinding attacker's name would
        rules = "--host-resolver-rules=MAP evil.example 127.0.0.1"
        b = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox", rules])
        yield b
        b.close()


def watch(p) -> list[str]:
    """The console errors and uncaught exceptions of page `p`, as they come."""
    errors: list[str] = []
    p.on("console", lambda m: errors.append(f"{m.text} ({m.location.get('url')})") if m.type == "error" else None)
    p.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def fresh_page(browser, viewport=None, **options):
    """A fresh browser page (1280 x 800 unless `viewport`); no page may log a console error, unless its test takes
    them from `page.console_errors` (clearing the list) where it provokes them."""
    context = browser.new_context(viewport=viewport or {"width": 1280, "height": 800}, **options)
    p = context.new_page()
    p.set_default_timeout(30000)
    p.console_errors = watch(p)
    yield p
    context.close()
    assert p.console_errors == [], p.console_errors


@pytest.fixture
def page(browser):
    """A page whose tests may evaluate JavaScript strings (wait_for_function), which the pages' Content
    Security Policy forbids: it is set aside here; `strict_page` keeps it."""
    yield from fresh_page(browser, bypass_csp=True)


@pytest.fixture
def strict_page(browser):
    yield from fresh_page(browser)


@pytest.fixture(scope="session")
def playground(tmp_path_factory):
    """One server for the browser tests: the shipped model on a fresh FAISS folder."""
    folder = tmp_path_factory.mktemp("playground") / "faiss"
    server = Running(Settings(store=str(folder)))
    yield server
    server.stop()
