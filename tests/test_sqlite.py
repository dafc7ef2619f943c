"""The SQLite store's own checks: searches wider than sqlite-vec's k split by id range, its L2 distances squared,
and a locked file, a missing driver or extension and a dimension above sqlite-vec's limit as one line each."""

import sqlite3

import numpy as np
import pytest

pytest.importorskip("sqlite_vec")

from vecgpt.backends import sqlite as sqlite_backend  # noqa: E402
from vecgpt.backends.base import Search, Where  # noqa: E402
from vecgpt.backends.sqlite import db as sqlite_db  # noqa: E402
from vecgpt.backends.sqlite import search  # noqa: E402
from vecgpt.backends.sqlite.store import SqliteStore  # noqa: E402
from vecgpt.encoding import U32, distance_bound  # noqa: E402
from vecgpt.errors import VecgptError  # noqa: E402

rng = np.random.default_rng(0)


def filled(store, n=200, dim=12):
    x = rng.standard_normal((n, dim)).astype(np.float32)
    store.create("c", dim, "l2", attrs=("layer", "position"))
    store.upsert("c", np.arange(n) * 7 + 5, x, {"layer": np.arange(n) % 3, "position": np.arange(n)})
    return x


@pytest.mark.parametrize("threads", [1, 2])
def test_searches_wider_than_k_are_split_by_id_range(tmp_path, monkeypatch, threads):
    """With sqlite-vec's k limit made 16: every row, a filter's rows and a top 40 come back as with no limit (the
    same ids and distances), each piece's KNN asking for at most 16 rows; with two threads, each search is split
    over them as well."""
    store = SqliteStore(str(tmp_path), threads=threads)
    x = filled(store)
    q = rng.standard_normal((2, 12)).astype(np.float32)
    shapes = [dict(), dict(where=Where(eq={"layer": 1}, lt={"position": 150})), dict(k=40), dict(k=16), dict(k=3)]
    want = [store.search_many([Search("c", q, vectors=True, **shape)])[0] for shape in shapes]
    asked, rows = [], store.db.rows
    monkeypatch.setattr(store, "limit", 16)
    monkeypatch.setattr(search, "SPLIT_WORK", 0)  # any model's table is split over the threads

    def counted(text, values=()):  # each KNN's k: the value after its query vector (KNNs joined by UNION ALL too)
        asked.extend(values[i + 1] for i, v in enumerate(values) if isinstance(v, bytes) and "MATCH" in text)
        return rows(text, values)

    monkeypatch.setattr(store.db, "rows", counted)
    for shape, before in zip(shapes, want):
        asked.clear()
        (got,) = store.search_many([Search("c", q, vectors=True, **shape)])
        assert max(asked) <= 16 and (len(asked) > 2 * threads) == (shape.get("k", 99) > 16)  # split past the limit
        for row in range(2):
            a, b = np.argsort(got.ids[row]), np.argsort(before.ids[row])
            assert got.ids[row][a].tolist() == before.ids[row][b].tolist()
            np.testing.assert_array_equal(got.dists[row][a], before.dists[row][b])
            np.testing.assert_array_equal(got.vectors[row], x[(got.ids[row] - 5) // 7])
        if "k" in shape:  # nearest first, in the same order
            assert got.ids.tolist() == before.ids.tolist()
    assert len(want[0].ids[0]) == 200 and len(want[1].ids[0]) == 50
    store.close()


def test_distances_are_float32_l2_distances_squared_within_the_derived_bound(tmp_path):
    """sqlite-vec's distance is float32 sqrt(sum): the store's squared L2 is the square of a float32 number, and
    within encoding.distance_bound at the unit roundoff sqlite's module states (gamma_{n+5} at float32's)."""
    store = SqliteStore(str(tmp_path))
    x = filled(store, n=300, dim=200) * 30
    store.upsert("c", np.arange(300) * 7 + 5, x)
    q = rng.standard_normal((3, 200)).astype(np.float32)
    hits = store.search("c", q)
    roots = np.sqrt(hits.dists).astype(np.float32).astype(np.float64)
    np.testing.assert_array_equal(roots * roots, hits.dists)  # a float32's square, exact in float64
    rows = x[(hits.ids - 5) // 7].astype(np.float64)
    truth = ((rows - q.astype(np.float64)[:, None]) ** 2).sum(-1)
    qn, xn = np.linalg.norm(q.astype(np.float64), axis=1)[:, None], np.linalg.norm(rows, axis=2)
    assert np.all(np.abs(hits.dists - truth) <= distance_bound(qn, xn, 200, "l2", sqlite_backend.UNIT_ROUNDOFF))
    assert sqlite_backend.UNIT_ROUNDOFF == 1.5 * U32
    store.close()


def test_a_file_locked_by_another_writer_is_one_line(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"), timeout=0.2)
    filled(store)
    other = sqlite_db.open_connection(tmp_path / "s.db", 0)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the file's write lock
    try:
        with pytest.raises(VecgptError, match=r"s\.db is locked by another process .*raise \[store\] timeout"):
            store.upsert("c", np.array([1]), np.zeros((1, 12), np.float32))
        assert len(store.search("c", np.zeros((1, 12), np.float32)).ids[0]) == 200  # readers do not wait (WAL)
    finally:
        other.execute("ROLLBACK")
        other.close()
    store.upsert("c", np.array([1]), np.zeros((1, 12), np.float32))
    assert store.count("c") == 201 and (tmp_path / "s.db").is_file()
    store.close()


def test_a_dimension_above_sqlite_vecs_limit_is_refused(tmp_path):
    store = SqliteStore(str(tmp_path))
    with pytest.raises(VecgptError, match="dimension 1 to 8192, not 8193"):
        store.create("wide", 8193, "l2")
    store.create("widest", 8192, "l2")
    with pytest.raises(VecgptError, match="sqlite cannot rank by 'ip'"):
        store.create("ip", 8, "ip")
    store.close()


def test_without_apsw_a_sqlite3_that_cannot_load_extensions_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_db, "apsw", None)
    if hasattr(sqlite3.Connection, "enable_load_extension"):  # this Python's sqlite3 can: the store runs on it
        store = SqliteStore(str(tmp_path))
        filled(store)
        assert len(store.search("c", np.zeros((1, 12), np.float32), k=5).ids[0]) == 5
        store.close()
    else:
        with pytest.raises(VecgptError, match=r"sqlite3 cannot load extensions \(sqlite-vec\): pip install"):
            SqliteStore(str(tmp_path))


def test_a_missing_extension_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_db.sqlite_vec, "loadable_path", lambda: str(tmp_path / "vec0"))
    monkeypatch.setattr(sqlite_db.sqlite_vec, "load", lambda conn: conn.load_extension(str(tmp_path / "vec0")))
    with pytest.raises(VecgptError, match="cannot load sqlite-vec .*pip install --force-reinstall sqlite-vec"):
        SqliteStore(str(tmp_path))


def test_a_damaged_file_is_one_line(tmp_path):
    (tmp_path / "bad.db").write_bytes(b"not SQLite" * 500)
    with pytest.raises(VecgptError, match=r"bad\.db is damaged .*; remove it and run `vecgpt load` again"):
        SqliteStore(str(tmp_path / "bad.db"))
