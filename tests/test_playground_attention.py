"""The streaming-attention page in a real browser: its figures are `vecgpt attention-memory`'s and
`vecgpt softmax-walk`'s (the same functions, through the JSON API)."""

from __future__ import annotations

import pytest

from vecgpt.cli.attention import memory_rows, parse_scores, walk

from browser import IMAGES, call


def test_memory_endpoint_is_the_cli_function(playground):
    status, got = call(f"{playground.url}/api/attention-memory?heads=12&context=1024&tile=8&dtype=float32")
    assert status == 200
    want = memory_rows(12, [1024], 64, None, 8, "float32")[0]
    assert {k: got[k] for k in ("full", "streaming", "tile_scores", "n_query")} == {
        k: want[k] for k in ("full", "streaming", "tile_scores", "n_query")
    }
    assert got["full"] == 50_331_648


@pytest.mark.parametrize(
    "query, message",
    [
        ("heads=0", "heads must be between 1"),
        ("context=131073", "context must be between 1"),
        ("heads=x", "heads must"),
    ],
)
def test_memory_endpoint_refuses_out_of_range(playground, query, message):
    status, got = call(f"{playground.url}/api/attention-memory?{query}")
    assert status == 400 and message in got["error"] and "\n" not in got["error"]


def test_calculator_and_walk_in_the_browser(playground, page):
    page.goto(f"{playground.url}/attention")
    page.fill("#heads", "12")
    page.fill("#context", "1024")
    page.select_option("#dtype", "float32")
    page.wait_for_function("document.body.dataset.memoryReady === '1024:12:50331648'")
    assert page.inner_text("#full-bytes") == "50,331,648"
    want = memory_rows(12, [1024], 64, None, int(page.input_value("#tile")), "float32")[0]
    assert page.inner_text("#stream-bytes") == f"{want['streaming']:,}"
    assert float(page.input_value("#context-slider")) == 10  # log2 of the context
    page.fill("#context", "131072")
    page.wait_for_function("document.body.dataset.memoryReady.startsWith('131072:')")
    page.fill("#context", "1024")
    page.wait_for_function("document.body.dataset.memoryReady === '1024:12:50331648'")

    scores = page.input_value("#scores")
    page.fill("#walk-tile", "1")
    page.get_by_role("button", name="Walk it", exact=True).click()
    expected = walk(parse_scores(scores.split()), 1)["steps"]
    for step in range(1, 4):
        page.click("#walk-step")
        row = page.locator(f"#walk tr[data-step='{step}']")
        got = {
            f: row.locator(f"td[data-field='{f}']").get_attribute("data-value")
            for f in ("running-max", "rescale", "running-total")
        }
        want = expected[step - 1]
        assert float(got["running-max"]) == want["running_max"]  # the same float64, sent as JSON and back
        assert float(got["running-total"]) == want["running_total"]
        assert (got["rescale"] == "") == (want["rescale"] is None)
        if want["rescale"] is not None:
            assert float(got["rescale"]) == want["rescale"]
    assert page.locator("#walk tbody tr").count() == 3
    page.screenshot(path=str(IMAGES / "attention.png"))


def test_a_late_answer_does_not_replace_the_answer_to_a_later_change(playground, page):
    page.goto(f"{playground.url}/attention")
    page.wait_for_function("document.body.dataset.memoryReady !== undefined")
    page.evaluate(  # the page's next question is answered a second late, as a busy server may
        """() => { const ask = call; let asked = 0;
            window.call = async (...args) => { const mine = ++asked; const answer = await ask(...args);
                if (mine === 1) await new Promise((done) => setTimeout(done, 1000));
                return answer; }; }"""
    )
    page.fill("#context", "2048")
    page.fill("#context", "4096")
    page.wait_for_function("document.body.dataset.memoryReady.startsWith('4096:')")
    page.wait_for_timeout(1500)  # the first answer is back by now
    assert page.evaluate("document.body.dataset.memoryReady").startswith("4096:")
    assert "4,096 positions" in page.inner_text("#memory-note")
