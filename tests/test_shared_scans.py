"""Several queries searching every row share one scan (issue 52: texts stepped together), and each query's
distances keep the bits of its search alone: pgvector (one statement, each row's distances to every query as
one array) and SQLite (one statement, the rows joined with the queries)."""

from __future__ import annotations

import numpy as np
import pytest

from vecgpt.backends.base import Search, Where

rng = np.random.default_rng(52)


def by_id(hits, row: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(hits.ids[row], kind="stable")
    return hits.ids[row][order], hits.dists[row][order]


def check_alone_and_together(store, name: str, dim: int, where=None, vectors=False) -> None:
    """16 queries at once give each query exactly its solo search's ids, distance bits and vectors."""
    q = rng.standard_normal((16, dim)).astype(np.float32)
    (together,) = store.search_many([Search(name, q, None, where, vectors=vectors)])
    for i in range(len(q)):
        (alone,) = store.search_many([Search(name, q[i : i + 1], None, where, vectors=vectors)])
        ids, dists = by_id(alone, 0)
        got_ids, got = by_id(together, i)
        np.testing.assert_array_equal(got_ids, ids)
        assert got.view(np.int64).tolist() == dists.view(np.int64).tolist(), f"query {i}"
        if vectors:
            order = np.argsort(together.ids[i], kind="stable")
            np.testing.assert_array_equal(together.vectors[i][order], store.fetch(name, ids))


def pg_plan(store, name: str, queries: np.ndarray) -> str:
    meta = store._col(name)
    query, params = store._search_sql(0, meta, queries, None, None, name)
    return "\n".join(r[0] for r in store.conn.cursor(binary=True).execute("EXPLAIN " + query, params))


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_pgvector_queries_share_one_scan_and_keep_their_bits(make_store, metric):
    pytest.importorskip("psycopg")
    store = make_store("pgvector", connections=2)
    store.split_pages = store.share_pages = 1  # a few pages are split over the connections too
    x, wide = rng.standard_normal((300, 24)).astype(np.float32), rng.standard_normal((30, 4100)).astype(np.float32)
    store.create("w", 24, metric, attrs=("row",))
    store.upsert("w", np.arange(300), x, {"row": np.arange(300)})
    store.create("wide", 4100, metric, attrs=("row",))  # three parts a document
    store.upsert("wide", np.arange(30), wide, {"row": np.arange(30)})
    store.count("w")  # commits the load
    for name, dim in (("w", 24), ("wide", 4100)):
        text = pg_plan(store, name, rng.standard_normal((16, dim)).astype(np.float32))
        assert "Nested Loop" not in text and "unnest" not in text and text.count("Seq Scan") == 1, text
        check_alone_and_together(store, name, dim)
        check_alone_and_together(store, name, dim, Where(lt={"row": 20}))
    check_alone_and_together(store, "w", 24, vectors=True)
    (none,) = store.search_many([Search("w", x[:3], None, Where(lt={"row": -1}))])
    assert none.ids.shape == (3, 0)
