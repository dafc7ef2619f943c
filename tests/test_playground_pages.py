"""The pages as a person uses them, in Chromium: Ctrl+Enter, the progress while tokens arrive, the export
(the JSON `vecgpt texts show --json` prints), a 390 px wide screen, the attention page's linear scale, the
walk of a candidate's softmax, and bad input as a message on the page."""

from __future__ import annotations

import json
import re
import threading

import pytest
from test_playground import generate, text_id

from vecgpt import tokenizer
from vecgpt.cli import main
from vecgpt.cli.attention import parse_scores, walk

from browser import IMAGES, call, events, fresh_page

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def phone(browser):
    """A page on a phone's screen (browser.fresh_page's, at 390 px)."""
    yield from fresh_page(browser, viewport=PHONE, device_scale_factor=2, bypass_csp=True)


def test_ctrl_enter_generates_and_a_progress_bar_counts_the_tokens(playground, page):
    n, released = 4, threading.Event()
    last = len(tokenizer.encode("JULIET:")) + n - 1
    playground.app.state.before_token = lambda position: position == last and released.wait(60)
    try:
        page.goto(playground.url)
        page.wait_for_selector("body[data-ready]")
        assert page.input_value("#temperature") == "0.8" and page.input_value("#seed") != ""
        page.fill("#prompt", "JULIET:")
        page.fill("#n", str(n))
        page.fill("#seed", "1")
        page.focus("#prompt")
        page.keyboard.press("Control+Enter")
        page.wait_for_selector(f"body[data-generating='{n - 1}/{n}']")  # the last token is held back
        assert (
            page.is_visible("#progress") and page.inner_text("#progress-text") == f"generating: {n - 1} of {n} tokens"
        )
        assert page.get_attribute("#progress", "value") == str(n - 1) and page.is_disabled("#generate")
        assert page.locator("#text.busy").count() == 1
        released.set()
        page.wait_for_selector("#generate:not([disabled])")
        assert not page.is_visible("#progress") and page.locator("#text [data-token]").count() == n
        view = call(f"{playground.url}/api/texts/{text_id(page)}")[1]
        assert view["settings"]["temperature"] == 0.8 and view["settings"]["seed"] == int(page.input_value("#seed"))
        page.wait_for_function(
            f"document.querySelector('#status').dataset.spentRequests === '{view['spent']['requests']}'"
        )
        assert view["spent"]["positions_read"] == len(tokenizer.encode("JULIET:")) + n - 1 and "spent so far" in (
            page.inner_text("#status")
        )
    finally:
        released.set()
        playground.app.state.before_token = None


def test_export_downloads_what_texts_show_json_prints(playground, strict_page, capsys):
    page = strict_page  # under the pages' Content Security Policy: the download must work there
    page.goto(playground.url)
    page.wait_for_selector("body[data-ready]")
    page.fill("#n", "3")
    page.fill("#seed", "1")
    page.click("#generate")
    page.wait_for_selector("#text [data-token][data-position='5']")
    page.wait_for_selector("#generate:not([disabled])")
    with page.expect_download() as got:
        page.click("#export")
    download = got.value
    exported = json.loads(open(download.path()).read())
    assert download.suggested_filename == f"vecgpt-text-{text_id(page)}.json"
    capsys.readouterr()
    assert main(["texts", "--store", playground.settings.store, "show", text_id(page), "--json"]) == 0
    assert exported == json.loads(capsys.readouterr().out)
    assert len(exported["tokens"]) == 6 and len(exported["candidates"]) == 3 and exported["spent"]["requests"] > 0


def no_sideways_scroll(p) -> None:
    assert p.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


def test_both_pages_fit_a_390_px_screen(playground, phone):
    view = generate(phone, playground.url, "ROMEO:", 6)
    phone.click(f"#text [data-token][data-position='{view['prompt_len']}']")
    phone.wait_for_selector("#candidates tr[data-candidate]")
    no_sideways_scroll(phone)
    for control in ("#generate", "#continue", "#export", "#prompt", "#temperature", "#seed"):
        box = phone.locator(control).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], control
    phone.screenshot(path=str(IMAGES / "playground-390.png"))
    phone.goto(f"{playground.url}/attention")
    phone.wait_for_selector("body[data-ready]")
    phone.get_by_role("button", name="Walk it", exact=True).click()
    phone.get_by_role("button", name="All steps").click()
    phone.wait_for_selector("#walk-weights table")
    no_sideways_scroll(phone)


def bars(page) -> dict:
    """Each bar: (its width, its track's width, its bytes, the axis's bytes)."""
    out = {}
    for name in ("full", "stream", "weights"):
        bar = page.locator(f"#{name}-bar")
        track = page.locator(f"#{name}-bar").locator("xpath=..")
        out[name] = (
            bar.bounding_box()["width"],
            track.evaluate("t => t.clientWidth"),
            int(bar.get_attribute("data-bytes")),
            int(track.get_attribute("data-axis-bytes")),
        )
    return out


def test_memory_bars_are_on_a_labeled_linear_scale_beside_gpt2_small(playground, page):
    page.goto(f"{playground.url}/attention")
    widths = {}
    for context in (1024, 4096):
        page.fill("#context", str(context))
        page.wait_for_function(f"(document.body.dataset.memoryReady || '').startsWith('{context}:12:')")
        b = bars(page)
        for width, track, size, top in b.values():
            assert size <= top and abs(width - max(1, track * size / top)) <= 1.5  # linear, within a pixel or two
        assert b["weights"][2] == 4 * 124_439_808  # GPT-2 small in float32, 474.7 MiB
        ticks = page.locator("#axis span")
        labels = [ticks.nth(i).inner_text() for i in range(ticks.count())]
        steps = [float(ticks.nth(i).get_attribute("data-bytes")) for i in range(ticks.count())]
        assert labels[0] == "0" and all(re.fullmatch(r"[\d.]+ (KiB|MiB|GiB)", t) for t in labels[1:]), labels
        assert steps[-1] == b["full"][3] and len({round(b - a) for a, b in zip(steps, steps[1:])}) == 1
        widths[context] = b["full"][0] / b["full"][1] * b["full"][3]  # bytes the full bar draws
        assert "GPT-2 small" in page.inner_text("#chart")
    assert abs(widths[4096] / widths[1024] - 16) < 0.5  # four times the context: sixteen times the table


def test_a_candidates_softmax_is_walked_on_the_attention_page(playground, page):
    view = generate(page, playground.url, "ROMEO:", 2)
    p = view["prompt_len"]
    page.click(f"#text [data-token][data-position='{p}']")
    page.wait_for_selector("#walk-link")
    want = call(f"{playground.url}/api/texts/{view['id']}/candidates/{p}")[1]
    page.click("#walk-link")
    page.wait_for_selector("#walk tr[data-step='1']")
    assert page.url.endswith("#walk-it")
    scores = page.input_value("#scores").split()
    walked = walk(parse_scores(scores), 1)
    assert len(scores) == want["top_k"]
    for row, weight in zip(want["rows"], walked["weights"]):  # the page's probabilities, the streaming weights
        assert abs(row["probability"] - weight) < 1e-12


def test_an_operation_on_a_closed_text_is_a_message_on_the_page(playground, page):
    view = generate(page, playground.url, "ROMEO:", 2)
    page.click(f"#text [data-token][data-position='{view['prompt_len']}']")
    page.wait_for_selector("#step-back")
    assert call(f"{playground.url}/api/texts/{view['id']}", "DELETE")[0] == 200
    page.click("#step-back")
    page.wait_for_function("document.querySelector('#error').textContent !== ''")
    shown = page.inner_text("#error")
    assert f"no text {view['id']}" in shown and "\n" not in shown
    assert [e for e in page.console_errors if "status of 404" in e] and all(
        "status of 404" in e for e in page.console_errors
    )
    page.console_errors.clear()


def test_the_export_api_against_numpy_and_a_closed_text(playground):
    import numpy as np

    from vecgpt import api, weights
    from vecgpt.reference import Reference

    url = playground.url
    view = call(f"{url}/api/texts", "POST", {"prompt": "ROMEO:", "temperature": 0.8, "top_k": 40, "seed": 2})[1]
    assert [kind for kind, _ in events(f"{url}/api/texts/{view['id']}/generate?n=3")][-1] == "done"
    status, d = call(f"{url}/api/texts/{view['id']}/export")
    policy = dict.fromkeys(("attention_top_k", "attention_threshold", "attention_sinks", "attention_window"))
    assert status == 200 and d["settings"] == {"temperature": 0.8, "top_k": 40, "seed": 2, **policy}
    ids = [t["id"] for t in d["tokens"]]
    logits = Reference(weights.load("shakespeare", dtype=np.float64), np.float64).logits(ids[:-1])
    for c in d["candidates"]:
        rows, p = c["rows"], c["position"]
        assert max(abs(r["logit"] - logits[p - 1, r["id"]]) for r in rows) < 1e-4  # float32 store, float64 numpy
        want = api.probabilities(np.array([r["logit"] for r in rows]), 0.8, 40)
        assert np.abs(np.array([r["probability"] for r in rows]) - want).max() < 1e-12
        assert [r["id"] for r in rows if r["chosen"]] == [ids[p]]
    assert call(f"{url}/api/texts/{view['id']}", "DELETE")[0] == 200
    for path in (f"{view['id']}/export", "nosuchtext0/export"):
        status, body = call(f"{url}/api/texts/{path}")
        assert status == 404 and "no text" in body["error"] and "\n" not in body["error"]


def test_stop_ends_a_generation_on_the_server_too(playground, page):
    n, released, seen = 40, threading.Event(), []
    second = len(tokenizer.encode("JULIET:")) + 1

    def hold(position: int) -> None:
        seen.append(position)
        if position == second:
            released.wait(60)

    playground.app.state.before_token = hold
    try:
        page.goto(playground.url)
        page.wait_for_selector("body[data-ready]")
        page.fill("#prompt", "JULIET:")
        page.fill("#n", str(n))
        page.fill("#seed", "1")
        page.click("#generate")
        page.wait_for_selector(f"body[data-generating='1/{n}']")  # the second token is held back
        page.click("#stop")
        page.wait_for_selector("#generate:not([disabled])")
        assert not page.is_visible("#progress")
        released.set()
        page.wait_for_timeout(1500)  # the server sees the stream closed at its next event, then stops
        drawn = len(seen)
        page.wait_for_timeout(1000)
        assert len(seen) == drawn < n  # it stopped: no token drawn in the last second, far fewer than n
    finally:
        released.set()
        playground.app.state.before_token = None
