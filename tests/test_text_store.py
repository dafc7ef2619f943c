"""Conformance for what a text needs of a store: payloads, durable text collections, clones, versioned records.

Every registered backend must pass these against its real library or server (see vecgpt/backends/base.py).
"""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from vecgpt.backends.base import Where
from vecgpt.errors import TextConflict, VecgptError

from conftest import store_options

rng = np.random.default_rng(7)
DIM, WIDTH = 8, 5


def keys(store, name="text-a", n=40):
    """A text-like collection: n rows tagged layer/head/position, each with a payload."""
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    payload = rng.standard_normal((n, WIDTH)).astype(np.float32)
    attrs = {"layer": np.arange(n) % 2, "head": (np.arange(n) // 2) % 2, "position": np.arange(n) // 4}
    store.create(name, DIM, "l2", ("layer", "head", "position"), payload=WIDTH)
    store.upsert(name, np.arange(n), vectors, attrs, payload=payload)
    return vectors, payload, attrs


def test_payload_round_trips_exactly_and_never_ranks(make_store, backend):
    store = make_store(backend)
    vectors, payload, _ = keys(store)
    got_v, got_p = store.fetch("text-a", np.array([3, 0, 17]), payload=True)
    assert np.array_equal(got_v, vectors[[3, 0, 17]]) and np.array_equal(got_p, payload[[3, 0, 17]])
    assert got_p.dtype == np.float32
    assert np.array_equal(store.fetch("text-a", np.array([5])), vectors[[5]])  # without payload: the vectors only
    store.upsert(
        "text-a", np.array([3]), vectors[[4]], {"layer": [1], "head": [0], "position": [9]}, payload=payload[[9]]
    )
    _, p = store.fetch("text-a", np.array([3]), payload=True)
    assert np.array_equal(p, payload[[9]])  # an upsert replaces the payload with the row
    hits = store.search("text-a", vectors[:1], where=Where(eq={"layer": 0}))
    assert hits.ids.shape[1] == 20  # distances come from the vectors alone: the query's own row is nearest
    assert hits.ids[0][np.argmin(hits.dists[0])] == 0


def test_payload_of_the_wrong_width_is_refused(make_store, backend):
    store = make_store(backend)
    keys(store)
    with pytest.raises(VecgptError, match="payload"):
        store.upsert("text-a", np.array([1]), np.zeros((1, DIM)), {}, payload=np.zeros((1, WIDTH + 1)))


def test_a_text_collection_survives_its_process_and_kill_9(make_store, backend, tmp_path):
    options = store_options(backend, tmp_path)
    script = textwrap.dedent(
        f"""
        import sys, time, numpy as np
        from vecgpt.backends.base import get_store
        store = get_store({backend!r}, **{options!r})
        store.create("text-k", 4, "l2", ("position",), payload=2)
        for p in range(3):
            store.upsert("text-k", np.array([p]), np.full((1, 4), p), {{"position": [p]}}, payload=np.full((1, 2), -p))
        print("written", flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=os.environ)
    try:
        assert child.stdout.readline().strip() == "written"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    store = make_store(backend)
    v, p = store.fetch("text-k", np.arange(3), payload=True)
    assert np.array_equal(v[:, 0], [0, 1, 2]) and np.array_equal(p[:, 0], [0, -1, -2])
    assert "text-k" in store.collections()


def test_clone_copies_every_row_inside_the_store(make_store, backend):
    store = make_store(backend)
    if not hasattr(store, "clone"):
        pytest.skip(f"{backend} has no clone")
    vectors, payload, attrs = keys(store)
    store.clone("text-a", "text-b")
    v, p = store.fetch("text-b", np.arange(40), payload=True)
    assert np.array_equal(v, vectors) and np.array_equal(p, payload)
    hits = store.search("text-b", vectors[:1], where=Where(eq={"layer": 1}, lt={"position": 5}))
    assert sorted(hits.ids[0]) == [i for i in range(40) if i % 2 == 1 and i // 4 < 5]
    store.upsert(
        "text-b", np.array([0]), vectors[[1]], {"layer": [0], "head": [0], "position": [0]}, payload=payload[[1]]
    )
    assert np.array_equal(store.fetch("text-a", np.array([0])), vectors[[0]])  # the source is untouched
    store.drop("text-b")
    assert np.array_equal(store.fetch("text-a", np.arange(40)), vectors)


def test_text_records_are_versioned_and_conditional(make_store, backend):
    store = make_store(backend)
    assert store.read_text("t1") is None
    assert store.write_text("t1", {"tokens": [1, 2]}, expect=None) == 1
    with pytest.raises(TextConflict):
        store.write_text("t1", {"tokens": [9]}, expect=None)  # it exists
    assert store.write_text("t1", {"tokens": [1, 2, 3]}, expect=1) == 2
    with pytest.raises(TextConflict):
        store.write_text("t1", {"tokens": [7]}, expect=1)  # another process moved it on
    assert store.read_text("t1") == {"tokens": [1, 2, 3], "version": 2}
    assert make_store(backend).read_text("t1")["tokens"] == [1, 2, 3]  # a second connection sees it
    store.write_text("t2", {"tokens": []}, expect=None)
    assert sorted(store.texts()) == ["t1", "t2"]
    with pytest.raises(TextConflict):
        store.write_text("t1", None, expect=1)
    store.write_text("t1", None, expect=2)
    assert store.read_text("t1") is None and store.texts() == ["t2"]


def test_a_text_is_open_in_one_process_at_a_time(make_store, backend):
    first, second = make_store(backend), make_store(backend)
    if not hasattr(first, "text_lock"):
        pytest.skip(f"{backend} checks versions only")
    with first.text_lock("t1"):
        with pytest.raises(VecgptError, match="open in another process"):
            with second.text_lock("t1"):
                pass
        with second.text_lock("t2"):  # another text is not held
            pass
    with second.text_lock("t1"):  # released
        pass
