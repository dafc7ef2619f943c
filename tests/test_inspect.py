"""A clicked token's attention and logit lens (issue 41, items 1 and 2): Session.inspect reads a position again,
writing nothing; its weights are checked against reference.py's softmax of q.k / sqrt(hd) in float64, its lens
after the last layer against the text's own top candidate; then the JSON API and the page in Chromium."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from vecgpt import weights
from vecgpt.backends.base import get_store
from vecgpt.engine import Engine
from vecgpt.errors import VecgptError
from vecgpt.loading import push, store_fingerprint
from vecgpt.reference import Reference, layer_norm, linear, softmax
from vecgpt.text import Text

from browser import IMAGES, call, events

PROMPT = [15496, 995, 11, 318]  # "Hello world, is"


def reference_attention(model64, tokens: list[int], p: int) -> tuple[np.ndarray, np.ndarray]:
    """reference.py in float64 over tokens[:p + 1]: q.k of position p's query with each key up to it, [L, H, p + 1],
    and softmax(q.k / sqrt(hd)), as reference.attention weighs the values."""
    hp = model64.hparams
    hd, ref = hp.n_embd // hp.n_head, Reference(model64, np.float64)
    ref.trace = []
    ref.hidden(tokens[: p + 1])
    scores = np.empty((hp.n_layer, hp.n_head, p + 1))
    for layer, block in enumerate(model64.params["h"]):
        x = layer_norm(ref.trace[0][layer][p : p + 1], **block["ln_1"], eps=hp.eps)
        q, k = linear(x, **block["attn"]["c_attn"])[0, : hp.n_embd], ref.caches[layer]["k"]
        for h in range(hp.n_head):
            scores[layer, h] = k[:, h * hd : (h + 1) * hd] @ q[h * hd : (h + 1) * hd]
    return scores, softmax(scores / math.sqrt(hd))


def check_weights(model64, tokens, p, scores, got) -> None:
    """The store's q.k within 1e-4 of |q.k| + 1 of float64 numpy's (its rows are float32 and each layer's error
    feeds the next: observed below 1e-5); the weights then within what those score errors allow: logits each moved
    by at most delta move every softmax weight by a factor within exp(+-2 delta)."""
    want_scores, want = reference_attention(model64, tokens, p)
    scores, got = np.asarray(scores), np.asarray(got)
    assert got.shape == want.shape
    assert np.abs(scores - want_scores).max() <= 1e-4 * (np.abs(want_scores).max() + 1)
    hd = model64.hparams.n_embd // model64.hparams.n_head
    delta = np.abs(scores - want_scores).max(axis=-1, keepdims=True) / math.sqrt(hd)  # per head
    assert (np.abs(got - want) <= want * np.expm1(2 * delta) + 1e-15).all()
    assert np.abs(got.sum(axis=-1) - 1).max() <= 1e-12


@pytest.fixture(scope="module")
def memory_engines(tiny_model):
    """The tiny model on the memory store, in each layout."""
    out = {}
    for layout in ("four", "three", "five"):
        store = get_store("memory")
        push(store, tiny_model, "l2", progress=False, layout=layout)
        out[layout] = Engine(store, model=store_fingerprint(tiny_model, "l2", layout))
    return out


@pytest.mark.parametrize("layout", ["four", "three", "five"])
def test_inspect_is_what_the_text_computed(memory_engines, model64, layout):
    engine = memory_engines[layout]
    with Text.start(engine, PROMPT, temperature=0.8, seed=3) as text:
        text.generate(4)
        rows = engine.store.stats()[text.session.name]["documents"]
        for p in (1, len(PROMPT) - 1, len(PROMPT) + 1, len(text.tokens) - 1):  # the prompt, generated, the last
            found = text.inspect(p)
            assert (found.position, found.token) == (p, text.tokens[p])
            check_weights(model64, text.tokens, p, found.scores, found.weights)
            assert len(found.lens) == engine.hparams.n_layer and all(len(c.ids) == 5 for c in found.lens)
            assert text.cost["by_kind"]["token_search"] == engine.hparams.n_layer  # the lens: a search a layer
            assert "key_write" not in text.cost["by_kind"]  # nothing written
            nxt = text.candidates(p + 1)
            if nxt is not None and p >= len(PROMPT):  # read as a decode step the first time: the same bits
                assert (int(found.lens[-1].ids[0]), float(found.lens[-1].logits[0])) == tuple(nxt[0][:2])
        assert engine.store.stats()[text.session.name]["documents"] == rows
        again = Text.resume(engine, text.id)  # as another process finds it: the keys the store holds
        assert np.array_equal(again.inspect(len(PROMPT) + 1).weights, text.inspect(len(PROMPT) + 1).weights)
        text.generate(3)  # the text goes on as if never inspected
        with Text.start(engine, PROMPT, temperature=0.8, seed=3) as plain:
            plain.generate(7)
            assert plain.tokens == text.tokens
            assert all(plain.candidates(p) == text.candidates(p) for p in range(len(PROMPT), len(text.tokens)))


def test_inspect_on_every_backend(make_store, backend, tiny_model, model64):
    """The same on each store (a server's writes land behind its searches: an inspection waits for them)."""
    store = make_store.loaded(backend, tiny_model, "l2", "four")
    engine = Engine(store, model=store_fingerprint(tiny_model, "l2", "four"))
    with Text.start(engine, PROMPT, temperature=0.8, seed=3) as text:
        text.generate(3)
        for p in (len(PROMPT), len(text.tokens) - 1):
            found = text.inspect(p)
            check_weights(model64, text.tokens, p, found.scores, found.weights)
            assert "key_write" not in text.cost["by_kind"]
        assert int(text.inspect(len(PROMPT)).lens[-1].ids[0]) == text.candidates(len(PROMPT) + 1)[0][0]


def test_inspect_a_prompt_not_read_yet(memory_engines, model64):
    with Text.start(memory_engines["four"], PROMPT) as text:  # nothing read: the prompt is read first
        found = text.inspect(2)
        check_weights(model64, text.tokens, 2, found.scores, found.weights)
        assert text.cost["positions_read"] == len(PROMPT)


def test_inspect_refuses_positions_outside_the_text_and_closed_texts(memory_engines):
    engine = memory_engines["four"]
    text = Text.start(engine, PROMPT)
    text.generate(2)
    for p in (-1, len(text.tokens)):
        with pytest.raises(VecgptError, match="beyond the text"):
            text.inspect(p)
    text.close()
    with pytest.raises(VecgptError, match="closed"):
        text.inspect(1)


# ----------------------------------------------------------------------------- the JSON API, on FAISS


@pytest.fixture(scope="module")
def shipped64():
    return weights.load("shakespeare", dtype=np.float64)


def started(url: str, prompt: str = "ROMEO:", n: int = 6) -> dict:
    status, view = call(f"{url}/api/texts", "POST", {"prompt": prompt, "temperature": 0.8, "seed": 2})
    assert status == 200, view
    assert events(f"{url}/api/texts/{view['id']}/generate?n={n}")[-1][0] == "done"
    return call(f"{url}/api/texts/{view['id']}")[1]


def test_attention_api_against_numpy(playground, shipped64):
    url, hp = playground.url, shipped64.hparams
    view = started(url)
    tokens = [t["id"] for t in view["tokens"]]
    for p in (1, view["prompt_len"] + 2, len(tokens) - 1):
        status, got = call(f"{url}/api/texts/{view['id']}/attention/{p}")
        assert status == 200, got
        assert [r["position"] for r in got["keys"]] == list(range(p + 1)) and got["token"]["id"] == tokens[p]
        assert [(r["layer"], r["head"]) for r in got["attention"]] == [
            (i, h) for i in range(hp.n_layer) for h in range(hp.n_head)
        ]
        scores = np.array([r["scores"] for r in got["attention"]]).reshape(hp.n_layer, hp.n_head, -1)
        found = np.array([r["weights"] for r in got["attention"]]).reshape(hp.n_layer, hp.n_head, -1)
        check_weights(shipped64, tokens, p, scores, found)
        assert [r["layer"] for r in got["lens"]] == list(range(hp.n_layer)) and got["lens_searches"] == hp.n_layer
        assert got["cost"]["by_kind"]["token_search"] == hp.n_layer and "key_write" not in got["cost"]["by_kind"]
        if view["prompt_len"] <= p + 1 < len(tokens):  # the lens after the last layer: the text's own top candidate
            assert got["lens"][-1]["tokens"][0]["id"] == got["next"]["id"]
    one = call(f"{url}/api/texts/{view['id']}/attention/{p}?layer=1")[1]
    assert [r for r in got["attention"] if r["layer"] == 1] == one["attention"]
    lens = call(f"{url}/api/texts/{view['id']}/lens/{p}")[1]
    assert lens["attention"] == [] and lens["lens"] == got["lens"]


def one_line(status: int, body: dict, code: int, words: str) -> None:
    assert status == code and words in body["error"] and "\n" not in body["error"], (status, body)


def test_attention_api_refuses_bad_input(playground):
    url = playground.url
    view = started(url, n=2)
    at = f"{url}/api/texts/{view['id']}"
    one_line(*call(f"{at}/attention/{len(view['tokens'])}"), 400, "beyond the text")
    one_line(*call(f"{at}/attention/-1"), 400, "beyond the text")
    one_line(*call(f"{at}/attention/x"), 400, "whole number")
    one_line(*call(f"{at}/attention/1?layer=4"), 400, "layers are 0 to 3")
    one_line(*call(f"{at}/lens/1?layer=-1"), 400, "out of range")
    assert call(at, "DELETE")[0] == 200
    one_line(*call(f"{at}/attention/1"), 404, "no text")
    one_line(*call(f"{url}/api/texts/nosuchtext/lens/0"), 404, "no text")


# ----------------------------------------------------------------------------- the page


def open_text(page, url: str, view: dict) -> None:
    page.goto(f"{url}/?text={view['id']}")
    page.wait_for_selector("body[data-ready]")


def inspect_at(page, view: dict, p: int, timeout: float = 30000) -> None:
    """Click the generated token at p and wait until the page shows its inspection."""
    page.click(f"#text [data-token][data-position='{p}']")
    page.wait_for_selector(f"body[data-inspected='{view['id']}:{p}']", timeout=timeout)


def test_click_a_token_shows_its_attention_and_lens(playground, page):
    url = playground.url
    view = started(url)
    open_text(page, url, view)
    p = view["prompt_len"] + 2
    inspect_at(page, view, p)
    want = call(f"{url}/api/texts/{view['id']}/attention/{p}")[1]
    cells = page.eval_on_selector_all(
        "#heatmap .hm-cell",
        "els => els.map(e => [+e.dataset.layer, +e.dataset.head, +e.dataset.keyPosition, e.dataset.weight])",
    )
    assert [(i, h, j) for i, h, j, _ in cells] == [
        (r["layer"], r["head"], j) for r in want["attention"] for j in range(p + 1)
    ]
    assert [float(w) for *_, w in cells] == [w for r in want["attention"] for w in r["weights"]]  # the same doubles
    lens = page.eval_on_selector_all(
        "#lens tr[data-lens-layer]", "els => els.map(e => [+e.dataset.lensLayer, +e.dataset.lensTop])"
    )
    assert lens == [[r["layer"], r["tokens"][0]["id"]] for r in want["lens"]]
    assert f"{want['lens_searches']} token searches" in page.inner_text("#inspect-cost")
    assert page.locator("#attention-summary td[data-summary-layer]").count() == len(want["attention"])

    cell = page.locator(f"#heatmap .hm-cell[data-layer='1'][data-head='2'][data-key-position='{p - 1}']")
    cell.hover()
    row = next(r for r in want["attention"] if (r["layer"], r["head"]) == (1, 2))
    hover = page.inner_text("#inspect-hover")
    assert json.dumps(want["keys"][p - 1]["text"], ensure_ascii=False) in hover and cell.get_attribute("title") == hover
    shown_score, shown_weight = (float(re.search(rf"{w} (\S+)", hover)[1].rstrip(",")) for w in ("q.k", "weight"))
    assert shown_score == pytest.approx(row["scores"][p - 1], rel=1e-5)  # six digits
    assert shown_weight == pytest.approx(row["weights"][p - 1], rel=1e-5)
    page.locator("#inspect").screenshot(path=str(IMAGES / "inspect.png"))  # README's picture

    page.click("#text .prompt[data-position='0']")  # a prompt token too
    page.wait_for_selector(f"body[data-inspected='{view['id']}:0']")
    assert page.locator("#heatmap .hm-cell").count() == len(want["attention"])  # one key each


def test_a_long_text_stays_usable(playground, page):
    url = playground.url
    prompt = " the king" * 120  # 240 tokens of the shipped model's 256
    view = started(url, prompt=prompt, n=4)
    open_text(page, url, view)
    p = len(view["tokens"]) - 1
    inspect_at(page, view, p)
    assert page.locator("#heatmap.narrow").count() == 1
    box = page.locator("#heatmap-box").bounding_box()
    assert box["width"] <= 1280 and box["height"] <= 480  # the detail scrolls inside its box
    summary = page.locator("#attention-summary td[data-summary-layer='3'][data-summary-head='0']")
    assert len(summary.get_attribute("data-top").split(",")) == 3
    page.locator("#heatmap-layer").select_option("3")
    assert page.locator("#heatmap .hm-row:not(.hm-keys)").count() == 4  # layer 3's heads
    page.screenshot(path=str(IMAGES / "inspect-long.png"), full_page=True)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A server on a model of GPT-2 small's layers, heads and context (narrow vectors: quick), on FAISS."""
    from vecgpt.playground.server import Settings

    from browser import Running
    from conftest import tiny_params

    shape = weights.HParams(n_layer=12, n_head=12, n_embd=96, n_ctx=1024, n_vocab=50257)
    folder = tmp_path_factory.mktemp("wide")
    model = weights.save(folder / "model", shape, tiny_params(shape))
    config = folder / "wide.toml"
    config.write_text(f'model = "{model}"\n[store]\npath = "{folder / "faiss"}"\n')
    server = Running(Settings(configs=[str(config)], max_prompt_chars=8000))
    yield server
    server.stop()


def test_1024_positions_at_gpt2_small_shape(wide, page):
    view = started(wide.url, prompt=" the king" * 511, n=2)  # 1,022 prompt tokens and 2 drawn
    open_text(page, wide.url, view)
    p = len(view["tokens"]) - 1
    inspect_at(page, view, p, timeout=120000)
    assert page.locator("#attention-summary td[data-summary-layer]").count() == 144  # every head, summarized
    assert page.input_value("#heatmap-layer") == "0"  # the detail: one layer at a time
    assert page.locator("#heatmap .hm-cell").count() == 12 * 1024
    assert page.locator("#heatmap .hm-cell[data-layer='0'][data-head='11'][data-key-position='1023']").count() == 1
    page.locator("#heatmap-layer").select_option("11")
    assert page.locator("#heatmap .hm-cell[data-layer='11']").count() == 12 * 1024
    page.locator("#inspect").screenshot(path=str(IMAGES / "inspect-1024.png"))


def test_the_page_says_what_went_wrong(playground, page):
    url = playground.url
    view = started(url, n=2)
    open_text(page, url, view)
    assert call(f"{url}/api/texts/{view['id']}", "DELETE")[0] == 200
    page.click("#text [data-position='1']")
    page.wait_for_selector("body[data-inspected='error:1']")
    assert "no text" in page.inner_text("#inspect-error")
    page.console_errors.clear()  # the browser logs the 404 it was answered


def test_a_phone_scrolls_the_inspection_not_the_page(playground, browser):
    from browser import watch

    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    errors = watch(page)
    try:
        view = started(playground.url, n=3)
        open_text(page, playground.url, view)
        p = view["prompt_len"] + 1
        inspect_at(page, view, p)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.locator("#inspect").screenshot(path=str(IMAGES / "inspect-390.png"))
    finally:
        context.close()
    assert errors == []


def test_a_heads_label_walks_its_softmax_on_the_attention_page(playground, page):
    """From the attention view, a head's row label opens the streaming-attention page on that head's softmax inputs:
    its walk ends on the weights the text used."""
    from vecgpt.cli.attention import parse_scores, walk

    url = playground.url
    view = started(url)
    open_text(page, url, view)
    p = view["prompt_len"] + 1
    inspect_at(page, view, p)
    want = next(r for r in call(f"{url}/api/texts/{view['id']}/attention/{p}")[1]["attention"] if r["layer"] == 1)
    page.click(f"#heatmap a.hm-label:text-is('L1 H{want['head']}')")
    page.wait_for_selector("#walk tr[data-step='1']")
    walked = walk(parse_scores(page.input_value("#scores").split()), 1)
    assert page.url.endswith("#walk-it") and len(walked["weights"]) == p + 1
    for got, weight in zip(walked["weights"], want["weights"]):  # float64 both ways, summed in another order
        assert abs(got - weight) < 1e-12
