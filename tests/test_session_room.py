"""A text's kept values and key norms take room as it reaches further (Session.reserve: 64 positions, then doubled,
at most the context), and what it computes does not depend on where the room grew."""

from __future__ import annotations

import numpy as np

from tests.conftest import tiny_params
from vecgpt import tolerance, weights
from vecgpt.api import generate
from vecgpt.engine import Engine
from vecgpt.loading import push
from vecgpt.reference import Reference

LONG = weights.HParams(n_layer=1, n_head=2, n_embd=32, n_ctx=160, n_vocab=50257)
PROMPT = [464, 2068, 7586, 21831, 18045]


def test_a_text_past_its_first_room_reads_as_numpy_and_as_restored(make_store, tmp_path):
    folder = weights.save(tmp_path / "long", LONG, tiny_params(LONG, seed=3))
    model, model64 = weights.load(str(folder)), weights.load(str(folder), dtype=np.float64)
    store = make_store("memory")
    push(store, model, "ip", progress=False)
    engine = Engine(store)
    greedy = generate(Reference(model64, np.float64), PROMPT, 150, stop=False).tokens
    text = engine.open()
    assert text.key_norms.shape[2] == 64  # a new text's room: its first 64 positions
    r = tolerance.forced_comparison(text, model64, PROMPT, greedy, "ip", tolerance.unit_roundoff("memory"))
    assert not r["violations"], r["violations"][:5]
    n = text.position
    assert n == len(PROMPT) + 149 and text.key_norms.shape[2] == 160  # grew 64 -> 128 -> the context
    again = engine.session(text.name, create=False)
    again.restore(text.tokens[:n])
    assert again.key_norms.shape[2] >= n
    assert np.array_equal(again.projected[:, :, :n], text.projected[:, :, :n])
    assert np.array_equal(again.key_norms[:, :, :n], text.key_norms[:, :, :n])
