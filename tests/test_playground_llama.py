"""A Llama-family model in the playground: a random checkpoint with grouped-query attention (4 query heads sharing 2
key heads) and its own tokenizer.json (300 tokens) opens on FAISS, generates, checks against numpy, and a clicked
token shows each query head's attention with the key head it reads and the logit lens."""

from __future__ import annotations

import numpy as np
import pytest
from test_llama_tokenizer import train

from vecgpt import families, tokenizer, weights
from vecgpt.playground.server import Settings

from browser import Running, call, events

HP = families.LlamaHParams(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, n_inner=48, n_ctx=48, n_vocab=300, tied=True)
PROMPT = "ROMEO: O soft light"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-playground")
    model = weights.make_llama_model(folder / "model", HP, seed=2, std=0.2)
    train(model / "tokenizer.json")
    config = folder / "llama.toml"
    config.write_text(f'model = "{model}"\n[store]\npath = "{folder / "faiss"}"\n')
    server = Running(Settings(configs=[str(config)], rate_per_s=1000.0, burst=10000.0))
    yield server, tokenizer.FileTokenizer(model / "tokenizer.json")
    server.stop()


@pytest.fixture(scope="module")
def text(served):
    url = served[0].url
    status, view = call(f"{url}/api/texts", "POST", {"prompt": PROMPT, "temperature": 0.8, "seed": 1})
    assert status == 200, view
    assert events(f"{url}/api/texts/{view['id']}/generate?n=4")[-1][0] == "done"
    return call(f"{url}/api/texts/{view['id']}")[1]


def test_a_llama_text_is_read_with_its_own_tokenizer(served, text):
    server, own = served
    ids = [t["id"] for t in text["tokens"]]
    assert ids[: text["prompt_len"]] == own.encode(PROMPT) and len(ids) == text["prompt_len"] + 4
    assert [t["text"] for t in text["tokens"]] == [own.decode([i]) for i in ids]
    assert text["text"] == own.decode(ids[text["prompt_len"] :])
    status, check = call(f"{server.url}/api/texts/{text['id']}/check")
    assert status == 200, check


def test_inspect_shows_each_query_heads_key_head(served, text):
    url, p = served[0].url, text["prompt_len"] + 1
    status, got = call(f"{url}/api/texts/{text['id']}/attention/{p}")
    assert status == 200, got
    assert (got["n_layer"], got["n_head"], got["key_heads"]) == (HP.n_layer, HP.n_head, [0, 0, 1, 1])
    assert got["scale"] == pytest.approx(1 / np.sqrt(HP.head_dim))
    weights_ = np.array([r["weights"] for r in got["attention"]])
    assert weights_.shape == (HP.n_layer * HP.n_head, p + 1) and np.allclose(weights_.sum(axis=1), 1, atol=1e-12)
    assert len(got["lens"]) == HP.n_layer and got["lens"][-1]["tokens"][0]["id"] == got["next"]["id"]


def test_the_page_inspects_a_llama_token(served, text, page):
    url, p = served[0].url, text["prompt_len"] + 1
    page.goto(f"{url}/?text={text['id']}")
    page.wait_for_selector("body[data-ready]")
    page.click(f"#text [data-token][data-position='{p}']")
    page.wait_for_selector(f"body[data-inspected='{text['id']}:{p}']")
    labels = page.eval_on_selector_all("#heatmap .hm-label", "els => els.map(e => e.textContent)")
    assert [x for x in labels if x][:4] == ["L0 H0/K0", "L0 H1/K0", "L0 H2/K1", "L0 H3/K1"]
    assert page.locator("#heatmap .hm-cell").count() == HP.n_layer * HP.n_head * (p + 1)
    assert "head 2 (key head 1)" in page.inner_text("#attention-summary")
