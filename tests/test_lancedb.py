"""What the LanceDB backend adds to the conformance suite: distance conversion and precision,
idempotent loads, bounded table versions under many small writes, exact prefiltered search even
where a vector index exists, a model's tables searched through an index of one partition, exactly, and
compaction racing searches from other threads."""

import threading

import numpy as np
import pytest

pytest.importorskip("lancedb")

from lancedb.index import IvfFlat  # noqa: E402

from vecgpt import weights  # noqa: E402
from vecgpt.backends.base import Search, Where  # noqa: E402
from vecgpt.backends.lancedb.table import FLAT_INDEX  # noqa: E402
from vecgpt.engine import Engine  # noqa: E402
from vecgpt.loading import (
    collection,  # noqa: E402
    push,  # noqa: E402
)

rng = np.random.default_rng(3)
EPS32 = float(np.finfo(np.float32).eps)


def keys(store, name="text-k", n=600, dim=16, metric="l2"):
    x = rng.standard_normal((n, dim)).astype(np.float32)
    store.create(name, dim, metric, attrs=("layer", "head", "position"))
    attrs = {"layer": np.arange(n) % 3, "head": (np.arange(n) // 3) % 4, "position": np.arange(n) // 12}
    store.upsert(name, np.arange(n), x, attrs)
    return x, attrs


def fragments(store, name):
    return store.stats()[name]["fragments"]


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_distances_are_float64_and_as_precise_as_float32_allows(make_store, metric):
    store = make_store("lancedb")
    x = (rng.standard_normal((500, 770)) * 2).astype(np.float32)
    store.create("m", 770, metric)
    store.upsert("m", np.arange(500), x)
    q = (rng.standard_normal((4, 770)) * 2).astype(np.float32)
    hits = store.search("m", q)
    assert hits.dists.dtype == np.float64
    q64, x64 = q.astype(np.float64), x.astype(np.float64)
    truth = ((q64[:, None] - x64[None]) ** 2).sum(-1) if metric == "l2" else -(q64 @ x64.T)  # squared L2; -x.y
    got = np.take_along_axis(hits.dists, np.argsort(hits.ids, 1), 1)
    # float32 arithmetic: an error of a few ulps of the terms' size, (|q|^2 + |x|^2) or (1 + |q||x|)
    qn, xn = np.linalg.norm(q64, axis=1)[:, None], np.linalg.norm(x64, axis=1)[None]
    scale = qn**2 + xn**2 if metric == "l2" else 1 + qn * xn
    assert np.all(np.abs(got - truth) <= 8 * EPS32 * scale)
    if metric == "ip":  # LanceDB's dot is 1 - x.y; off by one would be far outside the tolerance
        assert np.all(np.abs(got - truth) < 0.01)


def test_reload_is_idempotent(make_store, tmp_path):
    hp = weights.HParams(n_layer=1, n_head=2, n_embd=16, n_ctx=16, n_vocab=300)
    model = weights.load(str(weights.make_model(tmp_path / "model", hp)))
    store = make_store("lancedb")
    manifest = push(store, model, "l2", progress=False)
    before = store.stats()
    assert push(store, model, "l2", progress=False) == manifest
    assert store.stats() == before  # nothing rewritten, not even a new version
    assert all(s["fragments"] <= 1 for s in before.values())  # the load ends compacted
    again = make_store("lancedb")  # a second connection, as a second `vecgpt load` would open
    assert push(again, model, "l2", progress=False) == manifest
    # writing the same rows again replaces them: no duplicates
    wpe = collection(manifest["fingerprint"], "wpe")
    again.upsert(wpe, np.arange(16), model.params["wpe"]["weight"], {"row": np.arange(16)})
    assert again.count(wpe) == 16
    np.testing.assert_array_equal(again.fetch(wpe, np.array([3, 0])), model.params["wpe"]["weight"][[3, 0]])
    text = Engine(again).open()
    assert len(text.read([1, 2, 3]).ids) == 40


def test_versions_and_fragments_stay_bounded_under_small_writes(make_store):
    store = make_store("lancedb", compact_every=12, index_rows=100)
    never = make_store("lancedb", compact_every=0, path=str(store.path) + "-never")
    for s in (store, never):
        s.create("text-k", 8, "l2", attrs=("layer", "head", "position"))
    x = rng.standard_normal((60 * 12, 8)).astype(np.float32)
    for pos in range(60):  # like one layer's keys per token: 12 heads at one position
        rows = np.arange(pos * 12, pos * 12 + 12)
        for s in (store, never):
            s.upsert(
                "text-k", rows, x[rows], {"layer": np.zeros(12), "head": np.arange(12), "position": np.full(12, pos)}
            )
    assert fragments(never, "text-k") == 60  # one fragment a write, left alone
    assert fragments(store, "text-k") <= 12
    table = store._table("text-k").handle
    assert len(table.list_versions()) <= 13  # old versions are removed at each compaction
    assert {"layer", "head"} <= {c for i in table.list_indices() for c in i.columns}
    where = Where(eq={"layer": 0, "head": 5}, lt={"position": 40})
    hits = store.search("text-k", x[:2], where=where)
    assert sorted(hits.ids[0].tolist()) == [p * 12 + 5 for p in range(40)]
    truth = ((x[:1, None].astype(np.float64) - x[None, hits.ids[0]]) ** 2).sum(-1)[0]
    np.testing.assert_allclose(hits.dists[0], truth, rtol=1e-5, atol=1e-5)


def test_prefiltered_search_is_exact_with_a_vector_index_present(make_store):
    store = make_store("lancedb")
    x, attrs = keys(store, "c", n=1000, dim=16)
    handle = store._table("c").handle
    handle.create_index("vector", config=IvfFlat(distance_type="l2", num_partitions=16))
    q = rng.standard_normal((3, 16)).astype(np.float32)
    truth = ((q[:, None].astype(np.float64) - x[None].astype(np.float64)) ** 2).sum(-1)
    where = Where(eq={"layer": 1}, ge={"position": 10})
    keep = np.flatnonzero(where.mask(attrs, 1000))
    # the index is there and, used, would lose rows: probing one partition of 16 sees a few
    ann = (
        handle.search(q[0], vector_column_name="vector")
        .nprobes(1)
        .where("layer = 1 AND position >= 10", prefilter=True)
    )
    assert len(ann.limit(1000).to_arrow()) < len(keep)
    everything = store.search("c", q, where=where)  # an ANN index would return a few partitions' rows
    assert everything.ids.shape == (3, len(keep))
    assert all(set(row.tolist()) == set(keep.tolist()) for row in everything.ids)
    top = store.search("c", q, k=5, where=where)
    for row in range(3):
        assert top.ids[row].tolist() == keep[np.argsort(truth[row, keep])[:5]].tolist()


def test_compaction_does_not_break_searches_from_other_threads(make_store):
    store = make_store("lancedb", compact_every=3)
    x, _ = keys(store, n=240, dim=16)
    errors = []

    def searcher():
        try:
            for _ in range(25):
                hits = store.search("text-k", x[:1], where=Where(eq={"layer": 1}))
                assert hits.ids.shape[1] >= 80
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=searcher) for _ in range(3)]
    for t in threads:
        t.start()
    for pos in range(20, 50):
        store.upsert(
            "text-k",
            np.arange(pos * 12, pos * 12 + 12),
            rng.standard_normal((12, 16)).astype(np.float32),
            {"layer": np.arange(12) % 3, "head": np.arange(12) % 4, "position": np.full(12, pos)},
        )
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert store.count("text-k") == 600


def test_searches_run_on_each_threads_own_loop_and_from_inside_a_loop_and_a_forked_child(make_store):
    """A search runs on an event loop of the calling thread's own (closed when the thread ends), on LanceDB's loop
    from a thread already running one, and in a forked child, which leaves its parent's loop working."""
    import asyncio
    import gc
    import multiprocessing

    from vecgpt.backends.lancedb import table as lance_table

    store = make_store("lancedb")
    failed: list[BaseException] = []

    def caller() -> None:  # a thread of the test's own: the main thread may be running another library's loop
        try:  # (the browser tests' Playwright keeps one there), and the test is about a thread that runs none
            searches(store)
        except BaseException as e:
            failed.append(e)

    def searches(store) -> None:
        x, _ = keys(store, n=120)
        q = x[:2]
        want = store.search("text-k", q, k=5)
        got, loops = [], []

        def in_a_thread():
            got.append(store.search("text-k", q, k=5))
            loops.append(lance_table._loops.own.loop)

        async def inside_a_loop():
            return store.search("text-k", q, k=5)

        thread = threading.Thread(target=in_a_thread)
        thread.start()
        thread.join()
        del thread
        gc.collect()
        assert loops[0].is_closed() and loops[0] is not lance_table._loops.own.loop
        got.append(asyncio.run(inside_a_loop()))

        def fork_between_searches():  # in a thread, so a hang fails the test instead of stopping it
            got.append(store.search("text-k", q, k=5))  # this thread's own loop, which the child inherits
            child = multiprocessing.get_context("fork").Process(
                target=store.search, args=("text-k", q), kwargs={"k": 5}
            )
            child.start()
            child.join(60)
            got.append(child.exitcode)
            # had the child closed its copy of the loop, it would have taken the wake-up from their shared epoll
            got.append(store.search("text-k", q, k=5))

        forking = threading.Thread(target=fork_between_searches, daemon=True)
        forking.start()
        forking.join(120)
        assert not forking.is_alive(), "a search after a forked child's hung"
        assert got.pop(-2) == 0  # the child's search
        for hits in got:
            assert hits.ids.tolist() == want.ids.tolist() and np.array_equal(hits.dists, want.dists)

    thread = threading.Thread(target=caller, daemon=True)
    thread.start()
    thread.join(300)
    assert not thread.is_alive() and not failed, failed


def test_a_query_cut_short_by_ctrl_c_leaves_nothing_for_asyncio_to_print(make_store, caplog):
    """A KeyboardInterrupt raised inside one of a round's gathered searches comes out of the call, asyncio logs no
    task whose failure was never taken (it printed a traceback under `vecgpt: interrupted`), and the thread's loop
    goes on answering."""
    import asyncio
    import gc

    from vecgpt.backends.lancedb import search as lance_search
    from vecgpt.backends.lancedb import table as lance_table

    store = make_store("lancedb")
    x, _ = keys(store, n=120)
    want = store.search("text-k", x[:1], k=3)

    async def interrupted():
        await asyncio.sleep(0)
        raise KeyboardInterrupt

    async def slow():
        await asyncio.sleep(10)

    raised, got = [], []

    def in_a_thread():  # whose loop is closed when it ends, as a process's are when it exits
        try:
            lance_table.on_this_thread(lance_search.gather(slow(), interrupted()))
        except KeyboardInterrupt:
            raised.append(True)
        try:  # what the cut query left must not wake up in the next one
            got.append(store.search("text-k", x[:1], k=3))
        except BaseException as e:  # noqa: BLE001
            got.append(e)

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join(60)
    del thread
    gc.collect()
    assert raised and not isinstance(got[0], BaseException), got
    assert got[0].ids.tolist() == want.ids.tolist()
    assert not [r for r in caplog.records if r.name == "asyncio"], [r.getMessage() for r in caplog.records]


def test_a_query_whose_task_outlives_its_cancelling_does_not_hold_the_reader(make_store, monkeypatch):
    """A task still running when cancelled (LanceDB's answer that never came: once in some hundred Ctrl-C's the CLI
    waited for good) is left behind after SETTLE_S: the KeyboardInterrupt comes out, and the thread's next search
    is answered."""
    import asyncio
    import time
    from contextlib import suppress

    from vecgpt.backends.lancedb import search as lance_search
    from vecgpt.backends.lancedb import table as lance_table

    monkeypatch.setattr(lance_table.OwnLoop, "SETTLE_S", 0.2)
    store = make_store("lancedb")
    x, _ = keys(store, n=120)
    want = store.search("text-k", x[:1], k=3)

    async def never_done():
        while True:
            with suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    async def interrupted():
        await asyncio.sleep(0)
        raise KeyboardInterrupt

    raised, got = [], []

    def in_a_thread():
        start = time.monotonic()
        try:
            lance_table.on_this_thread(lance_search.gather(never_done(), interrupted()))
        except KeyboardInterrupt:
            raised.append(time.monotonic() - start)
        got.append(store.search("text-k", x[:1], k=3))

    thread = threading.Thread(target=in_a_thread, daemon=True)  # held for good, before: the test goes on
    thread.start()
    thread.join(30)
    assert raised and raised[0] < 10, raised
    assert got and got[0].ids.tolist() == want.ids.tolist()


def test_empty_and_missing(make_store):
    store = make_store("lancedb")
    store.create("e", 4, "ip", attrs=("layer",))
    hits = store.search("e", np.ones((2, 4), np.float32))
    assert hits.ids.shape == (2, 0)
    store.upsert("e", np.array([7]), np.ones((1, 4), np.float32), {"layer": np.array([1])})
    assert store.search("e", np.ones((1, 4), np.float32), where=Where(eq={"layer": 0})).ids.shape == (1, 0)
    from vecgpt.errors import VecgptError

    with pytest.raises(VecgptError, match="no id 8"):
        store.fetch("e", np.array([7, 8]))
    with pytest.raises(VecgptError, match="no collection"):
        store.search("nothing", np.ones((1, 4), np.float32))


def test_ids_by_rowid_stay_right_across_writes_and_compaction(make_store):
    """Once a search of every row has shown a table's _rowids, searches read no ids, only _rowid; a write or
    a compaction gives rows new _rowids, so each search must still name the row it measured."""
    store = make_store("lancedb", compact_every=0)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    store.create("m", 8, "l2", attrs=("layer",))
    store.upsert("m", np.arange(200), x[:200], {"layer": np.zeros(200)})
    store.upsert("m", np.arange(200, 300), x[200:], {"layer": np.ones(100)})  # two fragments

    def check(q):
        hits = store.search("m", q[None])
        truth = ((q.astype(np.float64) - x.astype(np.float64)) ** 2).sum(-1)
        scale = (q.astype(np.float64) ** 2).sum() + (x.astype(np.float64) ** 2).sum(-1)
        assert sorted(hits.ids[0].tolist()) == list(range(300))
        assert np.all(np.abs(hits.dists[0] - truth[hits.ids[0]]) <= 8 * EPS32 * scale[hits.ids[0]])

    table = store._table("m")
    for step in ("two fragments", "compacted", "known", "rewritten", "compacted again", "known again"):
        if step == "rewritten":  # rows 50..149 replaced (new values), rows 0..49 and 150.. kept
            x[50:150] = rng.standard_normal((100, 8)).astype(np.float32)
            store.upsert("m", np.arange(50, 150), x[50:150], {"layer": np.zeros(100)})
        if step.startswith("compacted"):
            store.compact("m")
        check(rng.standard_normal(8).astype(np.float32))
        assert (table.rowids is not None) == step.startswith(("compacted", "known"))
    top = store.search("m", x[7][None], k=3)  # a top-k search names its rows too
    assert top.ids[0, 0] == 7


def lance_file_versions(folder) -> set[tuple[int, int]]:
    """(major, minor) from the footer of each Lance data file under folder: below (0, 3) a v1 ("legacy") file,
    (0, 3) v2.0, (2, m) v2.m."""
    return {
        (int.from_bytes(tail[:2], "little"), int.from_bytes(tail[2:4], "little"))
        for tail in (p.read_bytes()[-8:] for p in folder.rglob("data/*.lance"))
    }


def test_each_file_format_is_written_and_searched_alike(make_store, tmp_path):
    """Tables are written in the Lance file format asked for, and a search reads the same rows from either."""
    from vecgpt.errors import VecgptError

    found, state = {}, rng.bit_generator.state
    for file_format, v1 in (("legacy", True), ("stable", False)):
        rng.bit_generator.state = state  # the same rows and queries
        store = make_store("lancedb", path=str(tmp_path / file_format), file_format=file_format, compact_every=0)
        keys(store, n=300)
        store.compact()
        versions = lance_file_versions(tmp_path / file_format)
        assert versions and all((version < (0, 3)) == v1 for version in versions), versions
        q = rng.standard_normal((2, 16)).astype(np.float32)
        hits = store.search("text-k", q, where=Where(eq={"layer": 1}, lt={"position": 20}))
        order = np.argsort(hits.ids, axis=1)
        found[file_format] = np.take_along_axis(hits.ids, order, 1), np.take_along_axis(hits.dists, order, 1)
    assert np.array_equal(found["legacy"][0], found["stable"][0]) and found["legacy"][0].shape == (2, 80)
    np.testing.assert_allclose(found["legacy"][1], found["stable"][1], rtol=0, atol=1e-4)
    with pytest.raises(VecgptError, match="file_format 'v3' is not one of Lance's"):
        make_store("lancedb", path=str(tmp_path / "bad"), file_format="v3")


def flat_indexed(store, name) -> bool:
    return any(index.name == FLAT_INDEX for index in store._table(name).handle.list_indices())


def test_a_models_tables_are_searched_exactly_through_an_index_of_one_partition(make_store):
    """flush() (a load's end) gives every table but a text's an IVF_FLAT index of one partition, which unfiltered
    searches read: every row is scored. Rows written later are found too, and a compaction rebuilds the index
    (Lance 0.40's optimize, merging rows into it, lost most of them)."""
    store = make_store("lancedb", compact_every=2)
    x = rng.standard_normal((18000, 8)).astype(np.float32)
    store.create("m", 8, "l2", attrs=("row",))
    for start in range(0, 2000, 400):  # compacted after every two writes, as a load is, and not indexed yet
        store.upsert("m", np.arange(start, start + 400), x[start : start + 400], {"row": np.arange(start, start + 400)})
    assert not flat_indexed(store, "m")
    keys(store, "text-k", n=240, dim=8)
    store.flush()
    assert flat_indexed(store, "m") and store._table("m").flat and not flat_indexed(store, "text-k")

    def check(n):
        q = rng.standard_normal((1, 8)).astype(np.float32)
        truth = ((q.astype(np.float64) - x[:n].astype(np.float64)) ** 2).sum(-1)
        tol = 8 * EPS32 * ((q.astype(np.float64) ** 2).sum() + (x[:n].astype(np.float64) ** 2).sum(-1))
        every = store.search("m", q)
        assert sorted(every.ids[0].tolist()) == list(range(n))
        assert np.all(np.abs(every.dists[0] - truth[every.ids[0]]) <= tol[every.ids[0]])
        top = store.search("m", q, k=5)
        order = np.argsort(truth)
        if truth[order[5]] - truth[order[4]] > 2 * tol.max():  # the fifth and sixth rows are told apart
            assert sorted(top.ids[0].tolist()) == sorted(order[:5].tolist())

    check(2000)
    x[:100] = rng.standard_normal((100, 8)).astype(np.float32)  # rows overwritten, then rows added
    store.upsert("m", np.arange(100), x[:100], {"row": np.arange(100)})
    check(2000)
    # the second write, so a compaction: merged into the index by Lance, most of 16,000 new rows were lost
    store.upsert("m", np.arange(2000, 18000), x[2000:], {"row": np.arange(2000, 18000)})
    assert flat_indexed(store, "m") and store._table("m").writes == 0
    check(18000)


def test_flat_index_false_leaves_tables_unindexed(make_store):
    store = make_store("lancedb", flat_index=False)
    store.create("m", 8, "ip")
    store.upsert("m", np.arange(50), rng.standard_normal((50, 8)).astype(np.float32))
    store.flush()
    assert not flat_indexed(store, "m") and not store._table("m").flat
    assert store.search("m", np.ones((1, 8), np.float32)).ids.shape == (1, 50)


@pytest.mark.parametrize(
    "filters",
    [
        [{"eq": {"layer": 1, "head": h}, "lt": {"position": 30}} for h in range(4)],  # a layer's heads: head IN (...)
        [{"eq": {"layer": 1}}, {"eq": {"layer": 1}, "ge": {"position": 20}}],  # one keeps every row of the shared
        [{"eq": {"layer": 0, "head": 1}}, {"eq": {"layer": 2}, "lt": {"position": 10}}, {"ge": {"position": 45}}],
    ],
)
@pytest.mark.parametrize("indexed", [False, True])  # bitmaps on layer and head: the range is then tested here
def test_filtered_searches_sent_together_find_what_each_finds_alone(make_store, filters, indexed):
    store = make_store("lancedb", index_rows=64 if indexed else 2048)
    keys(store, "text-k", n=600, dim=16)
    store.compact("text-k")
    assert store._table("text-k").indexed == ({"layer", "head"} if indexed else set())
    searches = [
        Search("text-k", rng.standard_normal((m, 16)).astype(np.float32), where=Where(**f))
        for m, f in zip([1, 2, 1, 3], filters)
    ]
    together = store.search_many(searches)
    for s, hits in zip(searches, together):
        alone = store.search(s.collection, s.queries, where=s.where)
        assert hits.ids.shape == alone.ids.shape and hits.ids.shape[1] > 0
        for row in range(len(s.queries)):
            mine, theirs = np.argsort(hits.ids[row]), np.argsort(alone.ids[row])
            assert np.array_equal(hits.ids[row][mine], alone.ids[row][theirs])
            assert np.allclose(hits.dists[row][mine], alone.dists[row][theirs], rtol=1e-6, atol=1e-5)
