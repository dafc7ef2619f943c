"""The metered store: every call through it counted by kind, one round trip unless sent together."""

import threading
import time

import numpy as np
import pytest

from vecgpt.backends import base
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


def test_parallel_runs_calls_at_once_within_the_limit_nested_and_all_before_raising(monkeypatch):
    monkeypatch.setattr(base, "POOL_THREADS", 3)  # nested calls on pools this small would deadlock on one pool
    monkeypatch.setattr(base, "_pools", {})
    running, most, lock = [0], [0], threading.Lock()

    def call(i):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return i

    assert base.parallel([lambda i=i: call(i) for i in range(7)], workers=2) == list(range(7))
    assert most[0] == 2
    inner, out = [lambda: base.parallel([lambda j=j: j for j in range(4)]) for _ in range(5)], []
    nested = threading.Thread(target=lambda: out.append(base.parallel(inner)), daemon=True)
    nested.start()
    nested.join(10)
    assert out == [[[0, 1, 2, 3]] * 5]  # not stuck: outer calls wait for threads of another pool
    done = []
    with pytest.raises(ZeroDivisionError):
        base.parallel([lambda: 1 / 0, lambda: time.sleep(0.1) or done.append(1)])
    assert done == [1]  # the slow call finished before the failure was raised
    with base.tally() as counts:
        base.parallel([base.record, base.record])
    assert counts["requests"] == 2  # a pool's thread reports into the caller's tally
