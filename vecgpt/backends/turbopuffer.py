"""turbopuffer: every collection is a namespace, every search an exact kNN query over HTTP.

Layout (namespace per matrix; measured against namespace per vector length in docs/turbopuffer.md):
- collection C -> namespace `<prefix>C`; documents: id = the caller's id, `vector` (float32, written
  base64, `distance_metric="euclidean_squared"`), integer attributes (`row` for matrices).
- `replicas = R` keeps R copies `<prefix>C`, `<prefix>C--r1`, ... so that one search with many query
  vectors (a prompt block) can run R times as many kNN subqueries at once.
- a text's keys (`text-<hex>`, attributes layer/head/position) are partitioned by head:
  `<prefix>text-<hex>--p<head>` (and `--r<i>` copies, `key_replicas`), so the 12 head searches of a
  layer go to 12 namespaces and never queue behind one another.
- `<prefix>_catalog` holds one row per collection (dim, metric, attributes, layout, and for a partitioned
  collection the parts written so far); `<prefix>_manifest` one row with the manifest as a JSON string.
  Every namespace name comes from the catalog, never from a listing: listing needs a key with list
  permission (else 403) and is not documented as consistent. A new part is entered in the catalog
  before its first write, so drop (and `vecgpt tpuf-gc` in another process) finds every namespace.

Search: `rank_by=["vector","kNN",q]` with a filter (kNN requires one: the `Where`, or `id >= 0` to
match every row), `top_k` = k or 10,000 for "every row". A result holding exactly 10,000 rows may be
cut short: that subquery is split by id-range filters and sent again. m query vectors are m subqueries,
sent as multi_query requests of at most 8 (16 concurrency slots per namespace, a kNN subquery takes 2,
and every subquery counts), all at once across replicas and partitions. A process-wide gate keeps at
most 16 slots in flight per namespace, so the adapter does not provoke 429s; the client retries
408/409/429/5xx and dropped connections with backoff anyway (`max_retries`). A create (a catalog row,
an idempotent upsert) that still meets 409 after its retries is taken as done: an earlier attempt landed.

Only "l2" (squared L2): turbopuffer has no inner-product metric. Distances come back as float32 and are
returned as float64 arrays. Auth: TURBOPUFFER_API_KEY only (never printed). Where: `base_url` or
`region` in [store], else TURBOPUFFER_BASE_URL / TURBOPUFFER_REGION.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import os
import re
import threading
import time
from collections import Counter, defaultdict
from typing import Sequence

import numpy as np

from vecgpt.backends.base import Hits, Metric, Search, Where, check_vectors, parallel, record
from vecgpt.errors import VecgptError
from vecgpt.tpuf_cost import PRICES, dollars, estimate_cost  # noqa: F401  (vecgpt load --dry-run, benchmarks)
from vecgpt.tpuf_filters import MATCH_ALL, range_of, strip_range, to_filter, with_range

try:
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover
    _loads = json.loads

MAX_TOP_K = 10_000
MAX_SUBQUERIES = 16
SLOTS = 16
KNN_SLOTS = 2
NAME = re.compile(r"[A-Za-z0-9\-_.]{1,128}\Z")
LAYOUTS = ("namespace-per-matrix",)

class Gate:
    """Concurrency slots in flight per namespace, shared by every store of this process."""

    def __init__(self, slots: int):
        self.slots, self.used, self.cond = slots, Counter(), threading.Condition()

    def acquire(self, namespaces: Sequence[str], need: int) -> str:
        """The least busy of these namespaces (copies of one another), once `need` slots are free there."""
        need = min(need, self.slots)
        with self.cond:
            while True:
                best = min(namespaces, key=lambda n: self.used[n])
                if self.used[best] + need <= self.slots:
                    self.used[best] += need
                    return best
                self.cond.wait()

    def release(self, namespace: str, need: int) -> None:
        with self.cond:
            self.used[namespace] -= min(need, self.slots)
            self.cond.notify_all()


_gates: dict[tuple[str, int], Gate] = {}
_gates_lock = threading.Lock()


def gate_for(url: str, slots: int) -> Gate:
    with _gates_lock:
        return _gates.setdefault((url, slots), Gate(slots))


def b64(vectors: np.ndarray) -> list[str]:
    v = np.ascontiguousarray(vectors, "<f4")
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in v]


class Task:
    """One kNN subquery: query vector `qi` of search `si`, on these replica namespaces, with this filter."""

    __slots__ = ("si", "qi", "replicas", "filter", "limit", "ids", "dists")

    def __init__(self, si, qi, replicas, filt, limit):
        self.si, self.qi, self.replicas, self.filter, self.limit = si, qi, replicas, filt, limit
        self.ids = self.dists = None


class TurbopufferStore:
    metrics: tuple[Metric, ...] = ("l2",)
    concurrent = True  # the engine may send a round's requests at once

    def __init__(self, client, url: str, prefix: str = "vecgpt-", replicas: int = 1, key_replicas: int = 2,
                 key_partition: str | None = "head", max_top_k: int = MAX_TOP_K, slots: int = SLOTS,
                 write_batch_mb: float = 8.0):
        self.client, self.url, self.prefix = client, url, prefix
        self.replicas, self.key_replicas, self.key_partition = replicas, key_replicas, key_partition
        self.max_top_k, self.slots = max_top_k, slots
        self.write_batch_bytes = int(write_batch_mb * 1e6)
        self.per_request = min(MAX_SUBQUERIES, slots // KNN_SLOTS)
        self.gate = gate_for(url, slots)
        self._handles: dict[str, object] = {}
        self._specs: dict[str, dict] = {}
        self._spans: dict[str, tuple[int, int]] = {}
        self._lock, self._parts_lock = threading.Lock(), threading.Lock()
        self.usage: Counter = Counter()
        self.catalog_ns, self.manifest_ns = prefix + "_catalog", prefix + "_manifest"
        for ns in (self.catalog_ns, self.manifest_ns):
            check_namespace(ns)

    def __str__(self) -> str:
        return f"TurbopufferStore({self.url}, prefix={self.prefix!r})"

    # plumbing -----------------------------------------------------------------------------
    def _ns(self, name: str):
        handle = self._handles.get(name)
        if handle is None:
            handle = self._handles[name] = self.client.namespace(name)
        return handle

    def _call(self, what: str, namespace: str, fn, missing=VecgptError, conflict_ok=False):
        """Run one request; turbopuffer's errors become one-line VecgptErrors (the key is never shown)."""
        import turbopuffer as tp

        try:
            return fn()
        except tp.ConflictError:
            if conflict_ok:  # a retried idempotent create: an earlier attempt landed
                return None
            raise VecgptError(f"turbopuffer answered 409 (conflict) on {what} ({namespace!r}) after retries") from None
        except tp.AuthenticationError:
            raise VecgptError(f"turbopuffer at {self.url} rejected the API key (401); "
                              f"check TURBOPUFFER_API_KEY") from None
        except tp.PermissionDeniedError:
            raise VecgptError(f"turbopuffer at {self.url} refused access to namespace {namespace!r} (403); "
                              f"the API key lacks permission") from None
        except tp.NotFoundError:
            if missing is None:
                return None
            raise VecgptError(f"turbopuffer has no namespace {namespace!r} ({what}); "
                              f"is the model loaded (`vecgpt load`)?") from None
        except tp.RateLimitError as e:
            raise VecgptError(f"turbopuffer kept refusing {what} on {namespace!r} with 429 (rate or concurrency "
                              f"limit) after retries: {_detail(e)}") from None
        except tp.APIStatusError as e:
            raise VecgptError(f"turbopuffer error {e.status_code} on {what} ({namespace!r}): {_detail(e)}") from None
        except tp.APIConnectionError as e:
            raise VecgptError(f"cannot reach turbopuffer at {self.url} ({type(e).__name__}); "
                              f"check base_url/region and the network") from None

    def _raw(self, what: str, namespace: str, method: str, missing=VecgptError, conflict_ok=False, **kw):
        resp = self._call(what, namespace, lambda: getattr(self._ns(namespace).with_raw_response, method)(**kw),
                          missing, conflict_ok)
        return None if resp is None else _loads(resp.read())

    def _write(self, namespace: str, what: str = "write", conflict_ok=False, **body) -> dict:
        record()
        out = self._raw(what, namespace, "write", conflict_ok=conflict_ok, **body)
        self._bill(written=(out or {}).get("billing", {}).get("billable_logical_bytes_written", 0), write=True)
        return out

    def _bill(self, written=0, queried=0, returned=0, subqueries=0, write=False) -> None:
        with self._lock:
            if write:
                self.usage["write_requests"] += 1
                self.usage["billed_written"] += max(written, PRICES["min_write_bytes"])
            else:
                self.usage["query_requests"] += 1
                self.usage["subqueries"] += subqueries
                self.usage["billed_queried"] += max(queried, PRICES["min_query_bytes"] * subqueries)
                self.usage["billed_returned"] += returned

    def _query(self, namespace: str, body: dict, what="query", missing=VecgptError, subqueries=1) -> dict | None:
        record(1, subqueries)
        out = self._raw(what, namespace, "multi_query" if "queries" in body else "query", missing=missing, **body)
        if out is not None:
            billing = out.get("billing", {})
            self._bill(queried=billing.get("billable_logical_bytes_queried", 0),
                       returned=billing.get("billable_logical_bytes_returned", 0), subqueries=subqueries)
        return out

    # catalog ------------------------------------------------------------------------------
    def _catalog(self) -> dict[str, dict]:
        out = self._query(self.catalog_ns, {"rank_by": ["id", "asc"], "top_k": self.max_top_k,
                                            "include_attributes": ["spec"]}, "reading the catalog", missing=None)
        specs = {} if out is None else {r["id"]: json.loads(r["spec"]) for r in out.get("rows", [])}
        with self._lock:
            self._specs = dict(specs)
        return specs

    def _spec(self, name: str, required: bool = True) -> dict | None:
        spec = self._specs.get(name)
        if spec is None:
            spec = self._catalog().get(name)
        if spec is None and required:
            raise VecgptError(f"turbopuffer store {self.prefix!r} has no collection {name!r}")
        return spec

    def _base(self, name: str, part=None) -> str:
        return self.prefix + name + ("" if part is None else f"--p{part}")

    def _replicas(self, base: str, n: int) -> list[str]:
        return [base] + [f"{base}--r{i}" for i in range(1, n)]

    def _groups(self, name: str, spec: dict) -> list[list[str]]:
        """The namespaces of a collection, from its catalog entry: per part, the part and its copies."""
        parts = spec.get("parts") if spec["partition"] else [None]
        if parts is None:  # a catalog row written before parts were recorded
            parts = self._listed_parts(name)
        return [self._replicas(self._base(name, p), spec["replicas"]) for p in parts]

    def _listed_parts(self, name: str) -> list[int]:
        base = self._base(name) + "--p"
        record()
        names = self._call("listing namespaces (a catalog entry without parts)", base,
                           lambda: [n.id for n in self.client.namespaces(prefix=base)])
        return sorted({int(m.group(1)) for n in names for m in [re.match(re.escape(base) + r"(\d+)", n)] if m})

    def _owned(self, name: str) -> list[str]:
        """Every namespace that holds part of a collection, as the catalog names them."""
        spec = self._spec(name, required=False)
        return [] if spec is None else [ns for group in self._groups(name, spec) for ns in group]

    def _enter_parts(self, name: str, spec: dict, parts) -> None:
        """Record new parts in the catalog before anything is written to them (so nothing can leak)."""
        with self._parts_lock:
            spec = self._specs.get(name, spec)
            new = sorted(set(parts) - set(spec.get("parts") or []))
            if not new:
                return
            entry = {**spec, "parts": sorted(set(spec.get("parts") or []) | set(new))}
            self._write_spec(name, entry, "recording a collection's parts")

    # collections --------------------------------------------------------------------------
    def create(self, name: str, dim: int, metric: Metric, attrs: Sequence[str] = ()) -> None:
        if metric not in self.metrics:
            raise VecgptError(f"turbopuffer cannot rank by {metric!r}: it offers squared L2 (euclidean_squared) and "
                              f"cosine distance only; use metric = \"l2\"")
        if "--" in name or name.startswith("_") or not NAME.match(name):
            raise VecgptError(f"collection name {name!r}: use [A-Za-z0-9-_.], no '--', not starting with '_'")
        partition = self.key_partition if name.startswith("text-") and self.key_partition in attrs else None
        spec = {"dim": int(dim), "metric": metric, "attrs": list(attrs), "partition": partition,
                "replicas": self.key_replicas if partition else self.replicas}
        for ns in self._replicas(self._base(name, 0 if partition else None), spec["replicas"]):
            check_namespace(ns)
        if partition:
            spec["parts"] = []
        held = self._specs.get(name) or (None if name.startswith("text-") else self._spec(name, required=False))
        if held is not None:
            if (held["dim"], held["metric"]) != (dim, metric):
                raise VecgptError(f"collection {name!r} exists with dim {held['dim']} and metric {held['metric']}")
            return
        self._write_spec(name, spec, "creating a collection")

    def _write_spec(self, name: str, spec: dict, what: str) -> None:
        """Upsert a catalog row (idempotent: a 409 after retries means an earlier attempt landed)."""
        self._write(self.catalog_ns, what, conflict_ok=True, upsert_rows=[{"id": name, "spec": json.dumps(spec)}],
                    schema={"spec": {"type": "string", "filterable": False}})
        with self._lock:
            self._specs[name] = spec

    def upsert(self, name, ids, vectors, attrs=None) -> None:
        spec = self._spec(name)
        vectors = check_vectors(name, vectors, spec["dim"])
        ids = np.asarray(ids, np.int64)
        if len(ids) != len(vectors):
            raise VecgptError(f"upsert into {name!r}: {len(ids)} ids for {len(vectors)} vectors")
        if len(ids) and ids.min() < 0:
            raise VecgptError(f"upsert into {name!r}: turbopuffer ids are unsigned; got {ids.min()}")
        attrs = attrs or {}
        columns = {a: np.asarray(attrs.get(a, np.zeros(len(ids))), np.int64) for a in spec["attrs"]}
        groups = [(None, np.arange(len(ids)))]
        if spec["partition"]:
            part = columns[spec["partition"]]
            groups = [(int(p), np.flatnonzero(part == p)) for p in np.unique(part)]
            self._enter_parts(name, spec, [p for p, _ in groups])
            spec = self._specs[name]
        per_row = 4 * spec["dim"] * 4 // 3 + 24 + 16 * len(columns)
        batch = max(1, self.write_batch_bytes // per_row)
        calls = []
        for part, rows in groups:
            for start in range(0, len(rows), batch):
                sel = rows[start:start + batch]
                body = {"id": ids[sel].tolist(), "vector": b64(vectors[sel]),
                        **{a: c[sel].tolist() for a, c in columns.items()}}
                for ns in self._replicas(self._base(name, part), spec["replicas"]):
                    self._grown(ns, int(ids[sel].max()) if len(sel) else -1)
                    calls.append(lambda ns=ns, body=body: self._write(ns, "upsert", upsert_columns=body,
                                                                       distance_metric="euclidean_squared"))
        parallel(calls, workers=min(len(calls), 32))  # one wave for a key write; a few MB at a time on load

    def _grown(self, ns: str, top: int) -> None:
        """Forget a cached id span that an upsert reaching past it makes too short."""
        with self._lock:
            if ns in self._spans and top >= self._spans[ns][1]:
                del self._spans[ns]

    def drop(self, name) -> None:
        """Delete the collection's namespaces (named by the catalog), then its catalog row."""
        spec = self._spec(name, required=False)
        if spec is not None:
            spaces = [ns for group in self._groups(name, spec) for ns in group]
            parallel([lambda ns=ns: self._delete_namespace(ns) for ns in spaces])
            self._write(self.catalog_ns, "dropping a collection", deletes=[name])
        with self._lock:
            self._specs.pop(name, None)
            for ns in [n for n in self._spans if n == self._base(name) or n.startswith(self._base(name) + "--")]:
                del self._spans[ns]

    def _delete_namespace(self, ns: str) -> None:
        record()
        self._call("delete", ns, lambda: self._ns(ns).delete_all(), missing=None)

    def collections(self) -> list[str]:
        return sorted(self._catalog())

    def count(self, name) -> int:
        spec = self._spec(name)
        bases = [group[0] for group in self._groups(name, spec)]
        return sum(parallel([lambda ns=ns: self._rows(ns) for ns in bases]))

    def _rows(self, ns: str) -> int:
        record()
        meta = self._raw("metadata", ns, "metadata", missing=None)
        return 0 if meta is None else int(meta.get("approx_row_count", 0))

    def wait_indexed(self, name: str, timeout_s: float = 600.0, progress=None) -> float:
        """Wait until every namespace of a collection reports its index up to date (metadata), so that an
        ANN query measures the index, not an exhaustive scan of unindexed rows; the seconds waited.
        `progress(message)` hears about each wait; past `timeout_s` it is an error."""
        spaces, start, pause = self._owned(name), time.monotonic(), 0.05
        while True:
            metas = parallel([lambda ns=ns: self._raw("metadata", ns, "metadata") for ns in spaces])
            behind = [m["index"] for m in metas if m.get("index", {}).get("status", "up-to-date") != "up-to-date"]
            waited = time.monotonic() - start
            if not behind:
                return waited
            rows = sum(int(i.get("unindexed_rows", 0)) for i in behind)
            if waited > timeout_s:
                raise VecgptError(f"turbopuffer has not indexed {name!r} after {timeout_s:.0f} s ({rows:,} rows "
                                  f"unindexed); try again later or raise the timeout")
            if progress is not None:
                progress(f"waiting for turbopuffer to index {name!r}: {rows:,} rows unindexed ({waited:.1f} s)")
            time.sleep(pause)
            pause = min(2 * pause, 2.0)

    def stats(self) -> dict:
        specs = self._catalog()
        counts = parallel([lambda n=n: self.count(n) for n in specs])
        return {n: {"documents": c, "bytes": c * specs[n]["dim"] * 4 * specs[n]["replicas"]}
                for n, c in zip(specs, counts)}

    # search -------------------------------------------------------------------------------
    def search(self, name, queries, k=None, where=None) -> Hits:
        return self.search_many([Search(name, queries, k, where)])[0]

    def search_many(self, searches: Sequence[Search]) -> list[Hits]:
        """Every query vector of every search is one subquery; all of them go out at once."""
        tasks, shapes = [], []
        for si, s in enumerate(searches):
            spec = self._spec(s.collection)
            q = check_vectors(s.collection, s.queries, spec["dim"])
            if s.where is not None:
                unknown = s.where.attributes() - set(spec["attrs"])
                if unknown:
                    raise VecgptError(f"filter on unknown attribute {sorted(unknown)[0]!r}; "
                                      f"{s.collection!r} has {sorted(spec['attrs'])}")
            limit = self.max_top_k if s.k is None or s.k > self.max_top_k else s.k
            shapes.append((q, s.k))
            for replicas, filt in self._targets(s.collection, spec, s.where):
                tasks += [Task(si, qi, replicas, filt, limit) for qi in range(len(q))]
        queries = [q for q, _ in shapes]
        self._run(tasks, queries)
        cut = [t for t in tasks if len(t.ids) >= t.limit and (shapes[t.si][1] is None or shapes[t.si][1] > t.limit)]
        while cut:  # results that may be cut short at the row limit: split by id ranges and ask again
            gone = set(cut)
            tasks = [t for t in tasks if t not in gone]
            more = [piece for t in cut for piece in self._split(t)]
            self._run(more, queries)
            tasks += more
            cut = [t for t in more if len(t.ids) >= t.limit]
        return [self._assemble(si, q, k, [t for t in tasks if t.si == si]) for si, (q, k) in enumerate(shapes)]

    def _targets(self, name: str, spec: dict, where: Where | None) -> list[tuple[list[str], list]]:
        part = spec["partition"]
        if part is None:
            return [(self._replicas(self._base(name), spec["replicas"]), to_filter(where))]
        if where is not None and part in where.eq:
            return [(self._replicas(self._base(name, int(where.eq[part])), spec["replicas"]), to_filter(where, part))]
        return [(group, to_filter(where)) for group in self._groups(name, spec)]

    def _run(self, tasks: list[Task], queries: list[np.ndarray]) -> None:
        groups = defaultdict(list)
        for t in tasks:
            groups[tuple(t.replicas)].append(t)
        calls = []
        for replicas, group in groups.items():
            size = max(1, min(self.per_request, math.ceil(len(group) / len(replicas))))
            for start in range(0, len(group), size):
                chunk = group[start:start + size]
                calls.append(lambda r=list(replicas), c=chunk: self._send(r, c, queries))
        parallel(calls, workers=max(16, min(len(calls), 128)))

    def _send(self, replicas: list[str], chunk: list[Task], queries: list[np.ndarray]) -> None:
        need = KNN_SLOTS * len(chunk)
        subs = [{"rank_by": ["vector", "kNN", queries[t.si][t.qi].tolist()], "top_k": t.limit, "filters": t.filter}
                for t in chunk]
        ns = self.gate.acquire(replicas, need)
        try:
            if len(subs) == 1:
                results = [self._query(ns, subs[0], "search")]
            else:
                results = self._query(ns, {"queries": subs}, "search", subqueries=len(subs))["results"]
        finally:
            self.gate.release(ns, need)
        for t, res in zip(chunk, results):
            rows = res.get("rows", [])
            t.ids = np.fromiter((r["id"] for r in rows), np.int64, len(rows))
            t.dists = np.fromiter((r["$dist"] for r in rows), np.float64, len(rows))

    def _split(self, t: Task) -> list[Task]:
        """Pieces of a subquery that may have been cut at the row limit: id ranges, each asked again."""
        rng = range_of(t.filter)
        if rng is not None:  # a piece that is still too big: halve it
            (lo, hi), pieces = rng, 2
        else:
            lo, hi = self._span(t.replicas[0])
            pieces = max(2, math.ceil(2 * (hi - lo) / t.limit))
        edges = np.unique(np.linspace(lo, hi, pieces + 1).astype(np.int64))
        base = strip_range(t.filter)
        return [Task(t.si, t.qi, t.replicas, with_range(base, a, b), t.limit)
                for a, b in zip(edges[:-1].tolist(), edges[1:].tolist()) if b > a]

    def _span(self, ns: str) -> tuple[int, int]:
        """[0, largest id + 1) of a namespace (one request, then cached)."""
        span = self._spans.get(ns)
        if span is None:
            out = self._query(ns, {"rank_by": ["id", "desc"], "top_k": 1, "filters": MATCH_ALL}, "id range")
            rows = out.get("rows", [])
            span = self._spans[ns] = (0, int(rows[0]["id"]) + 1 if rows else 1)
        return span

    def _assemble(self, si: int, q: np.ndarray, k: int | None, tasks: list[Task]) -> Hits:
        m = len(q)
        per = [[t for t in tasks if t.qi == i] for i in range(m)]
        ids = [np.concatenate([t.ids for t in ts]) if ts else np.zeros(0, np.int64) for ts in per]
        dists = [np.concatenate([t.dists for t in ts]) if ts else np.zeros(0) for ts in per]
        if k is not None:
            for i in range(m):
                order = np.lexsort((ids[i], dists[i]))[:k]
                ids[i], dists[i] = ids[i][order], dists[i][order]
        n = {len(x) for x in ids}
        if len(n) > 1:
            raise VecgptError("turbopuffer returned different row counts for the query vectors of one search "
                              "(the collection changed during it?)")
        return Hits(np.stack(ids) if m else np.zeros((0, 0), np.int64), np.stack(dists) if m else np.zeros((0, 0)))

    def fetch(self, name, ids) -> np.ndarray:
        spec = self._spec(name)
        ids = np.asarray(ids, np.int64)
        wanted = np.unique(ids)
        spaces = self._groups(name, spec) if not spec["partition"] else [[g[0]] for g in self._groups(name, spec)]
        found: dict[int, np.ndarray] = {}

        def get(replicas, chunk):
            ns = self.gate.acquire(replicas, 1)
            try:
                out = self._query(ns, {"rank_by": ["id", "asc"], "top_k": len(chunk), "filters": ["id", "In", chunk],
                                       "include_attributes": ["vector"], "vector_encoding": "base64"}, "fetch")
            finally:
                self.gate.release(ns, 1)
            for r in out.get("rows", []):
                v = r["vector"]
                found[int(r["id"])] = np.frombuffer(base64.b64decode(v), "<f4") if isinstance(v, str) \
                    else np.asarray(v, np.float32)

        parallel([lambda r=r, c=wanted[i:i + self.max_top_k].tolist(): get(r, c)
                  for r in spaces for i in range(0, len(wanted), self.max_top_k)])
        missing = [int(i) for i in wanted if int(i) not in found]
        if missing:
            raise VecgptError(f"collection {name!r} has no id {missing[0]}")
        return np.stack([found[int(i)] for i in ids]).astype(np.float32) if len(ids) else \
            np.zeros((0, spec["dim"]), np.float32)

    # manifest -----------------------------------------------------------------------------
    def read_manifest(self) -> dict | None:
        out = self._query(self.manifest_ns, {"rank_by": ["id", "asc"], "top_k": 1, "include_attributes": ["json"]},
                          "reading the manifest", missing=None)
        rows = [] if out is None else out.get("rows", [])
        return json.loads(rows[0]["json"]) if rows else None

    def write_manifest(self, manifest: dict | None) -> None:
        if manifest is None:
            self._delete_namespace(self.manifest_ns)
            return
        self._write(self.manifest_ns, "writing the manifest", upsert_rows=[{"id": 1, "json": json.dumps(manifest)}],
                    schema={"json": {"type": "string", "filterable": False}})

    # housekeeping ---------------------------------------------------------------------------
    def leftover_texts(self) -> list[dict]:
        """The texts in the catalog (each run's keys; a crashed run leaves them behind), with the size and
        last write of the namespaces the catalog names for them (no listing)."""
        out = []
        for text, spec in sorted(self._catalog().items()):
            if not text.startswith("text-"):
                continue
            spaces = [ns for group in self._groups(text, spec) for ns in group]
            metas = [m for m in parallel([lambda ns=ns: self._raw("metadata", ns, "metadata", missing=None)
                                          for ns in spaces]) if m]
            out.append({"text": text, "namespaces": len(metas),
                        "documents": sum(int(m.get("approx_row_count", 0)) for m in metas),
                        "bytes": sum(int(m.get("approx_logical_bytes", 0)) for m in metas),
                        "updated_at": max((m.get("updated_at", "") for m in metas), default="")})
        return out

    def close(self) -> None:
        self.client.close()


def _detail(e) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        msg = body.get("error") or body.get("message") or body
    else:
        msg = body or str(e)
    return str(msg).splitlines()[0][:300] if str(msg) else type(e).__name__


def check_namespace(ns: str) -> None:
    if not NAME.match(ns):
        raise VecgptError(f"namespace name {ns!r} is not valid for turbopuffer ([A-Za-z0-9-_.], 1 to 128 characters); "
                          f"shorten the prefix")


@functools.lru_cache(maxsize=1)
def bounded_client_class():
    import turbopuffer

    class BoundedClient(turbopuffer.Turbopuffer):
        """Retries wait by the backoff schedule only, never a server's Retry-After (the client honours up to 30
        minutes), so a failing request gives up within base.worst_case_s(timeout, max_retries)."""

        def _parse_retry_after_header(self, response_headers=None):
            return None
    return BoundedClient


def connect(base_url: str | None = None, region: str | None = None, prefix: str = "vecgpt-",
            layout: str = "namespace-per-matrix", replicas: int = 1, key_replicas: int = 2,
            key_partition: str = "head", max_retries: int = 3, compression: bool = False, timeout: float = 5.0,
            max_top_k: int = MAX_TOP_K, slots: int = SLOTS, write_batch_mb: float = 8.0) -> TurbopufferStore:
    import turbopuffer

    if layout not in LAYOUTS:
        raise VecgptError(f"layout {layout!r} is not offered; use {LAYOUTS[0]!r} "
                          f"(namespace per vector length was measured and dropped: see docs/turbopuffer.md)")
    if replicas < 1 or key_replicas < 1 or not 1 <= max_top_k <= MAX_TOP_K or slots < KNN_SLOTS:
        raise VecgptError("replicas and key_replicas must be >= 1, max_top_k within 1..10000, slots >= 2")
    if not timeout > 0 or max_retries < 0:
        raise VecgptError(f"timeout must be > 0 and max_retries >= 0 (got {timeout}, {max_retries}); a request gives up "
                          f"after at most (max_retries + 1) * timeout plus backoff")
    key = os.environ.get("TURBOPUFFER_API_KEY")
    if not key:
        raise VecgptError("set TURBOPUFFER_API_KEY (any string for a local server: vecgpt tpuf-local)")
    if base_url is None and region is None:
        base_url = os.environ.get("TURBOPUFFER_BASE_URL")
        region = None if base_url else os.environ.get("TURBOPUFFER_REGION")
        if base_url is None and region is None:
            raise VecgptError("say where turbopuffer is: base_url or region in [store], or TURBOPUFFER_BASE_URL / "
                              "TURBOPUFFER_REGION (e.g. gcp-us-central1)")
    if base_url and "{region}" not in base_url:
        region = None
        if os.environ.get("TURBOPUFFER_REGION"):  # the client would take it and refuse this base URL
            raise VecgptError(f"TURBOPUFFER_REGION is set but base_url {base_url} has no {{region}}; unset it")
    try:
        client = bounded_client_class()(api_key=key, region=region, base_url=base_url, max_retries=max_retries,
                               compression=compression, timeout=timeout)
    except turbopuffer.TurbopufferError as e:
        raise VecgptError(f"turbopuffer client: {e}") from None
    url = str(client.base_url).rstrip("/")
    return TurbopufferStore(client, url, prefix, replicas, key_replicas, key_partition or None, max_top_k, slots,
                            write_batch_mb)
