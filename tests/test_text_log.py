"""Text collections in the memory, FAISS and LanceDB stores beyond the conformance suite: the in-process
stores' log (a chunk cut short, last writes on replay), large fetches, stats, payloads of model collections."""

import numpy as np
import pytest

from vecgpt.backends.base import Where
from vecgpt.errors import VecgptError

rng = np.random.default_rng(11)
DIM, WIDTH = 6, 3
OURS = ["memory", "faiss", "lancedb"]


def rows(n, start=0):
    ids = np.arange(start, start + n)
    return ids, rng.standard_normal((n, DIM)).astype(np.float32), rng.standard_normal((n, WIDTH)).astype(np.float32)


def written(store, name="text-t", n=10, start=0):
    ids, v, p = rows(n, start)
    store.create(name, DIM, "l2", ("position",), payload=WIDTH)
    store.upsert(name, ids, v, {"position": ids}, payload=p)
    return v, p


@pytest.mark.parametrize("backend", ["memory", "faiss"])
def test_a_chunk_cut_short_is_ignored_and_cut_off_by_the_next_write(make_store, backend):
    store = make_store(backend)
    v, p = written(store, n=4)
    v2, p2 = written(store, n=4, start=4)
    log = store.path / "texts" / "keys" / "text-t.log"
    whole = log.read_bytes()
    log.write_bytes(whole[:-5])  # the last chunk cut short, as a kill in the middle of its write leaves it
    again = make_store(backend)
    assert again.count("text-t") == 4
    v3, p3 = written(again, n=2, start=8)  # cuts the half chunk off, then appends
    got_v, got_p = make_store(backend).fetch("text-t", np.array([0, 3, 8, 9]), payload=True)
    assert np.array_equal(got_v, np.vstack([v[[0, 3]], v3])) and np.array_equal(got_p, np.vstack([p[[0, 3]], p3]))
    assert make_store(backend).count("text-t") == 6


@pytest.mark.parametrize("backend", OURS)
def test_a_fresh_connection_sees_the_last_write_of_each_id(make_store, backend):
    store = make_store(backend)
    written(store)
    v, p = written(store, n=3, start=8)  # ids 8, 9 again, and 10
    store.upsert("text-t", np.array([2, 2]), np.vstack([v[:1], v[1:2]]), {"position": [2, 2]}, payload=p[:2])
    got_v, got_p = make_store(backend).fetch("text-t", np.array([8, 9, 10, 2]), payload=True)
    assert np.array_equal(got_v, np.vstack([v, v[1:2]])) and np.array_equal(got_p, np.vstack([p, p[1:2]]))
    assert make_store(backend).count("text-t") == 11


@pytest.mark.parametrize("backend", OURS)
def test_a_large_fetch_keeps_the_order_asked_and_names_a_missing_id(make_store, backend):
    store = make_store(backend)
    v, p = written(store, n=3000)
    asked = rng.permutation(3000)[:2500]
    got_v, got_p = store.fetch("text-t", asked, payload=True)
    assert np.array_equal(got_v, v[asked]) and np.array_equal(got_p, p[asked])
    with pytest.raises(VecgptError, match="has no id 3001"):
        store.fetch("text-t", np.append(asked, [3001, 3002]), payload=True)
    assert store.fetch("text-t", np.zeros(0, np.int64), payload=True)[1].shape == (0, WIDTH)


@pytest.mark.parametrize("backend", OURS)
def test_text_collections_count_in_stats_and_go_with_drop(make_store, backend, tmp_path):
    store = make_store(backend)
    written(store, n=7)
    store.create("text-empty", DIM, "l2", ("position",), payload=WIDTH)
    assert make_store(backend).count("text-empty") == 0  # on disk from creation
    stats = store.stats()
    assert stats["text-t"]["documents"] == 7 and stats["text-t"]["bytes"] > 0
    if backend != "lancedb":  # Lance counts its files' bytes
        assert stats["text-t"]["bytes"] == 7 * (DIM + WIDTH) * 4
    with pytest.raises(VecgptError, match="payload"):
        store.create("text-t", DIM, "l2", ("position",), payload=WIDTH + 1)
    store.drop("text-t")
    fresh = make_store(backend)
    assert "text-t" not in fresh.collections() and "text-empty" in fresh.collections()
    assert not list(tmp_path.rglob("text-t.*"))  # nothing of it left on disk


@pytest.mark.parametrize("backend", ["memory", "faiss"])
def test_a_model_collection_keeps_its_payload_and_its_clone_when_saved(make_store, backend):
    store = make_store(backend)
    v, p = written(store, name="model", n=5)
    store.clone("model", "model-copy")
    store.close()
    again = make_store(backend)
    for name in ("model", "model-copy"):
        got_v, got_p = again.fetch(name, np.arange(5), payload=True)
        assert np.array_equal(got_v, v) and np.array_equal(got_p, p)
    hits = again.search("model-copy", v[:1], where=Where(lt={"position": 3}))
    assert sorted(hits.ids[0]) == [0, 1, 2]


@pytest.mark.parametrize("backend", OURS)
def test_clone_refuses_an_existing_destination(make_store, backend):
    store = make_store(backend)
    written(store)
    written(store, name="text-u")
    with pytest.raises(VecgptError, match="'text-u' exists"):
        store.clone("text-t", "text-u")
