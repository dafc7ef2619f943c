"""One namespace in memory: ids, float32 vectors (`vectors.Rows`), attribute columns; upsert, delete, columns
for filters. Also the decoding of a write's vector column (lists or base64 `<f4`) into one float32 array."""

from __future__ import annotations

import base64
import threading
import time
from datetime import datetime, timezone

import numpy as np

from vecgpt.backends.turbopuffer.server import filters
from vecgpt.backends.turbopuffer.server.limits import MAX_DIMS, METRICS, ApiError, valid_id, value_bytes
from vecgpt.backends.turbopuffer.server.vectors import Rows, squared_norms


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Namespace:
    """One namespace: ids, float32 vectors, attribute columns."""

    def __init__(self, name: str):
        self.name = name
        self.ids: list = []
        self.slot_of: dict = {}
        self.dim: int | None = None
        self.metric: str | None = None
        self.rows: Rows | None = None  # the vectors, once the first arrives
        self.attrs: dict[str, list] = {}
        self.types: dict[str, str] = {}
        self.schema_extra: dict = {}
        self.attr_bytes = 0
        self.created_at = self.updated_at = now()
        self.version = 0
        self.unindexed, self.indexed_at = 0, 0.0  # rows written since the index last caught up, and when it will
        self.lock = threading.RLock()
        self._columns: dict = {}

    @property
    def n(self) -> int:
        return len(self.ids)

    def logical_bytes(self) -> int:
        return self.n * (8 + 4 * (self.dim or 0)) + self.attr_bytes

    # writes -------------------------------------------------------------------------------
    def set_metric(self, metric, needed: bool) -> None:
        if metric is not None:
            if metric not in METRICS:
                raise ApiError(400, f"unknown distance_metric {metric!r}; expected one of {list(METRICS)}")
            if self.metric is not None and metric != self.metric:
                raise ApiError(400, f"namespace {self.name} uses distance_metric {self.metric!r}, not {metric!r}")
            self.metric = metric
        elif needed and self.metric is None:
            raise ApiError(400, "distance_metric is required when writing vectors to a new namespace")

    def upsert(self, ids: list, vectors: np.ndarray | None, attrs: dict[str, list]) -> None:
        """Write the rows; the last write of an id in `ids` wins. Every array is allocated before anything
        changes, so out of memory (MemoryError) leaves the namespace as it was."""
        self._check_vectors(vectors, ids)
        self._check_attrs(attrs)
        ids = [valid_id(i) for i in ids]
        if ids and self.ids and type(ids[0]) is not type(self.ids[0]):
            raise ApiError(400, "a namespace cannot mix id types")
        order = list({i: r for r, i in enumerate(ids)}.values())
        if vectors is not None:
            vectors = vectors if len(order) == len(ids) else vectors[np.asarray(order, np.int64)]
            norms = squared_norms(vectors)
            self.rows.reserve(self.n + sum(ids[r] not in self.slot_of for r in order), self.n)
        slots = self._place(ids, order, attrs)
        if vectors is not None:
            self.rows.put(np.asarray(slots, np.int64), vectors, norms)
        self._set_attrs(attrs, order, slots)
        self._touch()

    def patch(self, ids: list, attrs: dict[str, list]) -> int:
        """Set the given attributes of the documents held; ids not held are ignored. The rows patched."""
        self._check_attrs(attrs)
        for name in attrs:
            self.attrs.setdefault(name, [None] * self.n)
        done = 0
        for r, i in enumerate(valid_id(i) for i in ids):
            s = self.slot_of.get(i)
            if s is None:
                continue
            done += 1
            for name, given in attrs.items():
                col = self.attrs[name]
                self.attr_bytes += value_bytes(given[r]) - value_bytes(col[s])
                col[s] = given[r]
        self._touch()
        return done

    def _check_attrs(self, attrs: dict[str, list]) -> None:
        for name, column in attrs.items():
            if name.startswith("$") or len(name.encode()) > 128:
                raise ApiError(400, f"invalid attribute name {name!r}")
            self._note_type(name, column)

    def _check_vectors(self, vectors: np.ndarray | None, ids: list) -> None:
        if vectors is not None:
            if vectors.ndim != 2 or vectors.shape[1] == 0:
                raise ApiError(400, "vectors must be non-empty arrays of floats")
            dim = vectors.shape[1]
            if dim > MAX_DIMS:
                raise ApiError(400, f"vector has {dim} dimensions; the limit is {MAX_DIMS}")
            if self.dim is None:
                self.dim, self.rows = dim, Rows(dim)
            elif dim != self.dim:
                raise ApiError(
                    400, f"vector dimension mismatch: namespace {self.name} holds [{self.dim}]f32, got [{dim}]"
                )
        elif self.dim is not None and ids:
            raise ApiError(400, f"namespace {self.name} has a vector column; every upserted document needs a vector")

    def _place(self, ids: list, order: list, attrs: dict) -> list:
        """The slots of the request's rows `order` (those kept): new ids are appended."""
        slots = [self.slot_of.get(ids[r], -1) for r in order]
        new_rows = [r for r, s in zip(order, slots) if s < 0]
        for name in set(attrs) | set(self.attrs):
            self.attrs.setdefault(name, [None] * self.n)
        start = self.n
        for r in new_rows:
            self.slot_of[ids[r]] = len(self.ids)
            self.ids.append(ids[r])
            for col in self.attrs.values():
                col.append(None)
        return [s if s >= 0 else start + k for s, k in zip(slots, _count_new(slots))]

    def _set_attrs(self, attrs: dict, order: list, slots: list) -> None:
        for name, col in self.attrs.items():
            given = attrs.get(name)
            for r, s in zip(order, slots):
                old = col[s]
                new = None if given is None else given[r]
                self.attr_bytes += value_bytes(new) - value_bytes(old)
                col[s] = new

    def _note_type(self, name, column) -> None:
        for v in column:
            if v is None:
                continue
            t = (
                "bool"
                if isinstance(v, bool)
                else "int"
                if isinstance(v, int)
                else "float"
                if isinstance(v, float)
                else "string"
                if isinstance(v, str)
                else "[]" + _element_type(v)
                if isinstance(v, list)
                else None
            )
            if t is None:
                raise ApiError(400, f"attribute {name!r}: unsupported value {v!r}")
            self.types.setdefault(name, t)
            break

    def delete(self, ids: list) -> int:
        done = 0
        for i in ids:
            s = self.slot_of.pop(i, None)
            if s is None:
                continue
            done += 1
            self._remove(s)
        if self.rows is not None:
            self.rows.truncate(self.n)
        self._touch()
        return done

    def _remove(self, s: int) -> None:
        last = self.n - 1
        for col in self.attrs.values():
            self.attr_bytes -= value_bytes(col[s])
        if s != last:  # move the last row into the hole
            moved = self.ids[last]
            self.ids[s] = moved
            self.slot_of[moved] = s
            if self.rows is not None:
                self.rows.move(last, s)
            for col in self.attrs.values():
                col[s] = col[last]
        self.ids.pop()
        for col in self.attrs.values():
            col.pop()

    def _touch(self) -> None:
        self.version += 1
        self._columns = {}
        self.updated_at = now()

    def note_write(self, rows: int, lag_s: float) -> None:
        """Rows just written wait `lag_s` (from this write) for the index; a later write restarts the wait."""
        if lag_s and rows:
            self.index_status()
            self.unindexed += rows
            self.indexed_at = time.monotonic() + lag_s

    def index_status(self) -> dict:
        """metadata's `index`: "updating" with the unindexed rows until the lag has passed."""
        if self.unindexed and time.monotonic() < self.indexed_at:
            return {
                "status": "updating",
                "unindexed_rows": self.unindexed,
                "unindexed_bytes": self.unindexed * (8 + 4 * (self.dim or 0)),
            }
        self.unindexed = 0
        return {"status": "up-to-date"}

    # reads --------------------------------------------------------------------------------
    def column(self, name: str):
        """(values, present) for an attribute or `id`: int64 where every value is an int, else objects."""
        cached = self._columns.get(name)
        if cached is not None:
            return cached
        raw = self.ids if name == "id" else self.attrs.get(name, [None] * self.n)
        present = np.fromiter((v is not None for v in raw), bool, len(raw))
        if all(isinstance(v, int) and not isinstance(v, bool) for v in raw if v is not None) and all(
            -(2**63) <= v < 2**63 for v in raw if v is not None
        ):
            values = np.fromiter((0 if v is None else v for v in raw), np.int64, len(raw))
        else:
            values = np.empty(len(raw), object)
            values[:] = raw
        self._columns[name] = (values, present)
        return values, present

    def mask(self, f) -> np.ndarray:
        return filters.mask(self, f)

    def snapshot(self):
        with self.lock:
            return self.n, self.rows, list(self.ids)


def _element_type(values: list) -> str:
    first = next((x for x in values if x is not None), 0)
    return "string" if isinstance(first, str) else "float" if isinstance(first, float) else "int"


def _count_new(slots):
    k = 0
    for s in slots:
        yield k
        if s < 0:
            k += 1


def decode_vectors(column) -> np.ndarray | None:
    if column is None:
        return None
    if all(v is None for v in column):
        return None
    if any(v is None for v in column):
        raise ApiError(400, "every document needs a vector once the namespace has a vector column")
    try:
        if all(isinstance(v, str) for v in column):
            return _from_base64(column)
        return (
            np.asarray(column, np.float32).reshape(len(column), -1)
            if len({len(v) for v in column}) == 1
            else _bad_vectors()
        )
    except (ValueError, TypeError) as e:
        raise ApiError(400, f"invalid vector: {e}") from None


def _from_base64(column: list) -> np.ndarray:
    """Each row decoded straight into one float32 array (no list of decoded rows joined into a second copy)."""
    first = base64.b64decode(column[0], validate=True)
    out = np.empty((len(column), len(first) // 4), "<f4")
    flat = out.view(np.uint8).reshape(len(column), 4 * out.shape[1])
    for i, text in enumerate(column):
        row = base64.b64decode(text, validate=True) if i else first
        if len(row) != flat.shape[1]:
            raise ApiError(400, "base64 vectors must be little-endian f32 arrays of one length")
        flat[i] = np.frombuffer(row, np.uint8)
    return out


def _bad_vectors():
    raise ApiError(400, "vectors of one namespace must all have the same dimension")
