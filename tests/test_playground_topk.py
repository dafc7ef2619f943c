"""Top-k attention in the playground: the route that begins a text again with attention_top_k = K (its tokens
those of a top-k Text generated directly, its counts following K, bad K refused in one line before any search),
and in a real browser the inspection's top-K marks and mass, and the "Top-k attention" box."""

from __future__ import annotations

import math

import pytest

from vecgpt import weights
from vecgpt.playground.server import Settings
from vecgpt.text import Text

from browser import Running, call, events
from conftest import tiny_params


def one_line(status: int, body: dict, code: int, words: str) -> None:
    assert status == code and words in body["error"] and "\n" not in body["error"], (status, body)


def started(url: str, n: int) -> dict:
    """A greedy text of n tokens on the server's first store."""
    status, view = call(f"{url}/api/texts", "POST", {"prompt": "ROMEO:", "temperature": 0, "top_k": 40, "seed": 3})
    assert status == 200, view
    assert events(f"{url}/api/texts/{view['id']}/generate?n={n}")[-1][0] == "done"
    return call(f"{url}/api/texts/{view['id']}")[1]


def direct(playground, view: dict, k: int, n: int) -> list[int]:
    """The tokens of a top-k Text started through the API with the view's settings, generated n tokens."""
    engine = playground.library.shelves[view["store"]].engine(view["model"])
    prompt, s = [t["id"] for t in view["tokens"][: view["prompt_len"]]], view["settings"]
    with Text.start(engine, prompt, s["temperature"], s["top_k"], s["seed"], attention_top_k=k) as text:
        text.generate(n)
        return text.tokens


def test_the_top_k_route_begins_the_text_again_with_k(playground):
    url, n, k = playground.url, 6, 2
    view = started(url, n)
    status, again = call(f"{url}/api/texts/{view['id']}/top-k", "POST", {"attention_top_k": k})
    assert status == 200, again
    assert again["id"] != view["id"] and again["tokens"] == view["tokens"][: view["prompt_len"]]
    assert again["settings"] == {**view["settings"], "attention_top_k": k}
    got = events(f"{url}/api/texts/{again['id']}/generate?n={n}")
    assert got[-1][0] == "done", got[-1]
    tokens = [d for kind, d in got if kind == "token"]
    assert [t["id"] for t in view["tokens"][: view["prompt_len"]]] + [t["id"] for t in tokens] == direct(
        playground, view, k, n
    )
    hp = playground.library.shelves[0].engine(view["model"]).hparams
    heads = hp.n_layer * hp.n_head
    for t in tokens[1:]:  # the token at p read the one at p - 1: its p - 1 earlier keys, K of them returned
        earlier = t["position"] - 1
        assert t["cost"]["scores"]["returned"] == heads * min(k, earlier)
        assert t["cost"]["scores"]["values"] == heads * (min(k, earlier) + 1)
    p = tokens[-1]["position"]  # the top-k text's own attention: q.k of the keys its searches returned, None else
    status, seen = call(f"{url}/api/texts/{again['id']}/attention/{p}")
    assert status == 200 and seen["attention_top_k"] == k, seen
    for r in seen["attention"]:
        returned = {j for j, x in enumerate(r["scores"]) if x is not None}
        assert len(returned) == k + 1 and p in returned
        assert {j for j, w in enumerate(r["weights"]) if w > 0} <= returned
    assert call(f"{url}/api/texts/{again['id']}", "DELETE")[0] == 200


@pytest.mark.parametrize(
    "k, words",
    [(0, "1 or more keys"), (256, "the context holds 256 positions"), ("x", "whole number"), (None, "is missing")],
)
def test_a_bad_k_is_one_line(playground, k, words):
    url = playground.url
    status, view = call(f"{url}/api/texts", "POST", {"prompt": "ROMEO:"})
    assert status == 200
    body, open_texts = {} if k is None else {"attention_top_k": k}, len(playground.library.texts)
    one_line(*call(f"{url}/api/texts/{view['id']}/top-k", "POST", body), 400, words)
    assert len(playground.library.texts) == open_texts  # no text started
    one_line(*call(f"{url}/api/texts/nosuchtext/top-k", "POST", {"attention_top_k": 1}), 404, "no text")
    assert call(f"{url}/api/texts/{view['id']}", "DELETE")[0] == 200


def test_on_a_model_in_l2_a_bad_k_is_refused_before_any_search_and_a_good_one_runs(tmp_path):
    hp = weights.HParams(n_layer=1, n_head=2, n_embd=16, n_ctx=32, n_vocab=300)
    model = weights.save(tmp_path / "model", hp, tiny_params(hp))
    config = tmp_path / "l2.toml"
    config.write_text(f'model = "{model}"\nmetric = "l2"\n[store]\npath = "{tmp_path / "faiss"}"\n')
    server = Running(Settings(configs=[str(config)]))
    try:
        status, view = call(f"{server.url}/api/texts", "POST", {"prompt": " the"})
        assert status == 200, view
        store, asked = server.library.shelves[0].store, []
        for method in ("search", "search_many", "write_text"):  # what a text's start or read would ask first
            setattr(store, method, lambda *a, method=method, **k: asked.append(method))
        one_line(
            *call(f"{server.url}/api/texts/{view['id']}/top-k", "POST", {"attention_top_k": 40}), 400, "at most 31"
        )
        assert asked == []
        del store.search, store.search_many, store.write_text  # l2 keys are padded to rank by q.k: K runs
        status, again = call(f"{server.url}/api/texts/{view['id']}/top-k", "POST", {"attention_top_k": 2})
        assert status == 200 and again["settings"]["attention_top_k"] == 2, again
    finally:
        server.stop()


# ----------------------------------------------------------------------------- the page


def test_marks_mass_and_the_top_k_box(playground, page):
    url, n = playground.url, 6
    view = started(url, n)
    page.goto(f"{url}/?text={view['id']}")
    page.wait_for_selector("body[data-ready]")
    p = view["prompt_len"] + 2
    page.click(f"#text [data-token][data-position='{p}']")
    page.wait_for_selector(f"body[data-kept='{p}:8']")
    for k in (3, 1):
        page.fill("#inspect-k", str(k))
        page.wait_for_selector(f"body[data-kept='{p}:{k}']")
        check_marks(page, p, k)

    for bad, words in (("256", "the context holds 256"), ("0", "1 or more keys")):
        page.fill("#topk-k", bad)
        page.click("#topk-run")
        page.wait_for_selector("body[data-topk='error']")
        line = page.inner_text("#topk-error")
        assert words in line and "\n" not in line
        assert [e for e in page.console_errors if "400 (Bad Request)" not in e] == []
        page.console_errors.clear()  # the browser logs the 400 it was answered
    page.fill("#topk-k", "1")
    page.click("#topk-run")
    page.wait_for_function("(document.body.dataset.topk || '').endsWith(':1')")
    topk_id = page.evaluate("document.body.dataset.topk").split(":")[0]
    want = direct(playground, view, 1, n)[view["prompt_len"] :]
    shown = page.eval_on_selector_all("#topk-text [data-token]", "els => els.map(e => +e.dataset.token)")
    assert shown == want == [t["id"] for t in call(f"{url}/api/texts/{topk_id}")[1]["tokens"][view["prompt_len"] :]]
    full = [t["id"] for t in view["tokens"][view["prompt_len"] :]]
    differ = [i for i, (a, b) in enumerate(zip(full, want)) if a != b]
    assert int(page.get_attribute("#topk-info", "data-differ")) == len(differ)
    marked = page.eval_on_selector_all("#topk-text .differs", "els => els.map(e => +e.dataset.position)")
    assert marked == [view["prompt_len"] + i for i in differ]
    if differ:
        first = page.get_attribute("#topk-text .first-diff", "data-position")
        assert int(first) == view["prompt_len"] + differ[0]
    rows = page.eval_on_selector_all("#topk-requests tr[data-returned]", "els => els.map(e => +e.dataset.returned)")
    assert len(rows) == n and all(r > 0 for r in rows[1:])

    page.goto(f"{url}/?text={topk_id}")  # the top-k text inspected: its own K marked, the keys its searches kept
    page.wait_for_selector("body[data-ready]")
    page.click(f"#text [data-token][data-position='{p}']")
    page.wait_for_selector(f"body[data-kept='{p}:1']")
    assert page.input_value("#inspect-k") == "1"
    check_marks(page, p, 1)


def check_marks(page, p: int, k: int) -> None:
    """Each head marks min(K, p) + 1 positions: p and its K best earlier by the q.k the page holds; the mass shown
    is the sum of the marked cells' weights."""
    attention = page.evaluate("inspected.a.attention")
    cells = page.eval_on_selector_all(
        "#heatmap .hm-cell",
        "els => els.map(e => [+e.dataset.layer, +e.dataset.head, +e.dataset.keyPosition, +e.dataset.weight,"
        " e.dataset.kept === '1'])",
    )
    mass = {
        (int(a), int(b)): float(m)
        for a, b, m in page.eval_on_selector_all(
            "#topk-mass td[data-mass-head]",
            "els => els.map(e => [e.dataset.massLayer, e.dataset.massHead, e.dataset.mass])",
        )
    }
    assert len(mass) == len(attention)
    for r in attention:
        mine = [(j, w, kept) for i, h, j, w, kept in cells if (i, h) == (r["layer"], r["head"])]
        kept = {j for j, _, on in mine if on}
        best = sorted(range(p), key=lambda j: -(r["scores"][j] if r["scores"][j] is not None else -math.inf))[:k]
        assert len(kept) == min(k, p) + 1 and kept == set(best) | {p}
        assert abs(mass[r["layer"], r["head"]] - sum(w for j, w, on in mine if on)) <= 1e-6
