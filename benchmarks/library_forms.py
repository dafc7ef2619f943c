"""The call forms benchmarks/store_floors.py times, per library, each used directly (not through vecgpt's store
adapters): FORMS[library](tables, threads) loads the tables ([(documents, k)]; k None: every row) into the library
and returns {form: search(i, q)}, the exact search of table i for query q, results as the library hands them over.

pgvector: a local PostgreSQL from pgserver in a temporary folder (vecgpt's settings: 1 GB shared_buffers), a
table per matrix, `embedding` SET STORAGE PLAIN (rows inline, docs/pgvector.md); documents wider than a page holds
(mlp.c_proj's 3,074 floats) as two PLAIN rows of 1,537 (row 2j + p: part p of document j, as vecgpt's wide.py),
each row's distance to its half of the query returned (a document's is sqrt(d0^2 + d1^2): not formed here).
LanceDB: a table per matrix in a temporary folder, written in batches of loading.BATCH rows as vecgpt loads, in
Lance's v1 files (vecgpt's default) and in its v2 files.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from vecgpt import loading


def numpy_forms(tables, threads):
    outs = [np.empty(len(rows), np.float32) for rows, _ in tables]

    def sgemv(i, q):
        rows, k = tables[i]
        np.matmul(rows, q, out=outs[i])
        return outs[i] if k is None else np.argpartition(-outs[i], k)[:k]

    return {"sgemv (documents @ q)": sgemv}


def faiss_forms(tables, threads):
    import faiss
    import faiss_scans

    faiss.omp_set_num_threads(threads)
    indexes = {kind: [] for kind in ("IP", "L2")}
    for rows, _ in tables:
        for kind, index in indexes.items():
            index.append(getattr(faiss, f"IndexFlat{kind}")(rows.shape[1]))
            index[-1].add(rows)
    outs = [np.empty(len(rows), np.float32) for rows, _ in tables]

    def flat(kind):
        return lambda i, q: indexes[kind][i].search(q[None], tables[i][1] or len(tables[i][0]))

    def kernel(threads):
        def run(i, q):
            faiss_scans.scan(tables[i][0], q, outs[i], threads)
            k = tables[i][1]
            return outs[i] if k is None else np.argpartition(-outs[i], k)[:k]

        return run

    return {
        "IndexFlatIP.search, k = all rows": flat("IP"),
        "IndexFlatL2.search, k = all rows": flat("L2"),
        "fvec_inner_products_ny, 1 thread": kernel(1),
        f"fvec_inner_products_ny, rows split over {threads} threads": kernel(threads),
    }


def pg_table(conn, name: str, rows: np.ndarray) -> int:
    """A PLAIN table of the rows; one wider than a page holds as two rows a document (id 2j + p, half each)."""
    from vecgpt.backends.pgvector.statements import copy_stream
    from vecgpt.backends.pgvector.wide import parts_for, split

    parts = parts_for(rows.shape[1])
    rows = split(rows, parts)
    conn.execute(f"CREATE TABLE {name} (id bigint, embedding vector({rows.shape[1]}))")
    conn.execute(f"ALTER TABLE {name} ALTER COLUMN embedding SET STORAGE PLAIN")
    with conn.cursor().copy(f"COPY {name} FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(copy_stream(np.arange(len(rows)), [], [rows]))
    conn.execute(f"VACUUM ANALYZE {name}")
    return parts


def pg_statement(name: str, parts: int, k: int | None, aggregated: bool, pages=(0, None)) -> str:
    """A scan's SQL, over the rows in pages [lo, hi) (a ctid range; hi None: to the end)."""
    cases = " ".join(f"WHEN {p} THEN %s" for p in range(parts))
    q = "%s" if parts == 1 else f"CASE id %% {parts} {cases} END"  # a wide document's part p: the query's part p
    dist, (lo, hi) = f"embedding <-> {q}", pages
    bounds = ([f"ctid >= '({lo},0)'::tid"] if lo else []) + ([f"ctid < '({hi},0)'::tid"] if hi else [])
    rows = f"{name} WHERE {' AND '.join(bounds)}" if bounds else name
    if k is not None:
        top = f"SELECT id, {dist} AS d FROM {rows} ORDER BY d LIMIT {k}"
        return f"SELECT array_agg(id), array_agg(d) FROM ({top}) s" if aggregated else top
    return f"SELECT array_agg(id), array_agg({dist}) FROM {rows}" if aggregated else f"SELECT id, {dist} FROM {rows}"


def pg_connect(dsn: str):
    import psycopg
    from pgvector.psycopg import register_vector

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    register_vector(conn)
    return conn


def page_ranges(pages: int, split: int) -> list[tuple[int, int | None]]:
    return [(pages * s // split, pages * (s + 1) // split if s < split - 1 else None) for s in range(split)]


def pgvector_forms(tables, threads):
    from vecgpt.backends.pgvector.server import local_server

    dsn = local_server(tempfile.mkdtemp(prefix="vecgpt-floors-pg-"), cleanup="delete")
    conns = [pg_connect(dsn) for _ in range(threads)]
    parts = [pg_table(conns[0], f"t{i}", rows) for i, (rows, _) in enumerate(tables)]
    pages = [
        conns[0].execute(f"SELECT relpages FROM pg_class WHERE relname = 't{i}'").fetchone()[0]
        for i in range(len(tables))
    ]
    helpers = ThreadPoolExecutor(max(1, threads - 1))

    def one(conn, statement, params):
        return conn.execute(statement, params, binary=True, prepare=True).fetchall()

    def form(aggregated: bool, split: int = 1):
        sqls = [
            [pg_statement(f"t{i}", p, k, aggregated, r) for r in page_ranges(pages[i], split)]
            for i, (p, (_, k)) in enumerate(zip(parts, tables))
        ]

        def run(i, q):
            halves = np.array_split(np.pad(q, (0, -len(q) % parts[i])), parts[i])
            others = [helpers.submit(one, c, statement, halves) for c, statement in zip(conns[1:], sqls[i][1:])]
            found = [one(conns[0], sqls[i][0], halves)] + [f.result() for f in others]
            return found[0] if split == 1 else merged(found, tables[i][1])

        return run

    forms = {
        "SELECT id, embedding <-> q (binary)": form(False),
        "SELECT array_agg(id), array_agg(distance)": form(True),
    }
    if threads > 1:  # a helper connection on a thread of its own scans the other pages, as vecgpt's store does
        forms[f"array_agg, pages split over {threads} connections"] = form(True, threads)
    return forms


def merged(found: list, k: int | None):
    """The split scans' (ids, distances) arrays as one; a top-k search's k nearest of them."""
    ids, dists = (np.concatenate([np.asarray(f[0][c]) for f in found]) for c in (0, 1))
    return (ids, dists) if k is None else ids[np.argsort(dists, kind="stable")[:k]]


def lancedb_forms(tables, threads):
    import lancedb
    import pyarrow as pa

    folder = tempfile.mkdtemp(prefix="vecgpt-floors-lance-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # 500 MB at GPT-2 small, a file format
    handles = {}
    for file_format in ("legacy", "stable"):  # vecgpt's default, Lance's (docs/lancedb.md)
        options = {"new_table_data_storage_version": file_format}
        db = lancedb.connect(f"{folder}/{file_format}", storage_options=options)
        handles[file_format] = []
        for i, (rows, _) in enumerate(tables):
            vectors = pa.FixedSizeListArray.from_arrays(pa.array(rows.ravel()), rows.shape[1])
            whole = pa.table({"id": np.arange(len(rows)), "vector": vectors})
            # in batches of loading.BATCH rows, as vecgpt writes: wte written whole scanned 2.7x slower
            batches = pa.Table.from_batches(whole.to_batches(max_chunksize=loading.BATCH))
            handles[file_format].append(db.create_table(f"t{i}", batches))

    def form(batch: int, file_format: str):
        def run(i, q):
            table = handles[file_format][i]
            query = table.search(np.vstack([q] * batch) if batch > 1 else q).distance_type("dot")
            return query.limit(tables[i][1] or len(tables[i][0])).select(["id", "_distance"]).to_arrow()

        return run

    return {
        "search(q).limit(rows).to_arrow(), v1 files": form(1, "legacy"),
        "search([q, q]) (2-query batch, both kept), v1 files": form(2, "legacy"),
        "search(q).limit(rows).to_arrow(), v2 files": form(1, "stable"),
    }


FORMS = {"numpy": numpy_forms, "faiss": faiss_forms, "pgvector": pgvector_forms, "lancedb": lancedb_forms}
