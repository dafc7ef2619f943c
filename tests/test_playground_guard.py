"""What `vecgpt serve` refuses, tried as an attacker would: a page of another origin (fetch, no-cors fetch, an
image, auto-submitted forms), a DNS-rebinding name, a request without the server's token, a client over its
request rate, spending past the hourly dollars. The playground itself still works, under its Content Security
Policy, with and without a token, and logs no console error."""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import re
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

import pytest
from test_playground_api import charging_server, small_config  # noqa: F401 - small_config is a fixture

from vecgpt import tokenizer
from vecgpt.cli import main
from vecgpt.playground.budget import Budget

from browser import Running, call, events, request

TOKEN = "a-test-token-3f9c2e71d0b4"


def refused(status: int, body: bytes, code: int, words: str) -> None:
    assert status == code, body
    line = body.decode()
    assert words in line and "\n" not in line.strip() and line.startswith('{"error":'), line


def server(playground, **changes) -> Running:
    """Another server on the playground's store (its model already loaded), with other settings."""
    return Running(dataclasses.replace(playground.settings, **changes))


def port(url: str) -> int:
    return urlparse(url).port


# ----------------------------------------------------------------------------- Host (DNS rebinding)


def test_a_foreign_host_is_refused_and_a_named_one_allowed(playground):
    url, p = playground.url, port(playground.url)
    for path in ("/", "/api/stores", "/static/style.css", "/favicon.ico"):
        status, _, body = request(url + path, Host=f"evil.example:{p}")
        refused(status, body, 403, "answers only its own address")
    for host in (f"localhost:{p}", f"127.0.0.1:{p}", f"[::1]:{p}", f"LOCALHOST:{p}"):
        assert request(url + "/api/stores", Host=host)[0] == 200, host
    team = server(playground, allow_hosts=["team.example"])
    try:
        assert request(team.url + "/api/stores", Host=f"team.example:{port(team.url)}")[0] == 200
        assert request(team.url + "/api/stores", Host="other.example")[0] == 403
    finally:
        team.stop()


def test_a_rebinding_page_is_refused_in_chromium(playground, page):
    """The browser resolves evil.example to 127.0.0.1 (tests/browser.py), as a rebinding attacker makes it."""

    def refused_is_expected(_message) -> None:  # the page's own 403 and the favicon's, whenever the browser asks
        page.console_errors[:] = [e for e in page.console_errors if "status of 403" not in e]

    page.on("console", refused_is_expected)  # after tests/browser.py's watch: it sees each error first
    response = page.goto(f"http://evil.example:{port(playground.url)}/")
    assert response.status == 403 and "answers only its own address" in page.content()
    assert all("status of 403" in e for e in page.console_errors)
    page.console_errors.clear()


# ----------------------------------------------------------------------------- Origin and Content-Type


@pytest.mark.parametrize(
    "headers, code, words",
    [
        ({"Origin": "http://evil.example", "Content-Type": "text/plain"}, 403, "http://evil.example is refused"),
        ({"Origin": "http://evil.example", "Content-Type": "application/json"}, 403, "is refused"),
        ({"Origin": "null", "Content-Type": "application/json"}, 403, "null is refused"),
        ({"Content-Type": "text/plain"}, 403, "Content-Type: application/json"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 403, "Content-Type: application/json"),
        ({}, 403, "Content-Type: application/json"),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, 403, "same-site request"),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403, "cross-site request"),
    ],
)
def test_a_change_needs_the_own_origin_and_json(playground, headers, code, words):
    before = set(playground.library.texts)
    status, _, body = request(playground.url + "/api/texts", "POST", {"prompt": "hi", "n": 2}, **headers)
    refused(status, body, code, words)
    assert set(playground.library.texts) == before


def test_the_own_origin_or_none_may_change(playground):
    url = playground.url
    for headers in ({}, {"Origin": url}, {"Origin": url, "Sec-Fetch-Site": "same-origin"}):
        status, view = call(url + "/api/texts", "POST", {"prompt": "hi"}, **headers)
        assert status == 200, view
        assert call(f"{url}/api/texts/{view['id']}", "DELETE", **headers)[0] == 200
    status, _, body = request(url + "/api/stores", Sec_Fetch_Site="cross-site")
    refused(status, body, 403, "cross-site request")  # a read too, where the browser says where it came from


# ----------------------------------------------------------------------------- a page of another origin


ATTACK = """<!doctype html><html><head><meta charset="utf-8"><title>a site the user visits</title></head><body>
<iframe name="f1"></iframe><iframe name="f2"></iframe><iframe name="f3"></iframe><iframe name="f4"></iframe>
<form id="create" method="post" enctype="text/plain" action="TARGET/api/texts" target="f1">
  <input name='{"prompt":"hi","n":2,"pad":"' value='"}'></form>
<form id="branch" method="post" enctype="text/plain" action="TARGET/api/texts/TEXTID/branch" target="f2">
  <input name='{"position":POSN,"token":11,"pad":"' value='"}'></form>
<form id="step" method="post" action="TARGET/api/texts/TEXTID/step-back" target="f3"><input name="position" value="POSN"></form>
<form id="retry" method="post" enctype="text/plain" action="TARGET/api/texts/TEXTID/retry" target="f4">
  <input name='{"position":POSN,"seed":5,"pad":"' value='"}'></form>
<img src="TARGET/api/texts/TEXTID/generate?n=2" alt="">
<script>
const plain = { "Content-Type": "text/plain" };
const tries = [
  fetch("TARGET/api/texts", { method: "POST", mode: "no-cors", headers: plain, body: '{"prompt":"hi","n":2}' }),
  fetch("TARGET/api/texts/TEXTID/generate?n=2", { mode: "no-cors" }),
  fetch("TARGET/api/texts/TEXTID/branch", { method: "POST", mode: "no-cors", headers: plain, body: '{"position":POSN,"token":11}' }),
  fetch("TARGET/api/texts/TEXTID", { method: "DELETE" }),
  fetch("TARGET/api/texts/TEXTID").then((r) => r.text()),
];
Promise.allSettled(tries).then((r) => { document.body.dataset.read = r[4].status; });
for (const f of document.forms) f.submit();
</script></body></html>"""


@pytest.fixture
def attacker():
    """A second local server, on another port: it serves ATTACK (filled in by the test) at every path."""
    pages = {"html": ""}

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages["html"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield pages, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_a_page_of_another_origin_can_neither_change_nor_read_a_text(playground, page, attacker):
    url = playground.url
    status, victim = call(f"{url}/api/texts", "POST", {"prompt": "ROMEO:"})
    assert status == 200 and len([e for e in events(f"{url}/api/texts/{victim['id']}/generate?n=2")]) == 3
    victim = call(f"{url}/api/texts/{victim['id']}")[1]  # its id leaked to the attacker, say
    store = playground.library.shelves[0].store
    texts = (set(playground.library.texts), set(store.texts()))
    pages, attack_url = attacker
    pages["html"] = (
        ATTACK.replace("TARGET", url).replace("TEXTID", victim["id"]).replace("POSN", str(victim["prompt_len"]))
    )
    answers, failed = [], []  # a refused CORS read or preflight fails without a status the page may see
    page.on("response", lambda r: answers.append((r.request.method, urlparse(r.url).path, r.status)))
    page.on("requestfailed", lambda r: failed.append((r.method, urlparse(r.url).path)))
    page.goto(attack_url)
    page.wait_for_selector("body[data-read]", state="attached")
    vid = victim["id"]
    tried = {
        ("POST", "/api/texts"),
        ("POST", f"/api/texts/{vid}/branch"),
        ("POST", f"/api/texts/{vid}/step-back"),
        ("POST", f"/api/texts/{vid}/retry"),
        ("GET", f"/api/texts/{vid}/generate"),
        ("GET", f"/api/texts/{vid}"),
        ("DELETE", f"/api/texts/{vid}"),  # its preflight refused, it is never sent
    }
    seen = lambda: {(m, p) for m, p, _ in answers if p.startswith("/api/")} | set(failed)  # noqa: E731
    deadline = time.monotonic() + 20
    while seen() != tried and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert seen() == tried, (answers, failed)
    assert {s for _, p, s in answers if p.startswith("/api/")} == {403}, answers
    assert page.evaluate("document.body.dataset.read") == "rejected"  # the read: no CORS, no answer to read
    assert (set(playground.library.texts), set(store.texts())) == texts  # nothing started, nothing closed
    assert call(f"{url}/api/texts/{vid}")[1]["tokens"] == victim["tokens"]  # nothing generated, stepped back
    page.console_errors.clear()  # the attacker's page logs its refusals


# ----------------------------------------------------------------------------- the playground itself


def test_the_pages_work_under_their_policy_and_log_no_error(playground, strict_page):
    page = strict_page  # no JavaScript strings evaluated here: the policy forbids them
    response = page.goto(playground.url + "/")
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    page.wait_for_selector("body[data-ready]", state="attached")
    page.fill("#prompt", "ROMEO:")
    page.fill("#n", "3")
    page.get_by_role("button", name="Generate", exact=True).click()
    last = len(tokenizer.encode("ROMEO:")) + 2
    page.wait_for_selector(f"#text [data-position='{last}']")
    page.wait_for_selector("#generate:not([disabled])")
    page.click(f"#text [data-token][data-position='{last}']")
    page.wait_for_selector("#candidates tr[data-candidate]")
    assert page.inner_text("#error") == "" and page.inner_text("#spending") == ""  # FAISS charges nothing
    page.goto(playground.url + "/attention")
    page.wait_for_selector("#full-bytes:not(:empty)")
    # the fixture asserts that neither page logged a console error (a missing favicon, a refused script ...)


# ----------------------------------------------------------------------------- the token


@pytest.fixture(scope="module")
def guarded(playground):
    s = server(playground, token=TOKEN)
    yield s
    s.stop()


def test_without_the_token_nothing_but_the_package_files_answers(guarded):
    url = guarded.url
    for path in ("/", "/attention", "/api/stores", f"/api/stores?token={TOKEN}x"):
        status, _, body = request(url + path)
        refused(status, body, 401, "needs its token")
        assert TOKEN.encode() not in body
    for headers in ({"Authorization": f"token {TOKEN}"}, {"Authorization": f"Bearer {TOKEN}"}):
        assert call(url + "/api/stores", **headers)[0] == 200
    assert call(url + "/api/stores", Authorization="token not-the-token-at-all")[0] == 401
    assert call(f"{url}/api/stores?token={TOKEN}")[0] == 200  # a command-line client may put it in the address
    assert request(url + "/static/style.css")[0] == 200 and request(url + "/favicon.ico")[0] == 200


def test_the_token_in_the_address_becomes_a_cookie(guarded, page):
    url = guarded.url
    response = page.goto(url + "/")
    assert response.status == 401
    page.console_errors.clear()  # the refused page
    page.goto(f"{url}/?token={TOKEN}")
    assert page.url == url + "/"  # the address no longer carries it
    (cookie,) = page.context.cookies()
    assert cookie["name"] == f"vecgpt-token-{port(url)}" and cookie["value"] != TOKEN
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page.wait_for_selector("body[data-ready]")
    page.fill("#n", "2")
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_function("document.querySelectorAll('#text [data-token]').length === 2")
    assert page.inner_text("#error") == "" and TOKEN not in page.content()
    status, _, body = request(url + "/api/stores", Cookie=f"{cookie['name']}={cookie['value']}")
    assert status == 200


def test_the_redirect_keeps_the_rest_of_the_address_and_stays_here(guarded):
    def login(path: str, headers: dict | None = None) -> tuple[str, str]:
        connection = http.client.HTTPConnection("127.0.0.1", port(guarded.url), timeout=30)
        connection.request("GET", path, headers=headers or {})
        answer = connection.getresponse()
        connection.close()
        assert answer.status == 303, answer.status
        return answer.getheader("Location"), answer.getheader("Set-Cookie")

    where, cookie = login(f"/?text=abc&token={TOKEN}")
    assert where == "/?text=abc" and "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" not in cookie
    assert TOKEN not in cookie
    assert login(f"//evil.example/?token={TOKEN}")[0] == "/evil.example/"  # a path, never another host
    assert "Secure" in login(f"/?token={TOKEN}", {"X-Forwarded-Proto": "https"})[1]  # behind a TLS proxy on loopback


def test_beyond_loopback_a_token_is_required(capsys, monkeypatch):
    monkeypatch.delenv("VECGPT_TOKEN", raising=False)
    for argv, words in (
        (["--host", "0.0.0.0"], "--host 0.0.0.0 lets other machines in: give a token"),
        (["--host", "0.0.0.0", "--token", "short"], "at least 16 characters"),
    ):
        code = main(["serve", "--port", "0", *argv])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and words in err, err


def test_a_made_token_is_shown_once_and_never_logged(playground):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vecgpt.cli",
            "serve",
            "--port",
            "0",
            "--store",
            playground.settings.store,
            "--make-token",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+)/\?token=([\w-]+)", line)
        assert found, line
        url, token = found.groups()
        deadline = time.monotonic() + 60
        while not _answers(f"{url}/api/stores?token={token}"):
            assert time.monotonic() < deadline and proc.poll() is None, "vecgpt serve did not answer"
            time.sleep(0.2)
        status, headers, _ = request(f"{url}/?token={token}")  # urllib follows the redirect, without the cookie
        assert status == 401
        assert request(f"{url}/api/stores?token=wrong{token}")[0] == 401
    finally:
        proc.terminate()
        rest = proc.communicate(timeout=10)[1]
    assert len(token) >= 32 and (line + rest).count(token) == 1, rest


def _answers(url: str) -> bool:
    try:
        return request(url)[0] == 200
    except OSError:
        return False


# ----------------------------------------------------------------------------- rate and money


def test_a_client_past_its_rate_waits(playground):
    s = server(playground, rate_per_s=0.1, burst=3)  # a request each 10 s, 3 at once
    try:
        assert [call(s.url + "/api/stores")[0] for _ in range(3)] == [200, 200, 200]
        status, headers, body = request(s.url + "/api/stores")
        refused(status, body, 429, "too many requests")
        assert 1 <= int(headers["Retry-After"]) <= 10
        assert request(s.url + "/static/style.css")[0] == 200  # the package's files are not counted
    finally:
        s.stop()


def test_spending_is_counted_over_a_sliding_hour():
    now, total = [0.0], [0.0]
    budget = Budget(1.0, [lambda: total[0]], clock=lambda: now[0])
    total[0], now[0] = 0.6, 10.0
    assert budget.over() is None and budget.spent() == pytest.approx(0.6)
    total[0], now[0] = 1.1, 1800.0
    assert "spending limit is reached: $1.1000 of $1.00" in budget.over()
    assert budget.wait_s() == pytest.approx(3600 + 10 - 1800)  # until the first $0.6 leaves the hour
    now[0] = 3611.0
    assert budget.over() is None and budget.spent() == pytest.approx(0.5)
    now[0] = 5401.0
    assert budget.spent() == pytest.approx(0.0)
    assert not Budget(1.0, []).charging and Budget(1.0, []).over() is None


def test_a_charging_store_stops_at_its_dollars_an_hour(tmp_path, monkeypatch, small_config, page):  # noqa: F811
    with charging_server(tmp_path, monkeypatch, small_config, max_dollars_per_hour=5.0) as s:
        page.goto(s.url)
        page.wait_for_selector("body[data-ready]")
        page.fill("#prompt", " the")
        page.fill("#n", "2")
        page.get_by_role("button", name="Generate", exact=True).click()
        page.wait_for_function("document.querySelectorAll('#text [data-token]').length === 2")
        page.wait_for_function(
            r"/^spent \$\d+\.\d{4} of \$5\.00 this hour$/.test(document.querySelector('#spending').textContent)"
        )
        spent = call(s.url + "/api/spending")[1]
        assert spent["charging"] and 0 < spent["spent"] < 5 and spent["limit"] == 5.0
        budget, asked = s.library.budget, []

        def spend_the_rest(position: int) -> None:  # before each token: the second finds the hour's dollars spent
            asked.append(position)
            if len(asked) == 2:
                budget.limit = budget.spent()

        s.app.state.before_token = spend_the_rest
        text_id = page.url.split("text=")[1]
        got = events(f"{s.url}/api/texts/{text_id}/generate?n=3")
        assert [kind for kind, _ in got] == ["token", "error"] and "spending limit is reached" in got[1][1]["error"]
        for method, path, body in (("POST", "/api/texts", {"prompt": " the"}), ("GET", f"/api/texts/{text_id}", None)):
            status, headers, answer = request(s.url + path, method, body, Content_Type="application/json")
            refused(status, answer, 429, "spending limit is reached")
            assert 1 <= int(headers["Retry-After"]) <= 3600
