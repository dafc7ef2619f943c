"""turbopuffer's estimate of a Llama-family token (`vecgpt load --dry-run`, cli.store.cost_estimate) against what the
engine sends: a random checkpoint with grouped-query attention, read on the local turbopuffer server, its usage tally
(billed bytes as the server reports them) over decode steps beside the estimate's line. With n_kv_head key heads a
position writes n_kv_head keys a layer (a write per key head namespace and copy), and a key search is a request per
key head (per copy it spreads over) carrying its group's query heads' subqueries."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from vecgpt import families, weights
from vecgpt.backends.turbopuffer.cost import dollars
from vecgpt.cli.store import cost_estimate
from vecgpt.config import Config
from vecgpt.engine import Engine
from vecgpt.loading import push

SHAPE = {"n_layer": 2, "n_embd": 64, "n_inner": 96, "n_ctx": 32, "n_vocab": 300}
CASES = {
    "4 / 2 heads, untied, one key copy": (dict(n_head=4, n_kv_head=2), 1),
    "4 / 2 heads, untied, two key copies": (dict(n_head=4, n_kv_head=2), 2),
    "4 / 1 heads, tied, two key copies": (dict(n_head=4, n_kv_head=1, tied=True), 2),
}
LINE = r"per generated token: (\d+) kNN subqueries .* in (\d+) requests, .* returned, (\d+) key writes \(([\d,]+) KB\): \$([\d.]+)"


def measured(store, engine, steps: int = 3) -> list[Counter]:
    """The store's usage tally over each of `steps` decode steps (after the first read), its writes landed."""
    s, out = engine.open(), []
    found = s.read([3], 40)
    s.drain()
    for _ in range(steps):
        before = Counter(store.usage)
        found = s.read([int(found.ids[0])], 40)
        s.drain()
        after = Counter(store.usage)
        after.subtract(before)
        out.append(after)
    s.close()
    return out


@pytest.mark.parametrize("layout", ["five", "four"])
@pytest.mark.parametrize("shape, key_replicas", CASES.values(), ids=CASES.keys())
def test_the_estimate_counts_what_a_gqa_token_sends(make_store, tmp_path, shape, key_replicas, layout):
    hp = families.LlamaHParams(**SHAPE, **shape)
    model = weights.load(str(weights.make_llama_model(tmp_path / "m", hp, seed=1)))
    store = make_store("turbopuffer", key_replicas=key_replicas)
    push(store, model, "l2", progress=False, layout=layout)
    config = Config(backend="turbopuffer", metric="l2", layout=layout, store={"key_replicas": key_replicas})
    said = re.search(LINE, cost_estimate(config, hp))
    subqueries, requests, writes, kb, per_token = (float(x.replace(",", "")) for x in said.groups())
    for used in measured(store, Engine(store)):
        assert (used["subqueries"], used["query_requests"]) == (subqueries, requests)
        assert used["write_requests"] == writes == hp.n_kv_head * key_replicas * 2  # two upserts a token
        assert round(used["billed_written"] / 1e3) == kb
        assert dollars(used) == pytest.approx(per_token, rel=0.03)  # returned bytes: estimated, position-dependent
