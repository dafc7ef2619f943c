"""Side by side: a text's tokens read again on another store or encoding (GET /api/texts/ID/compare?store=LABEL)
and on the page, one server holding the shipped model in two FAISS folders, inner products and padded L2, and a
third folder holding another model, which a comparison loads the text's model into."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from vecgpt import weights
from vecgpt.backends.base import get_store
from vecgpt.loading import push
from vecgpt.playground.server import Settings
from vecgpt.reference import Reference
from vecgpt.text import remove

from browser import Running, call, events
from conftest import tiny_params

# Both stores hold float32 documents and rank by float32 distances; numpy's float64 logits differ from either by
# under 1e-4 on the shipped model (test_the_export_api_against_numpy...), so from each other by under 2e-4.
TOLERANCE = 2e-4


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server with three stores: configs ip.toml and l2.toml, each a FAISS folder of its own, and other.toml,
    whose folder holds a small random model only (so the server loads nothing there)."""
    folder = tmp_path_factory.mktemp("compare")
    hp = weights.HParams(n_layer=1, n_head=2, n_embd=16, n_ctx=16, n_vocab=64)
    store = get_store("faiss", path=str(folder / "other"))
    push(store, weights.load(str(weights.save(folder / "small", hp, tiny_params(hp)))), "l2", progress=False)
    store.close()
    paths = []
    for name, metric in (("ip", "ip"), ("l2", "l2"), ("other", "l2")):
        config = folder / f"{name}.toml"
        config.write_text(f'backend = "faiss"\nmetric = "{metric}"\n[store]\npath = "{folder / name}"\n')
        paths.append(str(config))
    server = Running(Settings(configs=paths))
    yield server, paths
    server.stop()


def started(url: str, store: int, n: int, **settings) -> dict:
    body = {"store": store, "prompt": "ROMEO:", "temperature": 0.0, "top_k": 20, "seed": 0, **settings}
    status, view = call(f"{url}/api/texts", "POST", body)
    assert status == 200, view
    assert [kind for kind, _ in events(f"{url}/api/texts/{view['id']}/generate?n={n}")][-1] == "done"
    return call(f"{url}/api/texts/{view['id']}/export")[1]


def apart(mine: list[dict], theirs: list[dict]) -> tuple[float, bool]:
    """(max |logit difference| over the ids both have, whether the ids differ in order or set)."""
    a, b = {r["id"]: r["logit"] for r in mine}, {r["id"]: r["logit"] for r in theirs}
    return max(abs(a[i] - b[i]) for i in a.keys() & b.keys()), [r["id"] for r in mine] != [r["id"] for r in theirs]


def test_compare_equals_the_two_stores_texts_candidates_and_numpy(served):
    (server, (ip, l2, _)), n = served, 6
    url = server.url
    first = started(url, 0, n)
    status, r = call(f"{url}/api/texts/{first['id']}/compare?store={l2}")
    assert status == 200, r
    assert (r["this"]["label"], r["this"]["metric"], r["other"]["label"], r["other"]["metric"]) == (ip, "ip", l2, "l2")
    assert r["other"]["layout"] == r["this"]["layout"] and r["cost"]["total"] > 0 and r["cost"]["round_trips"] > 0
    assert r["cost"]["positions_read"] == len(first["tokens"]) - 1
    assert [p["position"] for p in r["positions"]] == [c["position"] for c in first["candidates"]]
    assert len(r["positions"]) == n
    # the same prompt, greedy, on the l2 store: its own text's candidates, teacher-forced only if it drew the same
    second = started(url, 1, n)
    shared = 0
    for got, mine, theirs in zip(r["positions"], first["candidates"], second["candidates"]):
        if first["tokens"][: got["position"]] != second["tokens"][: got["position"]]:
            break
        diff, order = apart(mine["rows"], theirs["rows"])
        assert abs(got["max_abs_diff"] - diff) < 1e-12 and got["order_differs"] == order, (got, diff, order)
        shared += 1
    assert shared >= 1  # the first generated position reads the prompt alone: always comparable
    ids = [t["id"] for t in first["tokens"]]
    logits = Reference(weights.load("shakespeare", dtype=np.float64), np.float64).logits(ids[:-1])
    for got, mine in zip(r["positions"], first["candidates"]):
        assert 0 < got["max_abs_diff"] < TOLERANCE, got
        assert max(abs(x["logit"] - logits[got["position"] - 1, x["id"]]) for x in mine["rows"]) < TOLERANCE / 2


def test_the_same_store_and_encoding_differs_by_nothing(served):
    (server, (ip, *_)) = served
    url = server.url
    text = started(url, 0, 4, temperature=0.8, seed=3)
    status, r = call(f"{url}/api/texts/{text['id']}/compare?store={ip}")
    assert status == 200 and len(r["positions"]) == 4, r
    assert all(p["max_abs_diff"] == 0.0 and p["order_differs"] is False and p["shared"] == 20 for p in r["positions"])


def test_bad_input_is_a_one_line_4xx(served):
    (server, (ip, *_)) = served
    url = server.url
    text = started(url, 0, 2)
    for query, code, words in (("store=nosuch.toml", 404, "no store 'nosuch.toml'"), ("", 400, "?store=LABEL")):
        status, body = call(f"{url}/api/texts/{text['id']}/compare?{query}")
        assert status == code and words in body["error"] and "\n" not in body["error"], body
    assert call(f"{url}/api/texts/{text['id']}", "DELETE")[0] == 200
    status, body = call(f"{url}/api/texts/{text['id']}/compare?store={ip}")
    assert status == 404 and f"no text {text['id']}" in body["error"] and "\n" not in body["error"], body
    text = started(url, 0, 2)
    shelf = server.library.shelves[0]
    with shelf.lock:
        remove(shelf.store, text["id"])  # closed by another process: this one still holds it
    status, body = call(f"{url}/api/texts/{text['id']}/compare?store={ip}")
    assert status == 404 and f"text {text['id']} is closed" in body["error"] and "\n" not in body["error"], body


def held(url: str, store: int) -> list[str]:
    return [m["key"] for m in call(f"{url}/api/stores")[1]["stores"][store]["models"]]


def test_a_store_without_the_text_model_gets_it_loaded(served):
    (server, (_, _, other)), n = served, 3
    url = server.url
    assert len(held(url, 2)) == 1
    text = started(url, 0, n)
    status, r = call(f"{url}/api/texts/{text['id']}/compare?store={other}")
    assert status == 200 and len(r["positions"]) == n, r
    assert r["other"]["metric"] == "l2" and r["other"]["model"] in held(url, 2) and len(held(url, 2)) == 2
    assert all(p["max_abs_diff"] < TOLERANCE for p in r["positions"]), r["positions"]


def test_the_page_compares_each_generated_token(served, page):
    (server, (ip, l2, _)), n = served, 5
    page.goto(server.url)
    page.wait_for_selector("body[data-ready]")
    assert page.locator("#compare").is_disabled()
    page.fill("#prompt", "ROMEO:")
    page.fill("#n", str(n))
    page.fill("#seed", "1")
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_function(f"document.querySelectorAll('#text [data-token]').length === {n}")
    page.wait_for_selector("#generate:not([disabled])")
    page.select_option("#compare-store", l2)
    page.click("#compare")
    page.wait_for_selector("body[data-compared]")
    rows = page.locator("#requests tbody tr")
    assert rows.count() == n
    for i in range(n):
        row = rows.nth(i)
        diff = float(row.get_attribute("data-compare-diff"))
        assert 0 < diff < TOLERANCE and row.get_attribute("data-compare-order") in ("same", "differs")
        cell = row.locator("td").last.inner_text()
        assert cell.startswith(f"{diff:.2e}".replace("e-0", "e-")), (cell, diff)
    info = page.inner_text("#compare-info")
    assert f"{ip} (ip," in info and f"{l2} (l2," in info and "requests" in info
    text = parse_qs(urlparse(page.url).query)["text"][0]
    assert call(f"{server.url}/api/texts/{text}", "DELETE")[0] == 200
    page.click("#compare")
    page.wait_for_function("document.querySelector('#error').textContent !== ''")
    assert f"no text {text}" in page.inner_text("#error") and "\n" not in page.inner_text("#error")
    assert page.console_errors and all("status of 404" in e for e in page.console_errors), page.console_errors
    page.console_errors.clear()
