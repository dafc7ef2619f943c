"""Every q.k product with an earlier position's key comes from a store search: the meter's counts on every store and
layout, and a key row altered in the store moves the logits of the next position read."""

from __future__ import annotations

import numpy as np
import pytest

from vecgpt import tokenizer
from vecgpt.api import generate
from vecgpt.engine import Engine
from vecgpt.loading import store_fingerprint

LAYOUTS = ("four", "three", "five")
PROMPT = "To be or not to be, that is"


def opened(make_store, backend: str, model, layout: str) -> Engine:
    store = make_store.loaded(backend, model, "l2", layout)
    return Engine(store, model=store_fingerprint(model, "l2", layout))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_earlier_key_is_scored_by_a_search(make_store, tiny_model, backend, layout):
    """Under the rule: memory = layers x heads x positions read (each its own key), store = layers x heads x the sum
    of each read position's index (every earlier position), per token and over the call; each key search returns every
    key below its last query for each query, and attention reads a value for each score."""
    hp, ids = tiny_model.hparams, tokenizer.encode(PROMPT)
    with opened(make_store, backend, tiny_model, layout).open() as text:
        generate(text, ids, 4, stop=False)
        summary = text.meter.summary()
    per_head = hp.n_layer * hp.n_head
    reads = [range(len(ids))] + [[len(ids) + i] for i in range(3)]
    for tally, positions in zip(summary["per_token"], reads, strict=True):
        store, memory = per_head * sum(positions), per_head * len(positions)
        returned = per_head * len(positions) * (positions[-1] if len(positions) > 1 else positions[0])
        assert tally["scores"] == {"store": store, "memory": memory, "returned": returned, "values": store + memory}
    everything = [p for positions in reads for p in positions]
    store, memory = per_head * sum(everything), per_head * len(everything)
    assert summary["scores"]["store"] == store and summary["scores"]["memory"] == memory
    assert summary["scores"]["values"] == store + memory


def altered(store, session, layer: int, head: int, position: int) -> None:
    """That key row as the store holds it, its vector changed (its attributes and payload kept)."""
    rid = session.key_ids(np.array([layer]), np.array([head]), np.array([position]))
    vectors, payload = store.fetch(session.name, rid, payload=True)
    where = {"layer": np.array([layer]), "head": np.array([head]), "position": np.array([position])}
    store.upsert(session.name, rid, vectors * 3 + 0.5, where, payload)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", ["memory", "faiss"])
def test_a_key_row_altered_in_the_store_moves_the_next_logits(make_store, tiny_model, backend, layout):
    """Two texts read the same prompt; in one, the store's row of the latest position's key (layer 0, head 0) is
    changed. The next token's logits move in that text only: its query took that score from the store."""
    engine, ids = opened(make_store, backend, tiny_model, layout), tokenizer.encode(PROMPT)
    with engine.open() as changed, engine.open() as kept:
        changed.read(ids), kept.read(ids)
        changed.drain()
        altered(engine.store, changed, 0, 0, len(ids) - 1)
        moved = changed.read(ids[:1], 40).logits - kept.read(ids[:1], 40).logits
        again = changed.read(ids[:1], 40).logits - kept.read(ids[:1], 40).logits
    assert np.abs(moved).max() > 1e-3 and np.abs(again).max() > 1e-3
