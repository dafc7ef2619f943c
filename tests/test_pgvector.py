"""pgvector specifics: exact plans, atomic loads, key tables, storage, and one-line errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytest.importorskip("psycopg")
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from vecgpt import tolerance  # noqa: E402
from vecgpt.backends import pgvector  # noqa: E402
from vecgpt.backends.base import Hits, Search, Where  # noqa: E402
from vecgpt.encoding import distance_bound  # noqa: E402
from vecgpt.errors import VecgptError  # noqa: E402

rng = np.random.default_rng(3)


@pytest.fixture
def store(make_store):
    return make_store("pgvector")


def plan(store, name, queries, k=None, where=None) -> str:
    meta = store._col(name)
    query, params = store._search_sql(0, meta, queries, k, where, name)
    rows = store.conn.cursor(binary=True).execute("EXPLAIN " + query, params).fetchall()
    return "\n".join(r[0] for r in rows)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_weight_searches_scan_every_row_even_beside_an_hnsw_index(store, metric):
    x = rng.standard_normal((400, 16)).astype(np.float32)
    store.create("w", 16, metric, attrs=("row",))
    store.upsert("w", np.arange(400), x, {"row": np.arange(400)})
    table = store._table(store._col("w"))
    for ops in ("vector_l2_ops", "vector_ip_ops"):  # approximate indexes the planner could be tempted by
        store.conn.execute(sql.SQL("CREATE INDEX ON {} USING hnsw (embedding {})").format(table, sql.SQL(ops)))
    store.conn.execute(sql.SQL("ANALYZE {}").format(table))
    for queries in (x[:1], x[:3]):
        for k in (None, 5):
            text = plan(store, "w", queries, k)
            assert "Seq Scan" in text and "Index" not in text, text
            hits = store.search("w", queries, k=k)
            want = (
                ((queries[:, None].astype(np.float64) - x[None]) ** 2).sum(-1)
                if metric == "l2"
                else -(queries.astype(np.float64) @ x.T)
            )
            for row in range(len(queries)):
                got = np.empty(400) if k is None else None
                if k is None:
                    got[hits.ids[row]] = hits.dists[row]
                    np.testing.assert_allclose(got, want[row], rtol=1e-5, atol=1e-4)
                else:
                    assert list(hits.ids[row]) == list(np.argsort(want[row], kind="stable")[:5])
    assert hits.dists.dtype == np.float64


def test_a_failed_copy_leaves_the_table_as_it_was(store):
    store.create("c", 8, "l2", attrs=("row",))
    store.upsert("c", np.arange(10), np.ones((10, 8), np.float32))
    store.count("c")  # commits the load
    bad = rng.standard_normal((1000, 8)).astype(np.float32)
    bad[700, 3] = np.nan  # the server refuses the row in the middle of the COPY
    with pytest.raises(VecgptError):
        store.upsert("c", np.arange(10, 1010), bad)
    assert store.count("c") == 10
    with pytest.raises(VecgptError):  # and one that would overwrite rows
        store.upsert("c", np.arange(5), bad[698:703])
    np.testing.assert_array_equal(store.fetch("c", np.arange(10)), np.ones((10, 8), np.float32))


def test_a_load_interrupted_half_way_leaves_no_collection(store):
    store.create("m", 8, "l2")
    store.upsert("m", np.arange(300), rng.standard_normal((300, 8)).astype(np.float32))
    bad = np.full((300, 8), np.nan, np.float32)
    with pytest.raises(VecgptError):
        store.upsert("m", np.arange(300, 600), bad)
    assert "m" not in store.collections()


def test_a_killed_load_leaves_nothing(store, tmp_path):
    """A process that dies between two batches of a collection: the collection is not there."""
    script = textwrap.dedent(f"""
        import os, numpy as np
        from vecgpt.backends.pgvector import PgStore
        s = PgStore({store.dsn!r}, {store.schema!r})
        s.create("killed", 8, "l2")
        s.upsert("killed", np.arange(500), np.ones((500, 8), np.float32))
        os._exit(1)
    """)
    subprocess.run([sys.executable, "-c", script], check=False, timeout=60)
    assert "killed" not in store.collections()


def test_keys_overwrite_by_position_and_drop_with_the_text(store):
    name = "text-0123456789ab"
    store.create(name, 4, "l2", attrs=("layer", "head", "position"))
    k1, k2 = rng.standard_normal((2, 3, 4)).astype(np.float32)
    attrs = {"layer": np.zeros(3, int), "head": np.arange(3), "position": np.full(3, 7)}
    store.upsert(name, np.array([7, 1031, 2055]), k1, attrs)
    store.upsert(name, np.array([7, 1031, 2055]), k2, attrs)  # the same position again: replaced
    assert store.count(name) == 3
    np.testing.assert_array_equal(store.fetch(name, np.array([1031])), k2[1:2])
    hits = store.search(name, k2[:1], where=Where(eq={"layer": 0, "head": 0}, lt={"position": 8}))
    assert hits.ids.tolist() == [[7]] and abs(hits.dists[0, 0]) < 1e-6
    table = store._col(name).table
    kind = store.conn.execute(
        "SELECT relpersistence FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        (store.schema, table),
    ).fetchone()
    assert kind == ("p",)  # logged: a text's keys survive a crash of the server, not only of the client
    store.drop(name)
    assert store.conn.execute("SELECT to_regclass(%s)", (f'"{store.schema}"."{table}"',)).fetchone() == (None,)


def test_wide_vectors_stay_inline_and_the_widest_are_split_across_rows(store):
    for dim in (770, 3074):
        store.create(f"d{dim}", dim, "l2")
        x = rng.standard_normal((3, dim)).astype(np.float32)
        store.upsert(f"d{dim}", np.arange(3), x)
        np.testing.assert_array_equal(store.fetch(f"d{dim}", np.arange(3)), x)
        assert store.count(f"d{dim}") == 3 and store.stats()[f"d{dim}"]["documents"] == 3
    storage = dict(
        store.conn.execute(
            "SELECT c.relname, a.attstorage FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND a.attname = 'embedding'",
            (store.schema,),
        ).fetchall()
    )
    assert storage == {"d770": "p", "d3074": "p"}  # 3,074 floats: two inline rows of 1,537
    assert store.conn.execute(f'SELECT count(*) FROM "{store.schema}".d3074').fetchone() == (6,)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_split_documents_search_as_whole_ones(store, metric):
    """A search over documents split across rows sums their parts: every shape the engine sends."""
    dim, n = 2101, 40  # parts of 1,051 and 1,050 floats (the last one padded)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    store.create("wide", dim, metric, attrs=("row",))
    store.upsert("wide", np.arange(n) * 3, x, {"row": np.arange(n)})
    store.upsert("wide", np.array([6]), x[:1], {"row": np.array([2])})  # a document rewritten
    x[2] = x[0]
    q = rng.standard_normal((3, dim)).astype(np.float32)
    q64, x64 = q.astype(np.float64), x.astype(np.float64)
    truth = ((q64[:, None, :] - x64[None]) ** 2).sum(-1) if metric == "l2" else -(q64 @ x64.T)
    norms = np.linalg.norm(q64, axis=1)[:, None], np.linalg.norm(x64, axis=1)[None]
    bound = distance_bound(*norms, dim, metric, tolerance.unit_roundoff("pgvector"))  # parts: fewer terms each
    for m in (1, 3):
        t, b = truth[:m], bound[:m]
        hits = store.search("wide", q[:m])
        assert np.all(np.abs(np.take_along_axis(hits.dists, np.argsort(hits.ids, axis=1), 1) - t) <= b)
        top = store.search("wide", q[:m], k=5, where=Where(lt={"row": 30}))
        assert top.ids.shape == (m, 5) and np.all(top.ids < 90) and np.all(top.ids % 3 == 0)
        true_top = np.take_along_axis(t, top.ids // 3, 1)
        assert np.all(np.abs(top.dists - true_top) <= np.take_along_axis(b, top.ids // 3, 1))
        fifth = np.sort(t[:, :30], axis=1)[:, 4:5]  # none better left out, near ties aside
        assert np.all(true_top <= fifth + 2 * b.max())


def test_a_wide_table_made_before_parts_is_read_as_whole_vectors(store):
    s = sql.Identifier(store.schema)
    store.conn.execute(
        sql.SQL("CREATE TABLE {}.old (id bigint PRIMARY KEY, embedding vector(2101) NOT NULL)").format(s)
    )
    store.conn.execute(sql.SQL("INSERT INTO {}._collections VALUES ('old', 'old', 2101, 'l2', '{{}}')").format(s))
    store.conn.commit()
    store._forget()
    x = rng.standard_normal((4, 2101)).astype(np.float32)
    store.upsert("old", np.arange(4), x)
    assert store._col("old").parts == 1 and store.count("old") == 4
    np.testing.assert_array_equal(store.fetch("old", np.arange(4)), x)
    assert store.search("old", x[:1], k=1).ids.tolist() == [[0]]


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


def test_connection_refused_is_one_line(monkeypatch):
    monkeypatch.delenv(pgvector.ENV_DSN, raising=False)
    with pytest.raises(VecgptError) as e:
        pgvector.connect(dsn="postgresql://postgres@127.0.0.1:1/postgres")
    assert "connection refused" in one_line(e) and pgvector.ENV_DSN in one_line(e)


def test_a_password_in_the_config_is_refused(monkeypatch):
    monkeypatch.delenv(pgvector.ENV_DSN, raising=False)
    with pytest.raises(VecgptError) as e:
        pgvector.connect(dsn="postgresql://me:secret@127.0.0.1:1/db")
    assert "PGPASSWORD" in one_line(e) and "secret" not in one_line(e)


def test_missing_extension_is_one_line(store):
    admin = store.conn
    admin.execute("DROP DATABASE IF EXISTS noext")
    admin.execute("DROP ROLE IF EXISTS noext")
    admin.execute("CREATE ROLE noext LOGIN")  # not a superuser: cannot create the extension
    admin.execute("CREATE DATABASE noext OWNER noext")
    dsn = psycopg.conninfo.make_conninfo(store.dsn, dbname="noext", user="noext")
    with pytest.raises(VecgptError) as e:
        pgvector.PgStore(dsn)
    assert "CREATE EXTENSION vector" in one_line(e)


def test_wrong_dimension_is_one_line(store):
    store.create("c", 8, "l2")
    with pytest.raises(VecgptError) as e:
        store.create("c", 9, "l2")
    assert "dimension 8" in one_line(e)
    with pytest.raises(VecgptError) as e:
        store.upsert("c", np.arange(1), np.zeros((1, 9), np.float32))
    assert "dimension" in one_line(e)


def test_no_dsn_starts_a_local_server_that_keeps_its_data(tmp_path, monkeypatch):
    monkeypatch.delenv(pgvector.ENV_DSN, raising=False)
    first = pgvector.connect(data_dir=str(tmp_path / "pg"))
    first.create("kept", 4, "ip")
    first.upsert("kept", np.arange(2), np.eye(2, 4, dtype=np.float32))
    buffers = pgvector.server.buffers_gb()  # a quarter of the machine's memory, 1 to 8 GB
    assert 1 <= buffers <= 8 and first.conn.execute("SHOW shared_buffers").fetchone() == (f"{buffers}GB",)
    first.close()
    second = pgvector.connect(data_dir=str(tmp_path / "pg"))
    assert second.search("kept", np.eye(1, 4, dtype=np.float32), k=1).ids.tolist() == [[0]]
    second.close()


def test_defaults_are_per_user(monkeypatch):
    from setup_pgvector import server_dsn

    from vecgpt.backends.pgvector.server import default_data_dir

    monkeypatch.setenv("LOGNAME", "ann")
    monkeypatch.setattr(pgvector.server.os, "geteuid", lambda: 0)
    assert str(default_data_dir()) == "/var/tmp/vecgpt-ann/pgserver"  # as root: still one folder per user
    store = pgvector.connect(dsn=server_dsn())
    try:
        assert store.schema == "vecgpt_ann"
    finally:
        store.close()


def test_a_resume_sized_fetch_comes_back_in_order_with_its_payload(store):
    n = 12 * 12 * 1024  # every key of a full GPT-2 small text, in one fetch
    vectors = rng.standard_normal((n, 4)).astype(np.float32)
    payload = rng.standard_normal((n, 3)).astype(np.float32)
    payload[0] = [-0.0, np.finfo(np.float32).tiny / 2, np.finfo(np.float32).max]  # signed zero, subnormal, largest
    store.create("text-big", 4, "l2", ("position",), payload=3)
    store.upsert("text-big", np.arange(n), vectors, {"position": np.arange(n)}, payload=payload)
    want = rng.permutation(n)
    v, p = store.fetch("text-big", want, payload=True)
    assert v.tobytes() == vectors[want].tobytes() and p.tobytes() == payload[want].tobytes()  # bit for bit
    with pytest.raises(VecgptError, match=f"has no id {n}"):
        store.fetch("text-big", np.array([5, n, 7]))
    assert store.fetch("text-big", np.array([], np.int64)).shape == (0, 4)


def test_payload_width_is_part_of_a_collection(store):
    store.create("text-w", 4, "l2", payload=2)
    store.create("text-w", 4, "l2", payload=2)  # the same: a no-op
    with pytest.raises(VecgptError, match="payload width 2, not 3"):
        store.create("text-w", 4, "l2", payload=3)
    store.create("plain", 4, "l2")
    store.upsert("plain", np.arange(2), np.ones((2, 4)))
    v, p = store.fetch("plain", np.arange(2), payload=True)
    assert p.shape == (2, 0) and v.shape == (2, 4)


def test_a_clone_is_one_request_and_a_logged_table_of_its_own(store):
    from vecgpt.backends.base import tally

    x = rng.standard_normal((30, 4)).astype(np.float32)
    store.create("text-a", 4, "l2", ("layer", "position"), payload=2)
    store.upsert("text-a", np.arange(30), x, {"layer": np.arange(30) % 3}, payload=x[:, :2])
    with tally() as counts:
        store.clone("text-a", "text-b")
    assert counts["requests"] == 1
    with pytest.raises(VecgptError, match="exists"):
        store.clone("text-a", "text-b")
    again = pgvector.PgStore(store.dsn, store.schema)  # the catalog, not this object's cache, knows it
    try:
        meta = again._col("text-b")
        assert (meta.dim, meta.attrs, meta.payload) == (4, ["layer", "position"], 2)
        assert again.count("text-b") == 30
        kind = again.conn.execute(
            "SELECT relpersistence FROM pg_class WHERE oid = %s::regclass", (again._table(meta).as_string(again.conn),)
        ).fetchone()
        assert kind == ("p",)
    finally:
        again.close()


def test_a_text_lock_is_released_when_its_holder_is_killed(store):
    script = textwrap.dedent(f"""
        import time
        from vecgpt.backends import pgvector
        store = pgvector.PgStore({store.dsn!r}, {store.schema!r})
        with store.text_lock("t1"):
            print("held", flush=True)
            time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(VecgptError, match="t1 is open in another process"):
            with store.text_lock("t1"):
                pass
    finally:
        child.kill()
        child.wait()
    for _ in range(100):  # the server notices the closed socket at once; give it a moment on a busy machine
        try:
            with store.text_lock("t1"):
                return
        except VecgptError:
            time.sleep(0.05)
    raise AssertionError("the lock outlived its holder")


def test_a_text_record_write_goes_through_a_lost_connection(store):
    store.write_text("t", {"tokens": [1]}, expect=None)
    store.conn.execute("SELECT 1")
    killer = psycopg.connect(store.dsn, autocommit=True)
    killer.execute("SELECT pg_terminate_backend(%s)", (store.conn.info.backend_pid,))
    killer.close()
    pid = store.conn.info.backend_pid
    assert store.write_text("t", {"tokens": [1, 2], "version": 1}, expect=1) == 2  # reconnected, written once
    assert store.read_text("t") == {"tokens": [1, 2], "version": 2} and store.conn.info.backend_pid != pid
    assert store._landed({"a": 1, "version": 3}, {"a": 1}, 2) and not store._landed({"a": 1, "version": 3}, {"a": 2}, 2)
    assert store._landed(None, None, 2) and not store._landed({"version": 2}, None, 2)


def test_a_store_of_the_layout_before_payloads_opens(store):
    store.create("old", 4, "l2")
    store.conn.execute(sql.SQL("ALTER TABLE {}._collections DROP COLUMN payload").format(sql.Identifier(store.schema)))
    store.close()
    again = pgvector.PgStore(store.dsn, store.schema)
    try:
        again.upsert("old", np.arange(1), np.ones((1, 4)))
        assert again._col("old").payload == 0 and again.count("old") == 1
    finally:
        again.close()


def split_tables(store) -> dict:
    """A weight table and a wide one (one part row a page, a document rewritten), loaded; their vectors."""
    x, wide = rng.standard_normal((400, 16)).astype(np.float32), rng.standard_normal((40, 2101)).astype(np.float32)
    store.create("w", 16, "l2", attrs=("row",))
    store.upsert("w", np.arange(400), x, {"row": np.arange(400)})
    store.create("wide", 2101, "l2", attrs=("row",))
    store.upsert("wide", np.arange(40), wide, {"row": np.arange(40)})
    store.upsert("wide", np.array([6]), wide[:1], {"row": np.array([6])})  # its parts move to the end
    store.count("w")  # commits the load
    return {"w": x, "wide": wide}


# (queries, k, filter): every shape the engine sends, and a filter
SHAPES = [(1, None, None), (3, None, None), (3, None, Where(lt={"row": 30})), (1, 5, None), (3, 7, None)]


@pytest.mark.parametrize("connections", [2, 3])
def test_a_scan_split_over_connections_gives_what_one_scan_gives(make_store, connections):
    """Every row in exactly one page range, the pieces merged: the same ids and the very same distances."""
    one = make_store("pgvector", connections=1)
    tables = split_tables(one)
    split = make_store("pgvector", connections=connections)
    split.split_pages = split.share_pages = 1  # tables of a few pages are split too
    for name, x in tables.items():
        meta = split._col(name)
        ranges = split._ranges(meta, Search(name, x[:1]))
        assert len(ranges) == connections and ranges[0] == (0, ranges[1][0]) and ranges[-1][1] is None
        for m, k in [(1, None), (3, None), (1, 5), (3, 5)][: 2 if meta.parts > 1 else 4]:  # wide top-k: whole
            query, params = split._search_sql(0, meta, x[:m], k, None, name, ranges[1])
            text = "\n".join(r[0] for r in split.conn.cursor(binary=True).execute("EXPLAIN " + query, params))
            assert "Tid Range Scan" in text and "Index" not in text, text
        for m, k, where in SHAPES:
            q = rng.standard_normal((m, x.shape[1])).astype(np.float32)
            want, got = (s.search(name, q, k=k, where=where) for s in (one, split))
            if k is None:  # every row, in any order
                want, got = (
                    Hits(*(np.take_along_axis(a, np.argsort(h.ids, 1), 1) for a in h[:2])) for h in (want, got)
                )
            np.testing.assert_array_equal(got.ids, want.ids)
            np.testing.assert_array_equal(got.dists, want.dists)
            if k is not None:  # the pieces' rows with their vectors (a wide collection's: none, the engine fetches)
                (rows,) = split.search_many([Search(name, q, k=k, where=where, vectors=True)])
                assert rows.ids.tolist() == got.ids.tolist()
                if meta.parts == 1:
                    np.testing.assert_array_equal(rows.vectors, split.fetch(name, rows.ids.ravel()).reshape(m, k, -1))
                else:
                    assert rows.vectors is None
    many = split.search_many([Search("wide", tables["wide"][:2]), Search("w", tables["w"][:1], k=3)])
    assert many[0].ids.shape == (2, 40) and list(many[1].ids[0]) == [0, *many[1].ids[0][1:]]


def test_a_lost_helper_connection_is_opened_again(make_store):
    store = make_store("pgvector", connections=2)
    x = split_tables(store)["w"]
    store.split_pages = store.share_pages = 1
    before = store.search("w", x[:2])
    helper = store._helpers[0]
    killer = psycopg.connect(store.dsn, autocommit=True)
    killer.execute("SELECT pg_terminate_backend(%s)", (helper.info.backend_pid,))
    killer.close()
    after = store.search("w", x[:2])
    assert store._helpers[0] is not helper and not store._helpers[0].closed
    np.testing.assert_array_equal(np.sort(after.ids), np.sort(before.ids))


def test_a_helper_that_cannot_be_opened_leaves_the_store_on_one_connection(make_store):
    store = make_store("pgvector", connections=2)
    x = split_tables(store)["w"]
    store.split_pages = store.share_pages = 1
    want = store.search("w", x[:2], k=5)
    store._helpers[0].close()
    store.dsn = "host=/nonexistent-vecgpt dbname=none"  # no server there: the helper cannot be opened again
    got = store.search("w", x[:2], k=5)
    assert store._helpers == [] and store._ranges(store._col("w"), Search("w", x[:1])) == [None]
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.dists, want.dists)


@pytest.mark.parametrize("bad", [0, 65, 10**12, -1, 1.5, "2", True])
def test_connections_must_be_a_whole_number_from_one_to_64(make_store, bad):
    with pytest.raises(
        VecgptError, match=r"^\[store\] connections (= .* has the wrong type|must be 0 or more|must be 1 to 64)"
    ):
        make_store("pgvector", connections=bad)


def test_pieces_merge_exactly():
    from vecgpt.backends.pgvector.split import assign, block_ranges, merge

    assert block_ranges(10, 3) == [(0, 3), (3, 7), (7, None)] and block_ranges(1, 2) == [(0, 0), (0, None)]
    assert assign([5, 1, 4, 2], 2) == [0, 0, 1, 1]  # costliest first, each to the least loaded: 5+1 | 4+2
    a, b = (np.array([7, 2, 9]), np.array([0.5, 1.0, 2.0]), None), (np.array([1, 4]), np.array([0.5, 1.0]), None)
    ids, dists, vectors = merge([a, b], k=3)  # ties by id
    assert list(ids) == [1, 7, 2] and list(dists) == [0.5, 0.5, 1.0] and vectors is None
    rows = [(i, d, np.asarray(i, np.float32)[:, None] * [1, -1]) for i, d, _ in (a, b)]  # each row's vector: (id, -id)
    empty = (np.zeros(0, np.int64), np.zeros(0), None)  # a piece that matched no row
    ids, _, vectors = merge([rows[0], empty, rows[1]], k=3)
    assert vectors.tolist() == [[1, -1], [7, -7], [2, -2]]  # the vectors follow their rows
    two = (np.array([3, 0]), np.array([0.25, 1.0]), None), (np.array([3]), np.array([0.5]), None)
    ids, dists, _ = merge(list(two), None, parts=2)
    assert list(ids) == [0, 3] and list(dists) == [1.0, 0.75]  # a wide document's parts in two pieces
    ids, dists, _ = merge([(np.array([3, 0, 0, 3]), np.array([0.25, 1.0, 2.0, 0.5]), None)], None, parts=2)
    assert list(ids) == [0, 3] and list(dists) == [3.0, 0.75]  # ... or both in one
    narrow = (np.array([3, 0]), np.array([0.25, 1.0]), None), (np.array([5]), np.array([0.5]), None)
    ids, dists, _ = merge(list(narrow), None)
    assert list(ids) == [3, 0, 5] and list(dists) == [0.25, 1.0, 0.5]  # narrow rows: concatenated as they are
    ids, dists, vectors = merge([], k=None)
    assert len(ids) == len(dists) == 0 and vectors is None
