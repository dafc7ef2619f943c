"""TurbopufferStore: the catalog, search and writes together; every collection a namespace per matrix
(docs/turbopuffer.md)."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections import Counter

import numpy as np

from vecgpt.backends import base
from vecgpt.backends.base import TEXT_PREFIX, Metric, check_payload, check_rows, is_text, last_writes, parallel, record
from vecgpt.backends.turbopuffer.catalog import Catalog, check_namespace
from vecgpt.backends.turbopuffer.cost import b64_length
from vecgpt.backends.turbopuffer.loads import Background
from vecgpt.backends.turbopuffer.plumbing import KNN_SLOTS, MAX_SUBQUERIES, MAX_TOP_K, SLOTS, gate_for
from vecgpt.backends.turbopuffer.records import Records
from vecgpt.backends.turbopuffer.search import Searching
from vecgpt.errors import VecgptError

ROW = "__row"  # a column last_writes carries through, never sent
# the payload as base64 of its little-endian float32 bytes, in an unindexed string (half-price storage): bit
# exact, and 4/3 bytes a byte where []float (f64 on the service, ~20 characters a number in JSON) would take 8
# stored and 2.4x the transfer (docs/turbopuffer.md, "Texts")
PAYLOAD_SCHEMA = {"payload": {"type": "string", "filterable": False}}


def row_bytes(spec: dict) -> int:
    """A row's vector in every copy, and its payload (base64 of float32, in the first copy only)."""
    return spec["dim"] * 4 * spec["replicas"] + b64_length(spec.get("payload", 0))


def b64(vectors: np.ndarray) -> list[str]:
    v = np.ascontiguousarray(vectors, "<f4")
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in v]


def _memory_checked(fn, url: str, what: str):
    import turbopuffer as tp

    try:
        return fn()
    except tp.APIStatusError as e:
        if e.status_code != 507:
            raise
        said = str(e.body.get("error", "") if isinstance(e.body, dict) else "").removeprefix("out of memory: ")
        raise VecgptError(
            f"turbopuffer at {url} is out of memory (507 on {what}): {said.splitlines()[0][:300] if said else e}. "
            f"To make room: `vecgpt drop` a model it holds (`vecgpt ls`), or load one copy (replicas = 1) in layout five"
        ) from None


@base.closes_after_calls
class TurbopufferStore(Catalog, Searching, Records):
    metrics: tuple[Metric, ...] = ("l2",)
    concurrent = True  # the engine may send a round's requests at once
    LOAD_NAMESPACES = 8  # a load's upserts written at once (load_lock)
    LOAD_BYTES = 256_000_000  # request bodies a load holds queued at most

    def __init__(
        self,
        client,
        url: str,
        prefix: str = "vecgpt-",
        replicas: int = 1,
        key_replicas: int = 2,
        key_partition: str | None = "head",
        max_top_k: int = MAX_TOP_K,
        slots: int = SLOTS,
        write_batch_mb: float = 8.0,
        clone_with: str = "copy",
    ):
        self.client, self.url, self.prefix = client, url, prefix
        self.replicas, self.key_replicas, self.key_partition = replicas, key_replicas, key_partition
        self.max_top_k, self.slots = max_top_k, slots
        self.write_batch_bytes = int(write_batch_mb * 1e6)
        self.per_request = min(MAX_SUBQUERIES, slots // KNN_SLOTS)
        self.gate = gate_for(url, slots)
        self._handles: dict[str, object] = {}
        self._specs: dict[str, dict] = {}
        self._spans: dict[str, tuple[int, int]] = {}
        self._part_of: dict[str, dict[int, int]] = {}  # collection -> id -> the part this store wrote it to
        self._lock, self._parts_lock = threading.Lock(), threading.Lock()
        self.usage: Counter = Counter()
        self.clone_with, self.last_clone = clone_with, None
        self._loads: Background | None = None  # a load's writes in flight (load_lock)
        self.catalog_ns, self.models_ns, self.texts_ns = prefix + "_catalog", prefix + "_models", prefix + "_texts"
        for ns in (self.catalog_ns, self.models_ns, self.texts_ns):
            check_namespace(ns)

    def __str__(self) -> str:
        return f"TurbopufferStore({self.url}, prefix={self.prefix!r})"

    def _call(self, what: str, namespace: str, fn, missing=VecgptError, conflict_ok=False):
        """Plumbing's, with a server out of memory (507, as `vecgpt tpuf-local` answers) as one line saying what to do."""
        return super()._call(what, namespace, lambda: _memory_checked(fn, self.url, what), missing, conflict_ok)

    def upsert(self, name, ids, vectors, attrs=None, payload=None) -> None:
        spec = self._spec(name)
        ids, vectors = check_rows(name, ids, vectors, spec["dim"])
        if len(ids) and ids.min() < 0:
            raise VecgptError(f"upsert into {name!r}: turbopuffer ids are unsigned; got {ids.min()}")
        width = spec.get("payload", 0)
        payload = check_payload(name, payload, len(ids), width)
        given = {**(attrs or {}), ROW: np.arange(len(ids))}  # which row of the request each kept id came from
        ids, vectors, columns = last_writes(name, ids, vectors, given, [*spec["attrs"], ROW])
        payload = payload[columns.pop(ROW)]
        groups, calls = [(None, np.arange(len(ids)))], []
        if spec["partition"]:
            part = columns[spec["partition"]]
            groups = [(int(p), np.flatnonzero(part == p)) for p in np.unique(part)]
            self._enter_parts(name, spec, [p for p, _ in groups])
            spec = self._specs[name]
            for old, gone in self._moved(name, ids, part).items():  # last write wins: out of the part it left
                for ns in self._replicas(self._base(name, old), spec["replicas"]):
                    calls.append(lambda ns=ns, gone=gone: self._write(ns, "moving rows between parts", deletes=gone))
        per_row = 4 * spec["dim"] * 4 // 3 + 24 + 16 * len(columns) + b64_length(width)
        batch = max(1, self.write_batch_bytes // per_row)
        for part, rows in groups:
            for start in range(0, len(rows), batch):
                sel = rows[start : start + batch]
                body = {
                    "id": ids[sel].tolist(),
                    "vector": b64(vectors[sel]),
                    **{a: c[sel].tolist() for a, c in columns.items()},
                }
                for copy, ns in enumerate(self._replicas(self._base(name, part), spec["replicas"])):
                    self._grown(ns, int(ids[sel].max()) if len(sel) else -1)
                    extra = {} if copy or not width else {"payload": b64(payload[sel])}
                    calls.append(lambda ns=ns, body={**body, **extra}: self._write_rows(ns, body))
        send = lambda: parallel(calls, workers=min(len(calls), 32))  # noqa: E731 (one wave: a few MB on load)
        loads = self._loads
        if loads is None or is_text(name) or not len(ids):
            send()
        else:  # during a load: from the background, with the other collections'
            copies = len(self._replicas(self._base(name), spec["replicas"]))
            loads.submit(name, (int(ids.min()), int(ids.max())), len(ids) * per_row * copies, send)

    @contextlib.contextmanager
    def load_lock(self):
        """Held by loading.push: meanwhile a model collection's upserts are written in the background, up to
        LOAD_NAMESPACES at once, an upsert after any earlier one of the same collection whose ids it meets
        (loads.py). Reads, the manifest and the end of the load wait for them; the first failure is raised there,
        so a failed write leaves no manifest."""
        with self._lock:
            if self._loads is not None:  # already loading in this store: one background
                mine = False
            else:
                mine, self._loads = True, Background(self.LOAD_NAMESPACES, self.LOAD_BYTES)
        if not mine:
            yield
            return
        done = False
        try:
            yield
            self._settle()
            done = True
        finally:
            loads, self._loads = self._loads, None
            loads.close(cancel=not done)  # a failed load sends nothing more

    def _new_spec(self, name: str, spec: dict) -> None:
        """A new collection's catalog row; during a load from the background, ahead of every upsert of it (a span
        of every id), so its rows still never land before it."""
        loads = self._loads
        if loads is None or is_text(name):
            super()._new_spec(name, spec)
            return
        with self._lock:
            self._specs[name] = spec
        loads.submit(name, (-(2**63), 2**64), 0, lambda: self._write_spec(name, spec, "creating a collection"))

    def _settle(self) -> None:
        """Wait for a load's writes queued so far (none outside a load)."""
        loads = self._loads
        if loads is not None:
            loads.wait()

    def search_many(self, searches):
        self._settle()
        return super().search_many(searches)

    def fetch(self, name, ids, payload=False):
        self._settle()
        return super().fetch(name, ids, payload)

    def clone(self, src: str, dst: str) -> None:
        self._settle()
        super().clone(src, dst)

    def _moved(self, name: str, ids: np.ndarray, parts: np.ndarray) -> dict[int, list[int]]:
        """Ids this store wrote to another part of the collection before (the engine never moves a key between
        heads; another process's moves are not seen, and fetch then finds the id twice: an error)."""
        moved: dict[int, list[int]] = {}
        with self._lock:
            held = self._part_of.setdefault(name, {})
            for i, p in zip(ids.tolist(), parts.tolist()):
                if held.get(i, p) != p:
                    moved.setdefault(held[i], []).append(i)
                held[i] = p
        return moved

    def _write_rows(self, ns: str, columns: dict) -> None:
        """One upsert; the payload (first copy only: fetch reads it there) is stored unindexed, at half price."""
        schema = {"schema": PAYLOAD_SCHEMA} if "payload" in columns else {}
        self._write(ns, "upsert", upsert_columns=columns, distance_metric="euclidean_squared", **schema)

    def _grown(self, ns: str, top: int) -> None:
        """Forget a cached id span that an upsert reaching past it makes too short."""
        with self._lock:
            if ns in self._spans and top >= self._spans[ns][1]:
                del self._spans[ns]

    def drop(self, name) -> None:
        """Delete the collection's namespaces (named by the catalog), then its catalog row."""
        self._settle()
        spec = self._spec(name, required=False)
        if spec is not None:
            spaces = [ns for group in self._groups(name, spec) for ns in group]
            parallel([lambda ns=ns: self._delete_namespace(ns) for ns in spaces])
            self._write(self.catalog_ns, "dropping a collection", deletes=[name])
        with self._lock:
            self._specs.pop(name, None)
            self._part_of.pop(name, None)
            for ns in [n for n in self._spans if n == self._base(name) or n.startswith(self._base(name) + "--")]:
                del self._spans[ns]

    def collections(self) -> list[str]:
        return sorted(self._catalog())

    def count(self, name) -> int:
        self._settle()
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
                raise VecgptError(
                    f"turbopuffer has not indexed {name!r} after {timeout_s:.0f} s ({rows:,} rows "
                    f"unindexed); try again later or raise the timeout"
                )
            if progress is not None:
                progress(f"waiting for turbopuffer to index {name!r}: {rows:,} rows unindexed ({waited:.1f} s)")
            time.sleep(pause)
            pause = min(2 * pause, 2.0)

    def stats(self) -> dict:
        specs = self._catalog()
        counts = parallel([lambda n=n: self.count(n) for n in specs])
        return {n: {"documents": c, "bytes": c * row_bytes(specs[n])} for n, c in zip(specs, counts)}

    # manifests: one row per loaded model in <prefix>_models, id = its key (the previous layout kept one
    # row in <prefix>_manifest, which is left alone) ----------------------------------------
    def _manifests(self) -> dict[str, dict]:
        return self._json_rows(self.models_ns, "json", "reading the manifests")

    def read_manifest(self, key: str) -> dict | None:
        return self._manifests().get(key)

    def manifests(self) -> list[str]:
        return sorted(self._manifests())

    def write_manifest(self, key: str, manifest: dict | None) -> None:
        self._settle()  # a manifest marks a load complete: every write before it has landed
        if manifest is None:
            self._write(self.models_ns, "removing a manifest", deletes=[key])
            return
        self._write(
            self.models_ns,
            "writing the manifest",
            upsert_rows=[{"id": key, "json": json.dumps(manifest)}],
            schema={"json": {"type": "string", "filterable": False}},
        )

    # housekeeping ---------------------------------------------------------------------------
    def leftover_texts(self) -> list[dict]:
        """Every text the store holds: its collections `text-<id>` and `text-<id>.<suffix>` as the catalog
        names them (a crashed run leaves them behind; sizes and last write from the namespaces the catalog
        names, no listing) and its record `<id>` if it was kept (version, when written); a text's age is its
        newest write of either."""
        specs = {n: s for n, s in self._catalog().items() if is_text(n)}
        records = {TEXT_PREFIX + r["id"]: r for r in self._record_rows(["version", "written_at"])}
        texts = {n.split(".")[0] for n in specs} | set(records)
        out = []
        for text in sorted(texts):
            names = sorted(n for n in specs if n.split(".")[0] == text)
            metas = [m for n in names for m in self._metas(n, specs[n])]
            record = records.get(text, {})
            out.append(
                {
                    "text": text,
                    "collections": names,
                    "namespaces": len(metas),
                    "documents": sum(int(m.get("approx_row_count", 0)) for m in metas),
                    "bytes": sum(int(m.get("approx_logical_bytes", 0)) for m in metas),
                    "updated_at": max([m.get("updated_at", "") for m in metas] + [record.get("written_at", "")]),
                    "record": record.get("version"),
                }
            )
        return out

    def _metas(self, name: str, spec: dict) -> list[dict]:
        spaces = [ns for group in self._groups(name, spec) for ns in group]
        metas = parallel([lambda ns=ns: self._raw("metadata", ns, "metadata", missing=None) for ns in spaces])
        return [m for m in metas if m]

    def remove_text(self, entry: dict) -> None:
        """`vecgpt tpuf-gc --remove`: a text's record (if the version is still the one listed: TextConflict
        if another process wrote it meanwhile), then its collections (an entry of `leftover_texts`)."""
        if entry["record"] is not None:
            self.write_text(entry["text"][len(TEXT_PREFIX) :], None, expect=entry["record"])
        for name in entry["collections"]:
            self.drop(name)

    def close(self) -> None:
        self.client.close()
