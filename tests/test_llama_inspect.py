"""Looking inside a position of a Llama-family text (layouts five and four): each query head's q.k and softmax weights over
the keys of the key head it reads, and the logit lens through the final RMSNorm and the output matrix (wte tied,
lm_head untied), against reference_llama in float64; nothing is written and the text goes on as if never inspected."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vecgpt import families, weights
from vecgpt.engine import Engine
from vecgpt.loading import push
from vecgpt.reference_llama import LlamaReference, linear, rms_norm, rotate_heads, softmax

SHAPE = {"n_layer": 2, "n_head": 4, "n_embd": 32, "n_inner": 48, "n_ctx": 32, "n_vocab": 300}
SHAPES = {"tied, 2 key heads": dict(n_kv_head=2, tied=True), "untied, 1 key head": dict(n_kv_head=1)}
PROMPT = [5, 17, 200, 2, 41]


@pytest.fixture(scope="module", params=SHAPES.values(), ids=SHAPES.keys())
def model(request, tmp_path_factory):
    hp = families.LlamaHParams(**SHAPE, **request.param)
    return weights.make_llama_model(tmp_path_factory.mktemp("inspect") / "m", hp, seed=5, std=0.2)


def reference_inside(model64, tokens: list[int], p: int):
    """reference_llama in float64 over tokens[:p + 1]: position p's q.k with each key up to it [L, H, p + 1] (query
    head h against key head h // group's rotated keys), the weights softmax(q.k / sqrt(hd)), and the lens's logits
    norm(residual after layer l) @ output.T [L, n_vocab]."""
    hp = model64.hparams
    ref, hd = LlamaReference(model64, np.float64), hp.head_dim
    ref.trace = []
    ref.hidden(tokens[: p + 1])
    scores = np.empty((hp.n_layer, hp.n_head, p + 1))
    for layer, block in enumerate(ref.body["layers"]):
        x = rms_norm(ref.trace[0][layer][p : p + 1], **block["input_layernorm"], eps=hp.eps)
        q = rotate_heads(linear(x, **block["self_attn"]["q_proj"]), hp.n_head, np.array([float(p)]), ref.freq)[0]
        for h in range(hp.n_head):
            kv = families.key_head(h, hp.n_head, hp.n_kv_head)
            scores[layer, h] = ref.caches[layer]["k"][:, kv * hd : (kv + 1) * hd] @ q[h * hd : (h + 1) * hd]
    lens = np.stack(
        [linear(rms_norm(r[p : p + 1], **ref.body["norm"], eps=hp.eps), ref.output)[0] for r in ref.trace[0][1:]]
    )
    return scores, softmax(scores / math.sqrt(hd)), lens


def check(model64, tokens, p, found) -> None:
    """q.k within 1e-4 of |q.k| + 1 (float32 rows, each layer's error feeding the next), the weights within what
    those errors allow (each logit moved by at most delta moves a weight by a factor within exp(+-2 delta)); each
    lens token's logit within 1e-4 of numpy's, and the five numpy ranks highest (up to that tolerance)."""
    want_scores, want, lens = reference_inside(model64, tokens, p)
    assert found.scores.shape == want.shape
    tol = 1e-4 * (np.abs(want_scores).max() + 1)
    assert np.abs(found.scores - want_scores).max() <= tol
    delta = np.abs(found.scores - want_scores).max(axis=-1, keepdims=True) / math.sqrt(model64.hparams.head_dim)
    assert (np.abs(found.weights - want) <= want * np.expm1(2 * delta) + 1e-15).all()
    for layer, c in enumerate(found.lens):
        logits = lens[layer]
        lens_tol = 1e-4 * (np.abs(logits).max() + 1)
        assert np.abs(c.logits - logits[c.ids]).max() <= lens_tol
        assert c.logits.min() >= np.sort(logits)[-len(c.ids)] - 2 * lens_tol


@pytest.mark.parametrize("layout", ["five", "four"])
def test_inspect_a_llama_position_against_numpy(make_store, model, layout):
    m32, m64 = weights.load(str(model)), weights.load(str(model), dtype=np.float64)
    hp = m32.hparams
    store = make_store("memory")
    key = push(store, m32, "l2", progress=False, layout=layout)["fingerprint"]
    from vecgpt.text import Text

    engine = Engine(store, model=key)
    with Text.start(engine, PROMPT, temperature=0.8, seed=3) as text:
        text.generate(4)
        rows = store.stats()[text.session.name]["documents"]
        for p in (1, len(PROMPT) - 1, len(PROMPT) + 1, len(text.tokens) - 1):
            found = text.inspect(p)
            assert (found.position, found.token) == (p, text.tokens[p])
            assert found.key_heads == [h // (hp.n_head // hp.n_kv_head) for h in range(hp.n_head)]
            check(m64, text.tokens, p, found)
            assert text.cost["by_kind"]["token_search"] == hp.n_layer and "key_write" not in text.cost["by_kind"]
            nxt = text.candidates(p + 1)
            if nxt is not None and p >= len(PROMPT):  # read as a decode step the first time: the same bits
                assert (int(found.lens[-1].ids[0]), float(found.lens[-1].logits[0])) == tuple(nxt[0][:2])
        assert store.stats()[text.session.name]["documents"] == rows
        best = text.candidates(len(PROMPT))[0]  # no tokenizer.json, 300 tokens: a token reads as its id
        assert best[2] == f"<{best[0]}>" and text.tokenizer.eos is None
        text.generate(3)  # the text goes on as if never inspected
        with Text.start(engine, PROMPT, temperature=0.8, seed=3) as plain:
            plain.generate(7)
            assert plain.tokens == text.tokens
            assert all(plain.candidates(q) == text.candidates(q) for q in range(len(PROMPT), len(text.tokens)))
