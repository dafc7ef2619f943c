"""The playground in a real browser, on the shipped model in a FAISS folder: generate, click a token, branch,
step back, reload; text streamed as it is made. What the page shows is checked against the JSON API."""

from __future__ import annotations

import threading
from urllib.parse import parse_qs, urlparse

import pytest

from vecgpt import tokenizer
from vecgpt.playground.server import Settings

from browser import IMAGES, Running, call


def text_id(page) -> str:
    return parse_qs(urlparse(page.url).query)["text"][0]


def shown(page) -> list[tuple[int, int]]:
    """(position, token id) of every generated token on the page."""
    tokens = page.locator("#text [data-token]")
    return [
        (int(tokens.nth(i).get_attribute("data-position")), int(tokens.nth(i).get_attribute("data-token")))
        for i in range(tokens.count())
    ]


def generated(view: dict) -> list[tuple[int, int]]:
    return [(t["position"], t["id"]) for t in view["tokens"][view["prompt_len"] :]]


def generate(page, url: str, prompt: str, n: int) -> dict:
    page.goto(url)
    page.wait_for_selector("body[data-ready]")
    page.fill("#prompt", prompt)
    page.fill("#n", str(n))
    page.fill("#seed", "1")  # the page samples; a fixed seed draws the same n tokens each run
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_function(f"document.querySelectorAll('#text [data-token]').length === {n}")
    page.wait_for_selector("#generate:not([disabled])")
    return call(f"{url}/api/texts/{text_id(page)}")[1]


def test_generate_click_branch_step_back_reload(playground, page):
    url = playground.url
    view = generate(page, url, "ROMEO:", 5)
    assert shown(page) == generated(view) and len(generated(view)) == 5

    p = view["prompt_len"] + 1  # the second generated token
    page.click(f"#text [data-token][data-position='{p}']")
    page.wait_for_selector("#candidates tr[data-candidate]")
    status, want = call(f"{url}/api/texts/{view['id']}/candidates/{p}")
    rows = page.locator("#candidates tr[data-candidate]")
    got = [
        (int(rows.nth(i).get_attribute("data-candidate")), float(rows.nth(i).get_attribute("data-logit")))
        for i in range(rows.count())
    ]
    assert status == 200 and got == [(r["id"], r["logit"]) for r in want["rows"]]  # the same doubles, via JSON
    assert page.locator("#candidates tr.chosen").get_attribute("data-candidate") == str(view["tokens"][p]["id"])
    page.check("#check")
    page.wait_for_selector(f"body[data-checked='{view['id']}']")
    page.screenshot(path=str(IMAGES / "playground.png"))

    other = next(i for i, r in enumerate(want["rows"]) if not r["chosen"])  # sampled: any row may be the chosen
    second = want["rows"][other]["id"]
    rows.nth(other).get_by_role("button", name="branch with this candidate").click()
    page.wait_for_function(f"!location.search.includes('{view['id']}')")
    branched = call(f"{url}/api/texts/{text_id(page)}")[1]
    assert [t["id"] for t in branched["tokens"][:p]] == [t["id"] for t in view["tokens"][:p]]
    assert branched["tokens"][p]["id"] == second != view["tokens"][p]["id"]
    assert shown(page) == generated(branched)
    assert "branch:" in page.inner_text("#action-cost") and "positions read" in page.inner_text("#action-cost")

    page.click(f"#text [data-token][data-position='{p}']")
    page.get_by_role("button", name="step back to here").click()
    page.wait_for_function(f"document.querySelectorAll('#text [data-token]').length === {p - view['prompt_len']}")
    stepped = call(f"{url}/api/texts/{branched['id']}")[1]
    assert len(stepped["tokens"]) == p and shown(page) == generated(stepped)

    page.reload()
    page.wait_for_selector("body[data-ready]")
    assert text_id(page) == branched["id"] and shown(page) == generated(stepped)
    assert page.input_value("#prompt") == "ROMEO:"
    second = page.context.new_page()  # a second tab on the same address opens the same text
    second.goto(page.url)
    second.wait_for_selector("body[data-ready]")
    assert shown(second) == generated(stepped)


def test_the_first_token_reaches_the_page_before_the_last_is_computed(playground, page):
    n, released, blocked = 3, threading.Event(), []

    def hold_the_last(position: int) -> None:  # called before each token is computed
        if position == last[0]:
            blocked.append(position)
            released.wait(60)

    last = [None]
    playground.app.state.before_token = hold_the_last
    try:
        page.goto(playground.url)
        page.wait_for_selector("body[data-ready]")
        page.fill("#prompt", "JULIET:")
        page.fill("#n", str(n))
        last[0] = len(tokenizer.encode("JULIET:")) + n - 1
        page.get_by_role("button", name="Generate", exact=True).click()
        page.wait_for_selector(
            "#text [data-token]", state="attached", timeout=20000
        )  # while the last token waits for us
        assert page.locator(f"#text [data-position='{last[0]}']").count() == 0  # it cannot be computed yet
        released.set()
        page.wait_for_function(f"document.querySelectorAll('#text [data-token]').length === {n}")
        assert blocked == [last[0]]  # the hook did hold the last token back
    finally:
        released.set()
        playground.app.state.before_token = None


def test_a_store_error_is_one_line_on_the_page_and_the_server_lives_on(tmp_path, page, monkeypatch):
    pytest.importorskip("turbopuffer")
    from vecgpt.backends.turbopuffer.server import Running as Turbopuffer

    key = "tpuf-SECRET-KEY-5e1b7d"
    monkeypatch.setenv("TURBOPUFFER_API_KEY", key)
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    service = Turbopuffer(api_key=key)
    config = tmp_path / "tpuf.toml"
    config.write_text(
        f'backend = "turbopuffer"\n[store]\nbase_url = "{service.url}"\nprefix = "play-"\nmax_retries = 0\n'
    )
    server = Running(Settings(configs=[str(config)]))
    try:
        assert call(f"{server.url}/api/stores")[0] == 200
        service.stop()  # the store is gone from under the running server
        status, body = call(f"{server.url}/api/stores")
        assert status == 503 and body["error"].startswith("store error: ") and key not in body["error"]
        page.goto(server.url)
        page.wait_for_selector("body[data-ready]")
        shown = page.inner_text("#error")
        assert shown.startswith("store error: ") and "\n" not in shown and key not in page.content()
        assert [e for e in page.console_errors if "status of 503" not in e] == []  # the failed call, only
        page.console_errors.clear()
        assert call(f"{server.url}/api/attention-memory?heads=12&context=1024")[1]["full"] == 50_331_648
    finally:
        server.stop()
        service.stop()


def test_each_tokens_scores_are_counted_where_they_were_taken(playground, page):
    """The requests table shows each token's q.k products: from the store, every earlier position's key; from
    memory, each read position's own. A generated token at p read position p - 1 (the first: the whole prompt)."""
    from vecgpt import weights

    hp = weights.load("shakespeare").hparams
    view = generate(page, playground.url, "ROMEO:", 4)
    per_position, prompt_len = hp.n_layer * hp.n_head, view["prompt_len"]
    for p, _ in generated(view):
        read = range(prompt_len) if p == prompt_len else [p - 1]
        row = page.locator(f"#requests tr[data-requests-position='{p}']")
        assert int(row.get_attribute("data-scores-store")) == per_position * sum(read)
        assert int(row.get_attribute("data-scores-memory")) == per_position * len(read)
        assert row.locator("td").nth(5).inner_text() == f"{per_position * sum(read)} / {per_position * len(read)}"


def test_the_printed_address_takes_connections_before_uvicorn_runs():
    from procs import connected

    from vecgpt.playground.app import bound_socket

    connected(bound_socket("127.0.0.1", 0))
