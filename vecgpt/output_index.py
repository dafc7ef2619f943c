"""The output layer as an approximate maximum-inner-product search (issue 7; Loretz et al. 2026).

GPT-2's last step scores the final vector h = ln_f(x) against all V token vectors (`h @ wte.T`) and
keeps the best few. Here an ANN index over the token vectors returns `k` candidates instead, a short
list of always-scored tokens (special and very frequent ones) is added, and every candidate is
rescored exactly. So:

- `OutputIndex.search(h [m, d], k) -> (ids [m, k] int64, scores [m, k] float64)`: the index's own
  candidates and the scores *as the index reports them* (`exact_scores` says whether those are the
  true inner products up to float32 rounding: True for HNSW/IVF-flat kinds, False for PQ/SQ
  kinds, whose scores come from compressed codes). Missing slots (an index that found fewer than
  k) have id -1 and score -inf.
- `Head.candidates(h)`: what decoding uses. The union of the index's candidates and the frequent
  tokens, each scored exactly as float64(wte[id]) . float64(h), ordered best first like
  `vecgpt.sampling.top_k` (ties to the lowest id). The index's scores only choose candidates.

Inner product is used directly by every kind here (hnswlib space "ip", FAISS METRIC_INNER_PRODUCT,
LanceDB "dot", pgvector `vector_ip_ops`). hnswlib and FAISS HNSW also take `transform = "padded"`:
the padding transform of `vecgpt.encoding` (documents (w, 0, sqrt(M^2 - |w|^2)), queries (h, 1, 0),
squared L2), which turns MIPS into a nearest-neighbour search on vectors of one length.

ANN indexes live in their own collections (a LanceDB table `wte_ann_<type>` in their own folder, a
pgvector table `<schema>."wte.ann.<method>"`, a turbopuffer namespace `<prefix>wte.ann`), never on a store's `wte`, so the exact searches of
every other command cannot use them.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from vecgpt import encoding
from vecgpt.sampling import Candidates, ordered


class Unavailable(Exception):
    """This index kind cannot run here (a missing library or server); the message says why."""


class OutputIndex:
    kind = "?"
    search_params: tuple[str, ...] = ()  # parameters set per search; the rest are build parameters
    defaults: dict = {}
    exact_scores = True
    exact_label = "exact"  # what exact_search is, for tables

    def __init__(self, threads: int = 2, **params):
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise ValueError(f"index kind {self.kind!r} takes no parameter {sorted(unknown)[0]!r}; "
                             f"it takes {', '.join(sorted(self.defaults))}")
        self.params = {**self.defaults, **params}
        self.threads = threads
        self.build_seconds: float | None = None

    @property
    def label(self) -> str:
        return self.kind + " " + " ".join(f"{k}={v}" for k, v in self.params.items() if k not in ("path", "dsn"))

    def build(self, vectors: np.ndarray) -> "OutputIndex":
        vectors = np.ascontiguousarray(vectors, np.float32)
        self.n, self.dim = vectors.shape
        t = time.perf_counter()
        self._build(vectors)
        self.build_seconds = time.perf_counter() - t
        return self

    def set(self, **search) -> None:
        unknown = set(search) - set(self.search_params)
        if unknown:
            raise ValueError(f"{sorted(unknown)[0]!r} is not a search parameter of {self.kind!r}")
        self.params.update(search)

    def search(self, h: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def exact_search(self, h: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The same store's exact search (a flat scan), for latency comparisons."""
        raise NotImplementedError

    def memory_bytes(self) -> int | None:
        return None

    def close(self) -> None:
        pass

    def _build(self, vectors):
        raise NotImplementedError


def _queries(h) -> np.ndarray:
    h = np.asarray(h, np.float32)
    return np.ascontiguousarray(h[None] if h.ndim == 1 else h)


def _padded(vectors):  # documents (w, 0, pad) and their M^2; see vecgpt.encoding
    return encoding.encode_rows(vectors.T, None, "l2")


class Hnswlib(OutputIndex):
    """hnswlib HNSW, the paper's index (M=32, ef 100-400; it builds with ef_construction 5000)."""

    kind = "hnswlib"
    search_params = ("ef",)
    defaults = {"M": 32, "ef_construction": 200, "ef": 200, "transform": "ip"}

    def _build(self, vectors):
        import hnswlib

        self.vectors = vectors
        if self.params["transform"] == "padded":
            docs, self.m2 = _padded(vectors)
            space = "l2"
        else:
            docs, space = vectors, "ip"
        self.index = hnswlib.Index(space=space, dim=docs.shape[1])
        self.index.init_index(max_elements=len(docs), M=self.params["M"], ef_construction=self.params["ef_construction"],
                              random_seed=0)
        self.index.add_items(docs, np.arange(len(docs)), num_threads=self.threads)
        self.exact = None

    def search(self, h, k):
        q = _queries(h)
        self.index.set_ef(max(self.params["ef"], k))
        if self.params["transform"] == "padded":
            q = encoding.encode_queries(q, "l2")
            ids, d = self.index.knn_query(q, k=k, num_threads=1)
            return ids.astype(np.int64), encoding.decode_dists(d, q, self.m2, "l2")
        ids, d = self.index.knn_query(q, k=k, num_threads=1)
        return ids.astype(np.int64), 1.0 - d.astype(np.float64)  # hnswlib's "ip" distance is 1 - x.y

    exact_label = "hnswlib BFIndex (ip)"

    def exact_search(self, h, k):
        import hnswlib

        if self.exact is None:
            self.exact = hnswlib.BFIndex(space="ip", dim=self.dim)
            self.exact.init_index(max_elements=self.n)
            self.exact.add_items(self.vectors, np.arange(self.n))
        ids, d = self.exact.knn_query(_queries(h), k=k, num_threads=1)
        return ids.astype(np.int64), 1.0 - d.astype(np.float64)

    def memory_bytes(self):
        with tempfile.TemporaryDirectory() as tmp:  # hnswlib's file is its memory layout
            path = os.path.join(tmp, "index.bin")
            self.index.save_index(path)
            return os.path.getsize(path)


class _Faiss(OutputIndex):
    exact_label = "FAISS IndexFlatIP"

    def _make(self, dim):
        raise NotImplementedError

    def _build(self, vectors):
        import faiss

        faiss.omp_set_num_threads(self.threads)
        self.vectors = vectors
        docs = vectors
        if self.params.get("transform") == "padded":
            docs, self.m2 = _padded(vectors)
        self.index = self._make(docs.shape[1])
        if not self.index.is_trained:
            rng = np.random.default_rng(0)
            train = docs if len(docs) <= 20000 else docs[rng.choice(len(docs), 20000, replace=False)]
            self.index.train(train)
        self.index.add(docs)
        self.flat = None

    def _search_params(self):
        return None

    def search(self, h, k):
        import faiss

        faiss.omp_set_num_threads(1)  # batch-1 latency: one thread, as the paper measures
        q = _queries(h)
        if self.params.get("transform") == "padded":
            q = encoding.encode_queries(q, "l2")
            d, ids = self.index.search(q, k, params=self._search_params())
            scores = encoding.decode_dists(d, q, self.m2, "l2")
        else:
            d, ids = self.index.search(q, k, params=self._search_params())
            scores = d.astype(np.float64)
        faiss.omp_set_num_threads(self.threads)
        return ids.astype(np.int64), np.where(ids < 0, -np.inf, scores)

    def exact_search(self, h, k):
        import faiss

        if self.flat is None:
            self.flat = faiss.IndexFlatIP(self.dim)
            self.flat.add(self.vectors)
        faiss.omp_set_num_threads(1)
        d, ids = self.flat.search(_queries(h), k)
        faiss.omp_set_num_threads(self.threads)
        return ids.astype(np.int64), d.astype(np.float64)

    def memory_bytes(self):
        import faiss

        return int(faiss.serialize_index(self.index).nbytes)


class FaissHNSW(_Faiss):
    kind = "faiss-hnsw"
    search_params = ("ef",)
    defaults = {"M": 32, "ef_construction": 200, "ef": 200, "transform": "ip"}

    def _make(self, dim):
        import faiss

        metric = faiss.METRIC_L2 if self.params["transform"] == "padded" else faiss.METRIC_INNER_PRODUCT
        index = faiss.IndexHNSWFlat(dim, self.params["M"], metric)
        index.hnsw.efConstruction = self.params["ef_construction"]
        return index

    def _search_params(self):
        import faiss

        return faiss.SearchParametersHNSW(efSearch=self.params["ef"])


class FaissIVF(_Faiss):
    kind = "faiss-ivf"
    search_params = ("nprobe",)
    defaults = {"nlist": 256, "nprobe": 16}

    def _make(self, dim):
        import faiss

        self.quantizer = faiss.IndexFlatIP(dim)
        return faiss.IndexIVFFlat(self.quantizer, dim, self.params["nlist"], faiss.METRIC_INNER_PRODUCT)

    def _search_params(self):
        import faiss

        return faiss.SearchParametersIVF(nprobe=self.params["nprobe"])


class FaissIVFPQ(FaissIVF):
    kind = "faiss-ivfpq"
    exact_scores = False  # distances from 8-bit product-quantised codes
    defaults = {"nlist": 256, "nprobe": 16, "m": 48, "nbits": 8}

    def _make(self, dim):
        import faiss

        if dim % self.params["m"]:
            raise Unavailable(f"faiss-ivfpq: dimension {dim} is not divisible by m={self.params['m']}")
        self.quantizer = faiss.IndexFlatIP(dim)
        return faiss.IndexIVFPQ(self.quantizer, dim, self.params["nlist"], self.params["m"], self.params["nbits"],
                                faiss.METRIC_INNER_PRODUCT)


class Lance(OutputIndex):
    """A LanceDB table `wte_ann_<type>` of its own, with an ANN index on it (metric "dot").

    index_type: IVF_FLAT, IVF_PQ, IVF_HNSW_SQ, IVF_HNSW_PQ. LanceDB's "dot" distance is 1 - x.y in
    float32. exact_search is a flat scan of the same table (bypass_vector_index).
    """

    kind = "lancedb"
    search_params = ("nprobes", "refine_factor", "ef")
    defaults = {"index_type": "IVF_HNSW_SQ", "num_partitions": 64, "num_sub_vectors": 48, "m": 20,
                "ef_construction": 150, "nprobes": 16, "refine_factor": 0, "ef": 200, "path": None}
    exact_label = "LanceDB flat scan"

    @property
    def label(self):
        t = self.params["index_type"]
        keep = ["num_partitions", "nprobes"] + (["num_sub_vectors"] if "PQ" in t else []) + \
            (["m", "ef_construction", "ef"] if "HNSW" in t else []) + (["refine_factor"] if self.params["refine_factor"] else [])
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
        table = pa.table({"id": pa.array(np.arange(len(vectors)), pa.int64()),
                          "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel(), pa.float32()),
                                                                      vectors.shape[1])})
        self.table = self.db.create_table(self.name, table, mode="overwrite")
        options = {"metric": "dot", "vector_column_name": "vector", "index_type": kind, "replace": True,
                   "num_partitions": self.params["num_partitions"]}
        if "PQ" in kind:
            options["num_sub_vectors"] = self.params["num_sub_vectors"]
        if "HNSW" in kind:
            options.update(m=self.params["m"], ef_construction=self.params["ef_construction"])
        self.table.create_index(**options)
        self.path = path

    def _query(self, q, k):
        return self.table.search(q, vector_column_name="vector").distance_type("dot").limit(k).select(["id", "_distance"])

    def search(self, h, k):
        q = _queries(h)
        ids, scores = np.full((len(q), k), -1, np.int64), np.full((len(q), k), -np.inf)
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
        q = _queries(h)
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
    defaults = {"method": "hnsw", "m": 16, "ef_construction": 64, "lists": 224, "ef_search": 200, "probes": 16,
                "dsn": None, "schema": "vecgpt_ann"}
    exact_label = "pgvector sequential scan"

    @property
    def label(self):
        keep = ("m", "ef_construction", "ef_search") if self.params["method"] == "hnsw" else ("lists", "probes")
        return f"pgvector {self.params['method']} " + " ".join(f"{k}={self.params[k]}" for k in keep)

    def _build(self, vectors):
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
            raise Unavailable(f"cannot connect to PostgreSQL ({str(e).strip()[:80]})") from None
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        register_vector(self.conn)
        self.sql = sql
        method = self.params["method"]
        self.table = sql.SQL("{}.{}").format(sql.Identifier(self.params["schema"]), sql.Identifier(f"wte.ann.{method}"))
        self.index_name = f"wte_ann_{method}_idx"
        c = self.conn
        c.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.params["schema"])))
        c.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.table))
        c.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, embedding vector({}))").format(
            self.table, sql.Literal(vectors.shape[1])))
        c.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN embedding SET STORAGE PLAIN").format(self.table))
        with c.cursor().copy(sql.SQL("COPY {} (id, embedding) FROM STDIN WITH (FORMAT BINARY)").format(self.table)) as cp:
            cp.set_types(["int8", "vector"])
            for i, v in enumerate(vectors):
                cp.write_row((i, v))
        c.execute(f"SET maintenance_work_mem = '1GB'; SET max_parallel_maintenance_workers = {max(self.threads - 1, 0)}")
        if method == "hnsw":
            opts = sql.SQL("WITH (m = {}, ef_construction = {})").format(sql.Literal(self.params["m"]),
                                                                         sql.Literal(self.params["ef_construction"]))
        else:
            opts = sql.SQL("WITH (lists = {})").format(sql.Literal(self.params["lists"]))
        c.execute(sql.SQL("CREATE INDEX {} ON {} USING {} (embedding vector_ip_ops) {}").format(
            sql.Identifier(self.index_name), self.table, sql.SQL(method), opts))
        c.execute(sql.SQL("ANALYZE {}").format(self.table))

    def query_sql(self):
        return self.sql.SQL("SELECT id, embedding <#> %s AS d FROM {} ORDER BY embedding <#> %s LIMIT %s").format(self.table)

    def _run(self, h, k, exact):
        q = _queries(h)
        ids, scores = np.full((len(q), k), -1, np.int64), np.full((len(q), k), -np.inf)
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
                    ids[i, :len(rows)] = [r[0] for r in rows]
                    scores[i, :len(rows)] = [-r[1] for r in rows]
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
            rows = self.conn.execute(self.sql.SQL("EXPLAIN ") + self.query_sql(), (_queries(h)[0], _queries(h)[0], k))
            return "\n".join(r[0] for r in rows.fetchall())

    def memory_bytes(self):
        return int(self.conn.execute("SELECT pg_relation_size(%s::regclass)",
                                     (f'{self.params["schema"]}.{self.index_name}',)).fetchone()[0])

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
    """

    kind = "turbopuffer"
    defaults = {"base_url": None, "region": None, "prefix": "vecgpt-"}
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

        opts = {k: v for k, v in self.params.items() if v is not None}
        if opts.get("base_url") == "local":  # start vecgpt's local server (exact ANN) for this run
            from vecgpt.tpuf_local import Running

            self.server = Running()
            opts["base_url"] = self.server.url
            os.environ.setdefault("TURBOPUFFER_API_KEY", "local")
            os.environ.pop("TURBOPUFFER_REGION", None)
        try:
            self.store = connect(**opts)
            docs, self.m2 = _padded(vectors)
            self.store.drop(self.name)
            self.store.create(self.name, docs.shape[1], "l2", attrs=("row",))
            self.store.upsert(self.name, np.arange(len(docs)), docs, {"row": np.arange(len(docs))})
        except VecgptError as e:
            raise Unavailable(f"turbopuffer: {e}") from None

    name = "wte.ann"

    def search(self, h, k):
        q = encoding.encode_queries(_queries(h), "l2")
        ns = self.store.prefix + self.name
        ids, scores = np.full((len(q), k), -1, np.int64), np.full((len(q), k), -np.inf)
        for i, v in enumerate(q):
            out = self.store._query(ns, {"rank_by": ["vector", "ANN", v.tolist()], "top_k": k})  # noqa: SLF001
            rows = out.get("rows", [])
            if rows:
                found = np.array([r["id"] for r in rows], np.int64)
                dist = np.array([[r["$dist"] for r in rows]], np.float64)
                ids[i, :len(rows)] = found
                scores[i, :len(rows)] = encoding.decode_dists(dist, v[None], self.m2, "l2")[0]
        return ids, scores

    def exact_search(self, h, k):
        q = encoding.encode_queries(_queries(h), "l2")
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


KINDS = {cls.kind: cls for cls in (Hnswlib, FaissHNSW, FaissIVF, FaissIVFPQ, Lance, Pgvector, Turbopuffer)}


def make(kind: str, threads: int = 2, **params) -> OutputIndex:
    if kind not in KINDS:
        raise ValueError(f"unknown index kind {kind!r}; known: {', '.join(KINDS)}")
    return KINDS[kind](threads=threads, **params)


def expand(entry: dict) -> list[tuple[dict, list[dict]]]:
    """A grid entry (lists mean "each of") as [(build params, [search params, ...]), ...]."""
    kind = entry["kind"]
    searchable = KINDS[kind].search_params if kind in KINDS else ()
    listed = {k: v if isinstance(v, list) else [v] for k, v in entry.items() if k != "kind"}
    build_keys = [k for k in listed if k not in searchable]
    search_keys = [k for k in listed if k in searchable]
    out = []
    for b in itertools.product(*(listed[k] for k in build_keys)):
        searches = [dict(zip(search_keys, s)) for s in itertools.product(*(listed[k] for k in search_keys))]
        out.append((dict(zip(build_keys, b)), searches))
    return out


class Head:
    """The output layer through an index: k candidates plus the always-scored tokens, rescored exactly."""

    def __init__(self, index: OutputIndex, vectors: np.ndarray, k: int = 50, always: np.ndarray | None = None):
        self.index, self.k = index, k
        self.vectors = np.asarray(vectors, np.float32)
        self.always = np.unique(np.asarray([] if always is None else always, np.int64))
        self.always = self.always[self.always < len(self.vectors)]

    def candidates(self, h: np.ndarray) -> Candidates:
        """Candidates for one final vector h [d], best first, with exact float64 logits."""
        ids, _ = self.index.search(h, self.k)
        return self._rescore(ids[0], h)

    def candidates_many(self, H: np.ndarray) -> tuple[np.ndarray, list[Candidates]]:
        """The index's raw ids [m, k] (one batched search) and the Candidates of every row of H [m, d]."""
        raw, _ = self.index.search(H, self.k)
        return raw, [self._rescore(r, h) for r, h in zip(raw, H)]

    def _rescore(self, found, h) -> Candidates:
        ids = np.union1d(found[found >= 0], self.always)
        return ordered(ids, self.vectors[ids].astype(np.float64) @ np.asarray(h, np.float64).ravel())


def final_hidden(ref, ids) -> np.ndarray:
    """Feed tokens to a `vecgpt.reference.Reference`; ln_f of the new positions [m, d], before the output product."""
    from vecgpt.reference import layer_norm, transformer_block

    p, hp = ref.params, ref.hparams
    ids = np.asarray(ids, np.int64)
    start = ref.position
    x = p["wte"]["weight"][ids] + p["wpe"]["weight"][start:start + len(ids)]
    for block, cache in zip(p["h"], ref.caches):
        x = transformer_block(x, block["ln_1"], block["attn"], block["ln_2"], block["mlp"], hp.n_head, hp.eps, cache)
    return layer_norm(x, **p["ln_f"], eps=hp.eps)


class AnnReader:
    """A reader for `vecgpt.api.generate`: the numpy reference body with the output layer through a Head.

    Greedy decoding, temperature and top-k sampling run unchanged on its Candidates: the softmax
    is over the candidates only, so tokens outside them can never be drawn.
    """

    def __init__(self, ref, head: Head):
        self.ref, self.head = ref, head

    def read(self, ids, k: int = 40) -> Candidates:
        return self.head.candidates(final_hidden(self.ref, ids)[-1])
