"""TurbopufferStore: the catalog, search and writes together; every collection a namespace per matrix
(docs/turbopuffer.md)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

from vecgpt.backends import base
from vecgpt.backends.base import TEXT_PREFIX, Metric, is_text, parallel, record
from vecgpt.backends.turbopuffer.catalog import Catalog, check_namespace
from vecgpt.backends.turbopuffer.cost import b64_length
from vecgpt.backends.turbopuffer.loads import Background
from vecgpt.backends.turbopuffer.plumbing import KNN_SLOTS, MAX_SUBQUERIES, MAX_TOP_K, SLOTS, gate_for
from vecgpt.backends.turbopuffer.records import Records
from vecgpt.backends.turbopuffer.search import Searching
from vecgpt.backends.turbopuffer.writes import Writes
from vecgpt.errors import VecgptError


def row_bytes(spec: dict) -> int:
    """A row's vector in every copy, and its payload (base64 of float32, in the first copy only)."""
    return spec["dim"] * 4 * spec["replicas"] + b64_length(spec.get("payload", 0))


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
class TurbopufferStore(Writes, Catalog, Searching, Records):
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

    def search_many(self, searches):
        self._settle()
        return super().search_many(searches)

    def fetch(self, name, ids, payload=False):
        self._settle()
        return super().fetch(name, ids, payload)

    def clone(self, src: str, dst: str) -> None:
        self._settle()
        super().clone(src, dst)

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
