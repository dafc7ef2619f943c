"""The metered store: every call through it counted by kind, one round trip unless sent together."""

import numpy as np

from vecgpt.backends.base import Search
from vecgpt.meter import Metered, later


def test_calls_are_rounds_and_together_is_one(make_store):
    store = Metered(make_store("memory"))
    store.create("h.0.mlp.c_fc", 3, "l2")
    store.upsert("h.0.mlp.c_fc", np.arange(2), np.eye(2, 3, dtype=np.float32))
    store.create("text-abc", 3, "l2", ("layer",))
    hits, rows = store.together(
        later.search("h.0.mlp.c_fc", np.ones((1, 3), np.float32)), later.fetch("h.0.mlp.c_fc", np.arange(2))
    )
    assert sorted(hits.ids[0].tolist()) == [0, 1] and rows.shape == (2, 3)
    store.search_many([Search("text-abc", np.ones((1, 3), np.float32))])
    counted = store.meter.summary()
    assert counted["by_kind"] == {"open": 1, "matrix": 4, "key_search": 1}
    # create and upsert of a matrix, the search with the fetch (one round), the session's create, its key search
    assert counted["round_trips_by_kind"] == {"open": 1, "matrix": 3, "key_search": 1}
    assert store.collections() == store.inner.collections()  # what is not counted passes through
