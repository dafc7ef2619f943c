"""Attention policies in the playground: POST /api/texts/{id}/policy begins a text again under K or a threshold beta
between S sinks and a window of W (its tokens those of a Text started directly with that policy), each field
checked for its JSON type and the policy by the engine, in one line before any search; in a real browser the
"Attention policy" box regenerates with a threshold and with sinks and a window, and the inspection of the policy's
text marks exactly the keys its searches kept, each as a sink, the window or chosen between."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_playground_topk import one_line, started

from vecgpt import weights
from vecgpt.playground.server import Settings
from vecgpt.policy import SETTINGS, Policy
from vecgpt.text import Text

from browser import IMAGES, Running, call, events
from conftest import tiny_params

POLICIES = {  # the route's body; a field left out is unset
    "K": {"attention_top_k": 2},
    "beta": {"attention_threshold": 1.0},
    "sinks+window": {"attention_sinks": 2, "attention_window": 3},
    "K+sinks+window": {"attention_top_k": 1, "attention_sinks": 1, "attention_window": 2},
    "beta+sinks+window": {"attention_threshold": 0.5, "attention_sinks": 1, "attention_window": 2},
}


def as_policy(body: dict) -> Policy:
    return Policy(*(body.get(name) for name in SETTINGS))


def direct(playground, view: dict, policy: Policy, n: int) -> list[int]:
    """The tokens of a Text started through the API with the view's settings and `policy`, generated n tokens."""
    engine = playground.library.shelves[view["store"]].engine(view["model"])
    prompt, s = [t["id"] for t in view["tokens"][: view["prompt_len"]]], view["settings"]
    with Text.start(engine, prompt, s["temperature"], s["top_k"], s["seed"], policy=policy) as text:
        text.generate(n)
        return text.tokens


def kept_keys(policy: Policy, p: int, scores: list) -> dict[int, str]:
    """The keys the policy's text kept for a query at p (those with a q.k), each as the page names why."""
    a, b = policy.middle(p)
    return {j: "own" if j == p else "sink" if j < a else "window" if j >= b else "between" for j, x in
            enumerate(scores) if x is not None}  # fmt: skip


def check_kept(policy: Policy, p: int, r: dict, scale: float) -> None:
    """A head's kept keys are what the policy keeps of the q.k it kept (sinks and window whole, K or beta between),
    and the keys it dropped hold no weight."""
    kept, (a, b) = kept_keys(policy, p, r["scores"]), policy.middle(p)
    assert {j for j, why in kept.items() if why != "between"} == set(range(a)) | set(range(b, p + 1))
    between = [r["scores"][j] * scale for j, why in kept.items() if why == "between"]
    if policy.top_k is not None:
        assert len(between) == min(policy.top_k, b - a)
    elif policy.threshold is not None and b > a:
        assert between and max(between) - min(between) <= policy.threshold + 1e-5
    else:
        assert between == []
    assert all(w == 0 for j, w in enumerate(r["weights"]) if j not in kept)


@pytest.mark.parametrize("name", list(POLICIES))
def test_the_policy_route_gives_the_tokens_of_a_text_started_with_that_policy(playground, name):
    url, n, body = playground.url, 6, POLICIES[name]
    view, policy = started(url, n), as_policy(body)
    status, again = call(f"{url}/api/texts/{view['id']}/policy", "POST", body)
    assert status == 200, again
    assert again["id"] != view["id"] and again["tokens"] == view["tokens"][: view["prompt_len"]]
    assert again["settings"] == {**view["settings"], **dict(zip(SETTINGS, policy))}
    got = events(f"{url}/api/texts/{again['id']}/generate?n={n}")
    assert got[-1][0] == "done", got[-1]
    tokens = [d for kind, d in got if kind == "token"]
    assert [t["id"] for t in view["tokens"][: view["prompt_len"]]] + [t["id"] for t in tokens] == direct(
        playground, view, policy, n
    )
    last = tokens[-1]["cost"]  # the text's searches so far: keys kept per head, and under beta the bound
    assert len(last["kept_per_head"]) == playground.library.shelves[0].engine(view["model"]).hparams.n_head
    assert ("dropped_bound" in last) == (policy.threshold is not None)
    p = tokens[-1]["position"]
    status, seen = call(f"{url}/api/texts/{again['id']}/attention/{p}")
    assert status == 200 and seen["policy"] == dict(zip(SETTINGS, policy)), seen
    for r in seen["attention"]:
        check_kept(policy, p, r, seen["scale"])
    assert call(f"{url}/api/texts/{again['id']}", "DELETE")[0] == 200
    assert call(f"{url}/api/texts/{view['id']}", "DELETE")[0] == 200


@pytest.mark.parametrize(
    "body, words",
    [
        ({"attention_top_k": "2"}, "attention_top_k must be a whole number, not the string '2'"),
        ({"attention_top_k": 2.5}, "attention_top_k must be a whole number, not the number 2.5"),
        ({"attention_threshold": "x"}, "attention_threshold must be a finite number, not the string 'x'"),
        ({"attention_threshold": True}, "attention_threshold must be a finite number, not true"),
        ({"attention_sinks": [1]}, "attention_sinks must be a whole number, not an array"),
        ({"attention_window": {"a": 1}}, "attention_window must be a whole number, not an object"),
        ({"attention_window": 1.5}, "attention_window must be a whole number, not the number 1.5"),
        ({"attention_top_k": 2, "attention_threshold": 1}, "give attention_top_k or attention_threshold, not both"),
        ({"attention_threshold": -1}, "attention_threshold must be a finite number 0 or more"),
        ({"attention_top_k": 0}, "attention_top_k must be 1 or more keys"),
        ({"attention_sinks": 256}, "attention_sinks must be a number of positions from 0 to 255"),
        ({"attention_window": -1}, "attention_window must be a number of positions from 0 to 255"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(playground, body, words):
    url = playground.url
    status, view = call(f"{url}/api/texts", "POST", {"prompt": "ROMEO:"})
    assert status == 200
    open_texts = len(playground.library.texts)
    one_line(*call(f"{url}/api/texts/{view['id']}/policy", "POST", body), 400, words)
    assert len(playground.library.texts) == open_texts  # no text started
    assert call(f"{url}/api/texts/{view['id']}", "DELETE")[0] == 200


def test_a_policy_the_engine_refuses_is_one_line_before_any_search(tmp_path):
    """An HNSW key index serves top-k only: a threshold is refused as the engine words it, before any search or
    write; top-k, sinks and a window run, and /top-k stays a shorthand for K."""
    hp = weights.HParams(n_layer=1, n_head=2, n_embd=16, n_ctx=32, n_vocab=300)
    model = weights.save(tmp_path / "model", hp, tiny_params(hp))
    config = tmp_path / "hnsw.toml"
    config.write_text(
        f'model = "{model}"\nmetric = "ip"\nattention_top_k = 2\nattention_index = "hnsw"\n'
        f'[store]\npath = "{tmp_path / "faiss"}"\n'
    )
    server = Running(Settings(configs=[str(config)]))
    try:
        status, view = call(f"{server.url}/api/texts", "POST", {"prompt": " the"})
        assert status == 200, view
        url = f"{server.url}/api/texts/{view['id']}"
        store, asked = server.library.shelves[0].store, []
        for method in ("search", "search_many", "write_text"):  # what a text's start or read would ask first
            setattr(store, method, lambda *a, method=method, **k: asked.append(method))
        one_line(*call(f"{url}/policy", "POST", {"attention_threshold": 1}), 400, "attention_index serves")
        assert asked == []
        del store.search, store.search_many, store.write_text
        body = {"attention_top_k": 1, "attention_sinks": 1, "attention_window": 2}
        status, again = call(f"{url}/policy", "POST", body)
        assert status == 200 and all(again["settings"][k] == v for k, v in body.items()), again
        status, short = call(f"{url}/top-k", "POST", {"attention_top_k": 3})
        assert status == 200 and short["settings"]["attention_top_k"] == 3, short
    finally:
        server.stop()


# ----------------------------------------------------------------------------- the page


def run_box(page, fields: dict) -> str:
    """Fill the box (a field not given: empty), regenerate, wait for the end; the policy text's id."""
    for name, sel in (("K", "#topk-k"), ("beta", "#topk-beta"), ("S", "#topk-sinks"), ("W", "#topk-window")):
        page.fill(sel, str(fields.get(name, "")))
    label = ",".join(str(fields.get(k, "")) for k in ("K", "beta", "S", "W")).rstrip(",")
    page.click("#topk-run")
    page.wait_for_function(f"(document.body.dataset.topk || '').endsWith(':{label}')")
    return page.evaluate("document.body.dataset.topk").split(":")[0]


def marked(page) -> dict[tuple[int, int], dict[int, str]]:
    """Each head's marked cells: key position -> why (sink, window, own, between)."""
    out: dict = {}
    for layer, head, j, why in page.eval_on_selector_all(
        "#heatmap .hm-cell[data-kept='1']",
        "els => els.map(e => [+e.dataset.layer, +e.dataset.head, +e.dataset.keyPosition, e.dataset.keptAs])",
    ):
        out.setdefault((layer, head), {})[j] = why
    return out


def test_the_policy_box_and_the_kept_keys_inspected(playground, page):
    url, n = playground.url, 6
    view = started(url, n)
    page.goto(f"{url}/?text={view['id']}")
    page.wait_for_selector("body[data-ready]")
    page.fill("#topk-beta", "1")  # with K still 8: refused in one line
    page.click("#topk-run")
    page.wait_for_selector("body[data-topk='error']")
    assert page.inner_text("#topk-error").startswith("give attention_top_k or attention_threshold, not both")
    assert [e for e in page.console_errors if "400 (Bad Request)" not in e] == []
    page.console_errors.clear()

    p = view["prompt_len"] + 4  # the full-attention text: what beta = 1 would keep, its weight within the bound
    page.click(f"#text [data-token][data-position='{p}']")
    page.wait_for_selector(f"body[data-kept='{p}:8']")
    page.fill("#inspect-k", "")
    page.fill("#inspect-beta", "1")
    page.wait_for_selector(f"body[data-kept='{p}:,1']")
    a, marks = page.evaluate("inspected.a"), marked(page)
    cells = page.eval_on_selector_all(
        "#topk-mass td[data-bound]", "els => els.map(e => [+e.dataset.massLayer, +e.dataset.massHead, +e.dataset.mass,"
        " +e.dataset.bound])"
    )  # fmt: skip
    for layer, head, mass, bound in cells:
        r = next(r for r in a["attention"] if (r["layer"], r["head"]) == (layer, head))
        keep = Policy(threshold=1.0).kept(np.array(r["scores"][:p]) * a["scale"])
        assert set(marks[layer, head]) == {j for j in range(p) if keep[j]} | {p}
        assert 1 - mass <= bound + 1e-9  # the weight dropped is within the reported worst case
    assert len(cells) == len(a["attention"])

    for fields in ({"beta": 1}, {"S": 2, "W": 3}):
        body = {"attention_threshold": fields.get("beta"), "attention_sinks": fields.get("S")}
        policy = as_policy({**body, "attention_window": fields.get("W")})
        policy_id = run_box(page, fields)
        want = direct(playground, view, policy, n)[view["prompt_len"] :]
        shown = page.eval_on_selector_all("#topk-text [data-token]", "els => els.map(e => +e.dataset.token)")
        assert shown == want
        assert page.inner_text("#topk-title") == (
            "policy β = 1" if policy.threshold is not None else "policy S = 2, W = 3"
        )
        assert ("dropped keys held at most" in page.inner_text("#topk-info")) == (policy.threshold is not None)
        page.click(f"#topk-text [data-position='{p}']")
        label = ",".join("" if v is None else str(v) for v in policy).rstrip(",")
        page.wait_for_selector(f"body[data-inspected='{policy_id}:{p}'][data-kept='{p}:{label}']")
        seen = call(f"{url}/api/texts/{policy_id}/attention/{p}")[1]  # the text's own inspection, through the API
        marks = marked(page)
        assert len(marks) == len(seen["attention"])
        for r in seen["attention"]:
            assert marks[r["layer"], r["head"]] == kept_keys(policy, p, r["scores"])
            check_kept(policy, p, r, seen["scale"])
        masses = page.eval_on_selector_all("#topk-mass td[data-mass-head]", "els => els.map(e => +e.dataset.mass)")
        assert all(abs(m - 1) <= 1e-6 for m in masses)  # a key left out has weight 0
        bounds = page.eval_on_selector_all("#topk-mass td[data-bound]", "els => els.map(e => +e.dataset.bound)")
        assert bool(bounds) == (policy.threshold is not None) and all(0 <= b < 1 for b in bounds)
        if policy.threshold is not None:
            bound = float(page.get_attribute("#kept-note", "data-dropped-bound"))
            assert math.isclose(bound, seen["cost"]["dropped_bound"]) and max(bounds) <= bound + 1e-9
            page.screenshot(path=str(IMAGES / "playground-policy.png"), full_page=True)

    page.click("#generate")  # a new text: the box's text is closed, and its inspection with it
    page.wait_for_selector("#inspect:empty", state="attached")
    page.wait_for_selector("body:not([data-generating])", state="attached")
