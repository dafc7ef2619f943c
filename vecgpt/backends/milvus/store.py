"""The Milvus store: a Milvus collection per vecgpt collection (FLAT index, consistency Strong), searched exactly;
manifests and text records in the store's folder."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from vecgpt.backends import base
from vecgpt.backends._text_log import Rows, last_rows
from vecgpt.backends.base import FolderStore, Metric, record
from vecgpt.backends.milvus.client import decode, encode, every_row, is_lite, milvus_errors, open_client, release
from vecgpt.backends.milvus.requests import (
    Limits,
    id_batches,
    row_batches,
)
from vecgpt.backends.milvus.schema import MAX_PAYLOAD, RESERVED, Info, described, flat_index, schema
from vecgpt.backends.milvus.search import Searching
from vecgpt.errors import VecgptError

CLONE_BATCH = 4096  # rows a clone reads at a time


@base.closes_after_calls
class MilvusStore(Searching, FolderStore):
    metrics: tuple[Metric, ...] = ("l2", "ip")
    backend = "milvus"

    def __init__(self, path: str | None, uri: str | None, prefix: str, timeout: float, limits: Limits | None = None):
        super().__init__(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.uri = uri or str(self.path / "milvus.db")
        self.prefix, self.timeout, self.limits = prefix, timeout, limits or Limits()
        # a server answers requests from several threads at once; Milvus Lite serves them in this process, under
        # its GIL, so threads only add switching
        self.concurrent = not is_lite(self.uri)
        self._client = None  # started by the first request: reading manifests and text records needs none
        self._info: dict[str, Info] = {}
        self._fresh: set[str] = set()  # made by this process and never written: the first write inserts
        self._written: set[str] = set()  # written since the last flush
        self._held_ids: dict[str, np.ndarray] = {}  # a collection's ids, for searches split by id range
        self._lock = threading.Lock()

    def __str__(self) -> str:
        return f"MilvusStore(uri={self.uri})"

    @property
    def client(self):
        with self._lock:
            if self._client is None:
                self._client = open_client(self.uri, self.timeout)
            return self._client

    def _name(self, name: str) -> str:
        return encode(self.prefix, name)

    # collections
    @milvus_errors
    def create(self, name: str, dim: int, metric: Metric, attrs=(), payload: int = 0) -> None:
        base.check_metric(self.backend, metric, self.metrics)
        if set(attrs) & RESERVED:
            raise VecgptError(f"attribute names {sorted(RESERVED)} are reserved")
        self.limits.check_dim(name, dim)
        if payload > MAX_PAYLOAD:
            raise VecgptError(f"collection {name!r}: Milvus keeps at most {MAX_PAYLOAD} floats of payload a row")
        held = self._open(name)
        if held is not None:
            base.check_same(name, (held.dim, held.metric, held.width), dim, metric, payload)
            return
        info = Info(dim, metric, tuple(attrs), payload)
        stored = self._name(name)
        record(3)
        self.client.create_collection(stored, schema=schema(self.client, info), consistency_level="Strong")
        # not waited for: a FLAT index of an empty collection has nothing to build, and pymilvus's wait polls
        # every 0.5 s (a model's 17 collections: 8.5 s of a tiny model's 21 s load)
        self.client.create_index(stored, flat_index(self.client, metric), sync=False)
        self.client.load_collection(stored)
        self._info[name] = info
        self._fresh.add(name)

    def _open(self, name: str) -> Info | None:
        """What this process knows of a collection, read from Milvus the first time; None if there is none."""
        if name in self._info:
            return self._info[name]
        stored = self._name(name)
        record()
        if not self.client.has_collection(stored):
            return None
        record(3)
        info = described(self.client, stored)
        self.client.load_collection(stored)  # a collection made by another process may not be loaded
        self._info[name] = info
        return info

    def _get(self, name: str) -> Info:
        return base.existing(self._open(name), self, name)

    # rows
    @milvus_errors
    def upsert(self, name, ids, vectors, attrs=None, payload=None) -> None:
        info = self._get(name)
        ids, vectors = base.check_rows(name, ids, vectors, info.dim)
        payload = base.check_payload(name, payload, len(ids), info.width)
        if len(ids) == 0:
            return
        ids, vectors, attrs, payload = last_rows(name, Rows(ids, vectors, attrs or {}, payload), list(info.attrs))
        # Milvus's insert keeps both rows of a repeated id: only a collection this process made and never wrote
        # is sure to hold none of them
        write = self.client.insert if name in self._fresh else self.client.upsert
        for part in row_batches(len(ids), info.row_bytes, self.limits):
            rows = [{"id": i, "vector": v} for i, v in zip(ids[part].tolist(), vectors[part])]
            for attr in info.attrs:
                for row, value in zip(rows, attrs[attr][part].tolist()):
                    row[attr] = value
            if info.width:
                for row, values in zip(rows, payload[part]):
                    row["payload"] = values
            record()
            write(self._name(name), rows)
        self._fresh.discard(name)
        self._written.add(name)
        self._held_ids.pop(name, None)

    @milvus_errors
    def fetch(self, name, ids, payload=False):
        info = self._get(name)
        ids = np.asarray(ids, np.int64)
        wanted = np.unique(ids)
        fields = ["vector"] + (["payload"] if payload and info.width else [])
        rows: dict[int, dict] = {}
        for part in id_batches(len(wanted), info.row_bytes, self.limits):
            record()
            for row in self.client.get(self._name(name), ids=wanted[part].tolist(), output_fields=fields):
                rows[int(row["id"])] = row
        base.check_found(name, ids, rows)
        order = ids.tolist()
        vectors = np.array([rows[i]["vector"] for i in order], np.float32).reshape(len(ids), info.dim)
        if not payload:
            return vectors
        if not info.width:
            return vectors, np.zeros((len(ids), 0), np.float32)
        return vectors, np.array([rows[i]["payload"] for i in order], np.float32).reshape(len(ids), info.width)

    @milvus_errors
    def clone(self, src: str, dst: str) -> None:
        """dst: a new collection holding src's rows. Milvus copies no collection inside itself, so the rows pass
        through this process, a batch at a time."""
        info = self._get(src)
        if self._open(dst) is not None:
            raise VecgptError(f"cannot clone {src!r} to {dst!r}: {dst!r} exists; drop it first")
        self.create(dst, info.dim, info.metric, info.attrs, info.width)
        fields = ["vector", *info.attrs] + (["payload"] if info.width else [])
        for rows in every_row(self.client, self._name(src), fields, CLONE_BATCH):
            record()
            self.client.insert(self._name(dst), rows)
        self._fresh.discard(dst)
        self._written.add(dst)

    @milvus_errors
    def count(self, name) -> int:
        self._get(name)
        record()
        return int(self.client.query(self._name(name), filter="", output_fields=["count(*)"])[0]["count(*)"])

    @milvus_errors
    def drop(self, name) -> None:
        self._info.pop(name, None)
        self._held_ids.pop(name, None)
        self._fresh.discard(name)
        self._written.discard(name)
        record()
        self.client.drop_collection(self._name(name))

    @milvus_errors
    def collections(self) -> list[str]:
        record()
        names = (decode(self.prefix, stored) for stored in self.client.list_collections())
        return sorted(name for name in names if name is not None)

    @milvus_errors
    def stats(self) -> dict:
        out = {}
        for name in self.collections():
            documents = self.count(name)
            out[name] = {"documents": documents, "bytes": self._bytes(name, documents)}
        return out

    def _bytes(self, name: str, documents: int) -> int:
        """Milvus Lite: the collection's files; a server: its rows' fields (the server tells no sizes)."""
        if is_lite(self.uri):
            folder = Path(self.uri) / "collections" / self._name(name)
            return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        return documents * self._get(name).row_bytes

    @milvus_errors
    def flush(self) -> None:
        """Seal what was written into segments: Milvus Lite searches rows still in its memtable many times slower."""
        for name in sorted(self._written):
            record()
            self.client.flush(self._name(name))
        self._written.clear()

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
            release(self.uri)
