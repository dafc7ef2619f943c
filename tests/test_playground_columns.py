"""The requests-per-token table in Chromium at 1280 px: every column on the screen (none clipped) with the numpy
check and a comparison shown; its cost columns filled again when the text is reopened (/?text=ID); and "Compare
with" listing every other store of the server with the text's model, or saying how to add one."""

from __future__ import annotations

import pytest
from test_playground import generate, text_id

from vecgpt import weights
from vecgpt.playground.server import Settings

from browser import IMAGES, Running, call
from conftest import tiny_params

COST_CELLS = (2, 3, 4, 5, 6)  # requests, subqueries, rounds, q.k store / memory, ms


@pytest.fixture(scope="module")
def two_stores(tmp_path_factory):
    """A server with two stores of one small model: a.toml (inner products) and b.toml (padded l2)."""
    folder = tmp_path_factory.mktemp("columns")
    hp = weights.HParams(n_layer=2, n_head=4, n_embd=64, n_ctx=64, n_vocab=512)
    model = weights.save(folder / "model", hp, tiny_params(hp))
    paths = []
    for name, metric in (("a", "ip"), ("b", "l2")):
        config = folder / f"{name}.toml"
        config.write_text(f'model = "{model}"\nmetric = "{metric}"\n[store]\npath = "{folder / name}"\n')
        paths.append(str(config))
    server = Running(Settings(configs=paths))
    yield server, paths
    server.stop()


def cost_cells(page) -> list[list[str]]:
    rows = page.locator("#requests tbody tr")
    return [[rows.nth(i).locator("td").nth(c).inner_text() for c in COST_CELLS] for i in range(rows.count())]


def inside(page, selector: str, box: str) -> None:
    """The element's right edge within its box's and the window's, and the box not scrolling sideways."""
    got = page.evaluate(
        """([sel, box]) => { const t = document.querySelector(sel), b = t.closest(box);
        return [t.getBoundingClientRect().right, b.getBoundingClientRect().right, b.scrollWidth, b.clientWidth,
                window.innerWidth, document.documentElement.scrollWidth]; }""",
        [selector, box],
    )
    right, box_right, scroll, client, window, page_width = got
    assert right <= box_right + 0.5 and scroll <= client and page_width <= window, got


def test_every_column_of_the_requests_table_is_on_a_1280_px_screen(two_stores, page):
    server, (a, b) = two_stores
    view = generate(page, server.url, " the", 8)
    page.click(f"#text [data-token][data-position='{view['prompt_len'] + 1}']")
    page.wait_for_selector("#candidates tr[data-candidate]")
    page.check("#check")
    page.wait_for_selector(f"body[data-checked='{view['id']}']")
    page.select_option("#compare-store", b)
    page.click("#compare")
    page.wait_for_selector(f"body[data-compared='{view['id']}']")
    for column in ("th.check", "th.compare", "th:nth-child(8)"):  # the last columns, and the waterfall
        assert page.locator(f"#requests {column}").is_visible(), column
    inside(page, "#requests", "div")
    inside(page, "#candidates", "div")
    # on turbopuffer a $ column too (as the page shows a token's dollars there)
    page.evaluate("() => { for (const c of Object.values(costs)) c.dollars = 0.00386; renderRequests(); }")
    assert page.locator("#requests th.dollars").is_visible()
    inside(page, "#requests", "div")
    page.screenshot(path=str(IMAGES / "playground-1280.png"), full_page=True)


def test_a_reopened_text_shows_each_tokens_cost(two_stores, page):
    server, _ = two_stores
    generate(page, server.url, " the", 4)
    streamed = cost_cells(page)
    assert len(streamed) == 4 and all(all(cell != "" for cell in row) for row in streamed), streamed
    page.goto(f"{server.url}/?text={text_id(page)}")
    page.wait_for_selector("body[data-ready]")
    assert cost_cells(page) == streamed
    p = int(page.locator("#requests tbody tr").nth(2).get_attribute("data-requests-position"))
    assert call(f"{server.url}/api/texts/{text_id(page)}/step-back", "POST", {"position": p})[0] == 200
    page.reload()
    page.wait_for_selector("body[data-ready]")
    assert cost_cells(page) == streamed[:2]  # a stepped-back token's cost goes with it


def options(page) -> list[tuple[str, str, bool]]:
    """(value, text, disabled) of each "Compare with" choice."""
    return page.eval_on_selector_all("#compare-store option", "os => os.map(o => [o.value, o.text, o.disabled])")


def test_compare_with_lists_the_other_stores_holding_the_model(two_stores, page):
    server, (a, b) = two_stores
    generate(page, server.url, " the", 2)
    got = options(page)
    assert [value for value, _, _ in got] == [b] and "holds the model" in got[0][1] and not got[0][2], got
    assert page.locator("#compare").is_enabled()
    page.select_option("#store", "1")  # a text on b: a is the store to compare with
    first = text_id(page)
    page.click("#generate")
    page.wait_for_function(f"!location.search.includes('{first}')")
    page.wait_for_selector("#generate:not([disabled])")
    assert [value for value, _, _ in options(page)] == [a] and page.locator("#compare").is_enabled()


def test_with_one_store_compare_says_how_to_add_another(playground, page):
    generate(page, playground.url, "ROMEO:", 1)
    assert options(page) == [] and page.locator("#compare").is_disabled()
    line = page.inner_text("#compare-info")
    assert "--config" in line and "docs/playground.md" in line, line
