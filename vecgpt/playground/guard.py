"""What `vecgpt serve` checks before any route runs (an ASGI middleware), each refusal one JSON line:

* the Host header names this server (against DNS rebinding): 403;
* a per-client request rate (a token bucket per address): 429 with Retry-After;
* the token, where the server has one (header, cookie or ?token= once): 401;
* an API request comes from the server's own page: Sec-Fetch-Site, where the browser sends it, is same-origin
  (or none: an address typed in); a request that changes something has no Origin or the server's own and
  Content-Type application/json (a cross-site form or no-cors fetch can send neither): 403.

The package's own files (/static/, /favicon.ico) need no token and count against no rate; the Host check holds
for them too. Every answer gets headers that keep the pages out of other sites' frames.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import time
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, RedirectResponse

SAFE_METHODS = {"GET", "HEAD"}
OPEN_PATHS = ("/static/", "/favicon.ico")
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "[::1]"}
WILDCARDS = {"0.0.0.0", "::", "[::]", ""}
HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (
        b"content-security-policy",
        b"default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; "
        b"base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
]


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """A Host header's name without its port, lower case; an IPv6 address keeps its brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def bracketed(host: str) -> str:
    return f"[{host.strip('[]')}]" if ":" in host else host


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
        return True
    except ValueError:
        return False


def cookie_value(token: str) -> str:
    """What the cookie holds: derived from the token, so the cookie never carries the token itself."""
    return hmac.new(token.encode(), b"vecgpt serve cookie", hashlib.sha256).hexdigest()


def same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def refusal(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status, headers={k.replace("_", "-"): v for k, v in headers.items()})


class Buckets:
    """A token bucket per client: `rate` requests a second on average, up to `burst` at once."""

    LARGEST = 4096  # clients remembered before full (idle) buckets are forgotten

    def __init__(self, rate: float, burst: float, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, max(1.0, burst), clock
        self.level: dict[str, tuple[float, float]] = {}

    def take(self, client: str) -> float:
        """0 when the client may go on (a request taken from its bucket); else the seconds until it may."""
        now = self.clock()
        tokens, then = self.level.get(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        if tokens < 1:
            self.level[client] = (tokens, now)
            return (1 - tokens) / self.rate
        self.level[client] = (tokens - 1, now)
        if len(self.level) > self.LARGEST:
            self.forget_idle(now)
        return 0.0

    def forget_idle(self, now: float) -> None:
        full = [c for c, (t, then) in self.level.items() if t + (now - then) * self.rate >= self.burst]
        for client in full:
            del self.level[client]


class Guard:
    """The middleware: `settings` is the server's (host, token, allow_hosts, rate_per_s, burst)."""

    def __init__(self, app, settings):
        self.app, self.token = app, settings.token or None
        self.hosts = LOOPBACK_NAMES | {bracketed(settings.host.lower())} | {host_name(h) for h in settings.allow_hosts}
        self.any_ip = settings.host.lower() in WILDCARDS  # a wildcard bind answers on every address of the machine
        self.buckets = Buckets(settings.rate_per_s, settings.burst)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + HEADERS
            await send(message)

        answer = self.check(scope)
        await (answer or self.app)(scope, receive, with_headers)

    def check(self, scope):
        """The response refusing (or redirecting) this request, or None to let it through."""
        headers, path = Headers(scope=scope), scope["path"]
        if not self.host_allowed(headers.get("host", "")):
            return refusal(403, "this server answers only its own address; start it with --allow-host NAME for another")
        if path.startswith(OPEN_PATHS):
            return None
        wait = self.buckets.take((scope.get("client") or ("unknown",))[0])
        if wait:
            seconds = math.ceil(wait)
            return refusal(
                429, f"too many requests from your address; try again in {seconds} s", retry_after=str(seconds)
            )
        return self.token_check(scope, headers) or cross_site(scope, headers)

    def host_allowed(self, header: str) -> bool:
        name = host_name(header)
        return name in self.hosts or (self.any_ip and is_ip(name))

    def token_check(self, scope, headers: Headers):
        if self.token is None:
            return None
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
        if "token" in query and same(query["token"], self.token):
            return login(scope, headers, self.token, query) if is_page(scope) else None
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() in ("token", "bearer") and same(given.strip(), self.token):
            return None
        if same(cookie_of(scope, headers), cookie_value(self.token)):
            return None
        return refusal(
            401,
            "this server needs its token: open the address vecgpt serve printed (with ?token=) once, "
            "or send the header Authorization: token ...",
            www_authenticate="token",
        )


def is_page(scope) -> bool:
    return scope["method"] in SAFE_METHODS and not scope["path"].startswith("/api/")


def cookie_name(headers: Headers) -> str:
    """One cookie name per port (cookies are shared by every port of a host; two servers keep theirs apart)."""
    host = headers.get("host", "")
    port = host.rsplit(":", 1)[1] if host.rsplit(":", 1)[-1].isdigit() and not host.endswith("]") else "80"
    return f"vecgpt-token-{port}"


def cookie_of(scope, headers: Headers) -> str:
    from http.cookies import SimpleCookie

    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # noqa: BLE001 - a malformed cookie header is no token
        return ""
    found = jar.get(cookie_name(headers))
    return found.value if found else ""


def login(scope, headers: Headers, token: str, query: dict) -> RedirectResponse:
    """A page opened with the right ?token=: set the cookie, and go to the same address without the token."""
    rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
    where = "/" + scope["path"].lstrip("/") + (f"?{rest}" if rest else "")  # "/" + ...: never "//other.host"
    response = RedirectResponse(where, 303, headers={"Cache-Control": "no-store"})
    response.set_cookie(
        cookie_name(headers),
        cookie_value(token),
        httponly=True,
        samesite="strict",
        secure=scope.get("scheme") == "https",
    )
    return response


def cross_site(scope, headers: Headers):
    """403 for an API request not from this server's own page (see the module's docstring)."""
    if not scope["path"].startswith("/api/"):
        return None
    safe = scope["method"] in SAFE_METHODS
    site = headers.get("sec-fetch-site")
    if site is not None and site not in (("same-origin", "none") if safe else ("same-origin",)):
        return refusal(403, f"a {site} request is refused: use this server's own page")
    if safe:
        return None
    origin = headers.get("origin")
    if origin is not None and not own_origin(origin, headers.get("host", "")):
        return refusal(403, f"a request from {origin[:100]} is refused: use this server's own page")
    if headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        return refusal(403, "a request that changes something must send Content-Type: application/json")
    return None


def own_origin(origin: str, host: str) -> bool:
    scheme, sep, rest = origin.partition("://")
    return bool(sep) and scheme.lower() in ("http", "https") and rest.lower() == host.strip().lower()
