"""Indexes that live in a vector store: LanceDB, pgvector and turbopuffer, each in a collection of its own."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from vecgpt import encoding

from output_index.base import OutputIndex, Unavailable, as_queries, no_hits, padded


class Lance(OutputIndex):
    """A LanceDB table `wte_ann_<type>` of its own, with an ANN index on it (metric "dot").

    index_type: IVF_FLAT, IVF_PQ, IVF_HNSW_SQ, IVF_HNSW_PQ. LanceDB's "dot" distance is 1 - x.y in
    float32. exact_search is a flat scan of the same table (bypass_vector_index).
    """

    kind = "lancedb"
    search_params = ("nprobes", "refine_factor", "ef")
    defaults = {
        "index_type": "IVF_HNSW_SQ",
        "num_partitions": 64,
        "num_sub_vectors": 48,
        "m": 20,
        "ef_construction": 150,
        "nprobes": 16,
        "refine_factor": 0,
        "ef": 200,
        "path": None,
    }
    exact_label = "LanceDB flat scan"

    @property
    def label(self):
        t = self.params["index_type"]
        keep = (
            ["num_partitions", "nprobes"]
            + (["num_sub_vectors"] if "PQ" in t else [])
            + (["m", "ef_construction", "ef"] if "HNSW" in t else [])
            + (["refine_factor"] if self.params["refine_factor"] else [])
        )
        return f"lancedb {t} " + " ".join(f"{k}={self.params[k]}" for k in keep)

    @property
    def exact_scores(self):
        return self.params["index_type"] == "IVF_FLAT" or bool(self.params["refine_factor"])

    def _build(self, vectors):
        try:
            import lancedb
            import pyarrow as pa
        except ImportError as e:
            raise Unavailable(f"lancedb needs {e.name}") from None
        self.scratch = None if self.params["path"] else tempfile.mkdtemp(prefix="vecgpt-lance-ann-")
        path = self.params["path"] or self.scratch
        self.db = lancedb.connect(path)
        kind = self.params["index_type"]
        self.name = f"wte_ann_{kind.lower()}"
        table = pa.table(
            {
                "id": pa.array(np.arange(len(vectors)), pa.int64()),
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel(), pa.float32()), vectors.shape[1]),
            }
        )
        self.table = self.db.create_table(self.name, table, mode="overwrite")
        options = {
            "metric": "dot",
            "vector_column_name": "vector",
            "index_type": kind,
            "replace": True,
            "num_partitions": self.params["num_partitions"],
        }
        if "PQ" in kind:
            options["num_sub_vectors"] = self.params["num_sub_vectors"]
        if "HNSW" in kind:
            options.update(m=self.params["m"], ef_construction=self.params["ef_construction"])
        self.table.create_index(**options)
        self.path = path

    def _query(self, q, k):
        return (
            self.table.search(q, vector_column_name="vector").distance_type("dot").limit(k).select(["id", "_distance"])
        )

    def search(self, h, k):
        q = as_queries(h)
        ids, scores = no_hits(len(q), k)
        for i, v in enumerate(q):
            query = self._query(v, k).nprobes(self.params["nprobes"])
            if "HNSW" in self.params["index_type"]:
                query = query.ef(self.params["ef"])
            if self.params["refine_factor"]:
                query = query.refine_factor(self.params["refine_factor"])
            res = query.to_arrow()
            n = res.num_rows
            ids[i, :n] = res["id"].to_numpy()
            scores[i, :n] = 1.0 - res["_distance"].to_numpy().astype(np.float64)
        return ids, scores

    def exact_search(self, h, k):
        q = as_queries(h)
        ids, scores = np.empty((len(q), k), np.int64), np.empty((len(q), k))
        for i, v in enumerate(q):
            res = self._query(v, k).bypass_vector_index().to_arrow()
            ids[i], scores[i] = res["id"].to_numpy(), 1.0 - res["_distance"].to_numpy().astype(np.float64)
        return ids, scores

    def memory_bytes(self):  # the index files on disk (LanceDB memory-maps them)
        folder = Path(self.path) / f"{self.name}.lance" / "_indices"
        return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else None

    def close(self):
        try:
            self.db.drop_table(self.name)
        except Exception:  # noqa: BLE001 - best effort cleanup of a scratch table
            pass
        if getattr(self, "scratch", None):
            import shutil

            shutil.rmtree(self.scratch, ignore_errors=True)


class Pgvector(OutputIndex):
    """A pgvector table `<schema>."wte.ann.<method>"` of its own with an HNSW or IVFFlat index
    (`vector_ip_ops`: ordering by `<#>`, the negated inner product, in double precision).

    dsn: VECGPT_PG_DSN or [store] dsn; without either a local pgserver is started
    (vecgpt.backends.pgvector.local_server). Search settings are `hnsw.ef_search` / `ivfflat.probes`;
    pgvector's HNSW returns at most ef_search rows, so ef_search is raised to k where it is lower.
    exact_search is the same ORDER BY with index scans switched off (a sequential scan).
    """

    kind = "pgvector"
    search_params = ("ef_search", "probes")
    defaults = {
        "method": "hnsw",
        "m": 16,
        "ef_construction": 64,
        "lists": 224,
        "ef_search": 200,
        "probes": 16,
        "dsn": None,
        "schema": "vecgpt_ann",
    }
    exact_label = "pgvector sequential scan"

    @property
    def label(self):
        keep = ("m", "ef_construction", "ef_search") if self.params["method"] == "hnsw" else ("lists", "probes")
        return f"pgvector {self.params['method']} " + " ".join(f"{k}={self.params[k]}" for k in keep)

    def _connect(self):
        try:
            import psycopg
            from pgvector.psycopg import register_vector
            from psycopg import sql
        except ImportError as e:
            raise Unavailable(f"pgvector needs {e.name}") from None
        dsn = self.params["dsn"] or os.environ.get("VECGPT_PG_DSN")
        if not dsn:
            try:
                from vecgpt.backends.pgvector import local_server

                dsn = local_server()
            except Exception as e:  # noqa: BLE001 - any failure to start a server means "skip"
                raise Unavailable(f"no PostgreSQL: set VECGPT_PG_DSN ({type(e).__name__}: {str(e)[:80]})") from None
        try:
            # prepare_threshold=None: no server-side prepared statements, whose cached plan would ignore the
            # SET LOCAL enable_indexscan = off of exact_search (a plan prepared for ANN queries kept the index)
            self.conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
        except psycopg.Error as e:
            from vecgpt.backends.pgvector import scrub

            raise Unavailable(f"cannot connect to PostgreSQL ({scrub(str(e).strip(), dsn)[:80]})") from None
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        register_vector(self.conn)
        self.sql = sql

    def _build(self, vectors):
        self._connect()
        sql, method = self.sql, self.params["method"]
        self.table = sql.SQL("{}.{}").format(sql.Identifier(self.params["schema"]), sql.Identifier(f"wte.ann.{method}"))
        self.index_name = f"wte_ann_{method}_idx"
        c = self.conn
        c.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.params["schema"])))
        c.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.table))
        c.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, embedding vector({}))").format(
                self.table, sql.Literal(vectors.shape[1])
            )
        )
        c.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN embedding SET STORAGE PLAIN").format(self.table))
        with c.cursor().copy(
            sql.SQL("COPY {} (id, embedding) FROM STDIN WITH (FORMAT BINARY)").format(self.table)
        ) as cp:
            cp.set_types(["int8", "vector"])
            for i, v in enumerate(vectors):
                cp.write_row((i, v))
        c.execute(
            f"SET maintenance_work_mem = '1GB'; SET max_parallel_maintenance_workers = {max(self.threads - 1, 0)}"
        )
        if method == "hnsw":
            opts = sql.SQL("WITH (m = {}, ef_construction = {})").format(
                sql.Literal(self.params["m"]), sql.Literal(self.params["ef_construction"])
            )
        else:
            opts = sql.SQL("WITH (lists = {})").format(sql.Literal(self.params["lists"]))
        c.execute(
            sql.SQL("CREATE INDEX {} ON {} USING {} (embedding vector_ip_ops) {}").format(
                sql.Identifier(self.index_name), self.table, sql.SQL(method), opts
            )
        )
        c.execute(sql.SQL("ANALYZE {}").format(self.table))

    def query_sql(self):
        return self.sql.SQL("SELECT id, embedding <#> %s AS d FROM {} ORDER BY embedding <#> %s LIMIT %s").format(
            self.table
        )

    def _run(self, h, k, exact):
        q = as_queries(h)
        ids, scores = no_hits(len(q), k)
        with self.conn.transaction():
            if exact:
                self.conn.execute("SET LOCAL enable_indexscan = off; SET LOCAL enable_bitmapscan = off")
            elif self.params["method"] == "hnsw":
                self.conn.execute(f"SET LOCAL hnsw.ef_search = {max(int(self.params['ef_search']), k)}")
            else:
                self.conn.execute(f"SET LOCAL ivfflat.probes = {int(self.params['probes'])}")
            for i, v in enumerate(q):
                rows = self.conn.execute(self.query_sql(), (v, v, k)).fetchall()
                if rows:
                    ids[i, : len(rows)] = [r[0] for r in rows]
                    scores[i, : len(rows)] = [-r[1] for r in rows]
        return ids, scores

    def search(self, h, k):
        return self._run(h, k, exact=False)

    def exact_search(self, h, k):
        return self._run(h, k, exact=True)

    def explain(self, h, k, exact=False) -> str:
        """The plan PostgreSQL picks for one search (for the test that exact searches never use the index)."""
        with self.conn.transaction():
            if exact:
                self.conn.execute("SET LOCAL enable_indexscan = off; SET LOCAL enable_bitmapscan = off")
            rows = self.conn.execute(
                self.sql.SQL("EXPLAIN ") + self.query_sql(), (as_queries(h)[0], as_queries(h)[0], k)
            )
            return "\n".join(r[0] for r in rows.fetchall())

    def memory_bytes(self):
        return int(
            self.conn.execute(
                "SELECT pg_relation_size(%s::regclass)", (f"{self.params['schema']}.{self.index_name}",)
            ).fetchone()[0]
        )

    def close(self):
        try:
            self.conn.execute(self.sql.SQL("DROP TABLE IF EXISTS {}").format(self.table))
            self.conn.close()
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass


class Turbopuffer(OutputIndex):
    """turbopuffer's ANN: a namespace `<prefix>wte.ann` of its own, queried with rank_by ANN.

    turbopuffer ranks by squared L2 or cosine only, so the documents go through the padding transform
    (vecgpt.encoding, "l2"). Connection options are those of `vecgpt.backends.turbopuffer.connect`
    (base_url / region / prefix; TURBOPUFFER_API_KEY from the environment); base_url = "local" starts
    vecgpt's local server for the run. The writes and the exact
    kNN search (`exact_search`) go through that store; the ANN query is sent on its client. The local
    server (`vecgpt tpuf-local`) answers ANN with an exhaustive scan: its figures are labelled
    "exact (local server)", and only the real service measures turbopuffer's ANN.

    Rows not yet indexed are searched exhaustively, which would make ANN look exact: the build waits
    (at most `index_timeout_s`, reporting progress on stderr) until metadata says the index is up to date.
    """

    kind = "turbopuffer"
    defaults = {"base_url": None, "region": None, "prefix": "vecgpt-", "index_timeout_s": 600.0}
    exact_label = "turbopuffer kNN (exhaustive)"

    @property
    def label(self):
        url = getattr(getattr(self, "store", None), "url", "") or ""
        local = any(h in url for h in ("127.0.0.1", "localhost", "[::1]"))
        return "turbopuffer ANN" + (" (exact: local server)" if local else "")

    def _build(self, vectors):
        try:
            from vecgpt.backends.turbopuffer import connect
        except ImportError as e:
            raise Unavailable(f"turbopuffer needs {e.name}") from None
        from vecgpt.errors import VecgptError

        opts = {k: v for k, v in self.params.items() if v is not None and k != "index_timeout_s"}
        if opts.get("base_url") == "local":  # start vecgpt's local server (exact ANN) for this run
            from vecgpt.backends.turbopuffer.server import Running

            self.server = Running()
            opts["base_url"] = self.server.url
            os.environ.setdefault("TURBOPUFFER_API_KEY", "local")
            os.environ.pop("TURBOPUFFER_REGION", None)
        try:
            self.store = connect(**opts)
            docs, self.m2 = padded(vectors)
            self.store.drop(self.name)
            self.store.create(self.name, docs.shape[1], "l2", attrs=("row",))
            self.store.upsert(self.name, np.arange(len(docs)), docs, {"row": np.arange(len(docs))})
            self.index_wait_s = self.store.wait_indexed(
                self.name, self.params["index_timeout_s"], lambda msg: print(f"  {msg}", file=sys.stderr)
            )
        except VecgptError as e:
            raise Unavailable(f"turbopuffer: {e}") from None

    name = "wte.ann"

    def search(self, h, k):
        q = encoding.encode_queries(as_queries(h), "l2")
        ns = self.store.prefix + self.name
        ids, scores = no_hits(len(q), k)
        for i, v in enumerate(q):
            out = self.store._query(ns, {"rank_by": ["vector", "ANN", v.tolist()], "top_k": k})  # noqa: SLF001
            rows = out.get("rows", [])
            if rows:
                found = np.array([r["id"] for r in rows], np.int64)
                dist = np.array([[r["$dist"] for r in rows]], np.float64)
                ids[i, : len(rows)] = found
                scores[i, : len(rows)] = encoding.decode_dists(dist, v[None], self.m2, "l2")[0]
        return ids, scores

    def exact_search(self, h, k):
        q = encoding.encode_queries(as_queries(h), "l2")
        hits = self.store.search(self.name, q, k=k)
        return hits.ids, encoding.decode_dists(hits.dists, q, self.m2, "l2")

    def close(self):
        if getattr(self, "store", None) is not None:
            try:
                self.store.drop(self.name)
            finally:
                self.store.close()
        if getattr(self, "server", None) is not None:
            self.server.stop()
