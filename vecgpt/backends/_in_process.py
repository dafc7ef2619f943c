"""What the in-process stores (memory, faiss) share: ids, attributes, payloads, filters and a folder on disk.

A subclass says how vectors are held and how distances are computed (`Table`). Model collections are
saved as folders when a load ends; text collections (`text-*`) as they are written, in a log each
(vecgpt/backends/_text_log.py). See docs/memory.md.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from itertools import repeat
from pathlib import Path

import numpy as np

from vecgpt.backends import _grid, base
from vecgpt.backends import _text_log as text_log
from vecgpt.backends.base import (
    FolderStore,
    Hits,
    Metric,
    Search,
    Where,
    is_text,
    matching,
    record,
    row_order,
    stacked,
)
from vecgpt.errors import VecgptError

TEMPORARY = (".part", ".old")  # collection folders being written or replaced (see _save)


class Table:
    """Vectors of one collection in slots 0..n-1; subclasses implement storage and distances."""

    def __init__(self, dim: int, metric: Metric):
        self.dim, self.metric, self.n = dim, metric, 0
        self.ran: str | None = None  # the kernel the last search of every row ran (stats(); docs/faiss.md)

    def append(self, vectors: np.ndarray) -> None: ...
    def overwrite(self, slots: np.ndarray, vectors: np.ndarray) -> None: ...
    def vectors(self, slots: np.ndarray) -> np.ndarray: ...
    def all_dists(
        self, queries: np.ndarray, slots: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray | None]: ...  # dists, slots [m, n] (None: every row, in slot order)
    def topk(self, queries: np.ndarray, k: int, slots: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]: ...
    def within(self, queries: np.ndarray, radius: np.ndarray, slots: np.ndarray | None) -> list:
        """A radius search (Search.radius): each query's (dists, slots) of the rows at distance <= its radius, in any
        order; here all_dists compared in numpy (the memory store's; FAISS has its range search)."""
        dists, chosen = self.all_dists(queries, slots)
        if chosen is None:
            chosen = np.broadcast_to(np.arange(self.n), dists.shape)
        keep = dists <= radius[:, None]
        return [(d[mine], rows[mine]) for d, rows, mine in zip(dists, chosen, keep)]

    def all_dists_groups(self, queries: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """queries [G, m, dim], each group's over its own rows (slots [G, n]) -> dists [G, m, n]: a layer's heads."""
        if not len(slots):
            return np.zeros((*queries.shape[:2], 0))
        return stacked([self.all_dists(q, rows)[0] for q, rows in zip(queries, slots)])

    def copy(self) -> Table: ...
    def save(self, folder: Path) -> None: ...
    @classmethod
    def load(cls, folder: Path, dim: int, metric: Metric) -> Table: ...


def grow(held: np.ndarray, n: int, new: np.ndarray) -> np.ndarray:
    """held[:n] then `new`, in a buffer that doubles when full: a text's row-by-row appends stay O(rows) in all."""
    if n + len(new) > len(held):
        bigger = np.empty((max(2 * len(held), n + len(new)), *held.shape[1:]), held.dtype)
        bigger[:n] = held[:n]
        held = bigger
    held[n : n + len(new)] = new
    return held


class Collection:
    def __init__(self, table: Table, attrs: Sequence[str], width: int = 0):
        self.table = table
        self.hold(np.zeros(0, np.int64), {a: np.zeros(0, np.int64) for a in attrs}, np.zeros((0, width), np.float32))
        self.dirty = True
        self.log_end = 0  # a text collection: where its log ends, as far as this process knows
        self.log = ""  # ... and its path

    def hold(self, ids: np.ndarray, attrs: dict[str, np.ndarray], payload: np.ndarray) -> None:
        """The ids, attributes and payload of the table's rows (buffers: rows past table.n are spare)."""
        self._ids, self._attrs, self._payload = ids, attrs, payload
        self.slot_of: dict[int, int] = dict(zip(self.ids.tolist(), range(self.table.n)))
        self._in_order: bool | None = None  # whether ids are 0..n-1 (a model's matrix), found when first asked
        self._equal: dict[tuple, tuple[int, np.ndarray, np.ndarray]] = {}  # rows_by's memo, while rows only append
        self._grids: dict[tuple, tuple[int, _grid.Grid | None]] = {}  # grid's, at a number of rows

    @property
    def ids(self) -> np.ndarray:  # [n] slot -> id
        return self._ids[: self.table.n]

    def ids_in_slot_order(self) -> np.ndarray:
        """Every row's id in slot order: base.row_order(n) itself when they are 0..n-1, which the engine knows
        for row order without comparing."""
        if self._in_order is None:
            self._in_order = bool(np.array_equal(self.ids, row_order(self.table.n)))
        return row_order(self.table.n) if self._in_order else self.ids

    @property
    def attrs(self) -> dict[str, np.ndarray]:
        return {a: column[: self.table.n] for a, column in self._attrs.items()}

    @property
    def payload(self) -> np.ndarray:  # [n, width], beside the vectors
        return self._payload[: self.table.n]

    @property
    def names(self) -> list[str]:  # of the attributes
        return list(self._attrs)

    @property
    def width(self) -> int:
        return self._payload.shape[1]

    @property
    def meta(self) -> dict:
        return {"dim": self.table.dim, "metric": self.table.metric, "attrs": self.names, "payload": self.width}

    def upsert(self, rows: text_log.Rows) -> None:
        """Rows of distinct ids (base.last_writes), every attribute given."""
        ids, vectors, attrs, payload = rows
        n = self.table.n
        slots = np.fromiter(map(self.slot_of.get, ids.tolist(), repeat(-1)), np.int64, len(ids))
        old, new = slots >= 0, slots < 0
        if old.any():
            self.table.overwrite(slots[old], vectors[old])
        if new.any():
            self.table.append(vectors[new])
            self._ids = grow(self._ids, n, ids[new])
            self.slot_of.update(zip(ids[new].tolist(), range(n, self.table.n)))
        for a, column in attrs.items():
            self._attrs[a] = grow(self._attrs[a], n, column[new])
            self._attrs[a][slots[old]] = column[old]
        self._payload = grow(self._payload, n, payload[new])
        self._payload[slots[old]] = payload[old]
        self.dirty, self._in_order = True, None
        if old.any():  # a row's attributes may have changed: rows_by starts again
            self._equal, self._grids = {}, {}

    def rows(self) -> text_log.Rows:
        return text_log.Rows(self.ids, self.table.vectors(np.arange(self.table.n)), self.attrs, self.payload)

    def slots_of(self, name: str, ids: np.ndarray) -> np.ndarray:
        try:
            return np.fromiter(map(self.slot_of.__getitem__, ids.tolist()), np.int64, len(ids))
        except KeyError:
            base.check_found(name, ids, self.slot_of)
            raise

    def copy(self) -> Collection:
        twin = Collection(self.table.copy(), self.names, self.width)
        twin.hold(self.ids.copy(), {a: column.copy() for a, column in self.attrs.items()}, self.payload.copy())
        return twin

    def slots(self, where: Where | None) -> np.ndarray | None:
        """The rows a filter matches, ascending (None: no filter, every row)."""
        return None if where is None else self.matching_rows(where, None)[0]

    def group_slots(self, where: Where, by: str, groups: int) -> list[np.ndarray]:
        """The rows a grouped search's groups match (Search.by), each group's ascending."""
        rows, values = self.matching_rows(where, by)
        bounds = np.searchsorted(values, np.arange(groups + 1)).tolist()  # values are integers, sorted
        return [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def grid(self, where: Where, by: str, groups: int) -> _grid.Grid | None:
        """A grouped search's rows as a grid (vecgpt.backends._grid) when its filter is equalities and a range of one
        attribute and the rows are laid out as one; else None."""
        ranged = {*where.lt, *where.ge}
        if len(ranged) != 1:
            return None
        along = next(iter(ranged))
        key, n = (frozenset(where.eq.items()), by, along, groups), self.table.n
        seen, held = self._grids.get(key, (-1, None))
        if seen != n:
            if len(self._grids) >= MEMO:
                self._grids = {}
            held = self._next_grid(seen, held, where.eq, by, along, groups)
            self._grids[key] = (n, held)
        if held is None or not len(held.along):  # no grid, or no rows: filtered row by row
            return None
        return _grid.columns(held, where.ge.get(along), where.lt.get(along))

    def _next_grid(self, seen: int, held, eq: dict, by: str, along: str, groups: int) -> _grid.Grid | None:
        """The grid at this many rows: the one held at `seen` rows with the rows since as its next columns, or made
        again from every row (none held, or the rows since are not its next columns)."""
        if held is None or seen < 0:
            seen, held = 0, _grid.empty(groups)
        equal, n, attrs = frozenset((np.equal, a, v) for a, v in eq.items()), self.table.n, self._attrs
        new = seen + np.flatnonzero(matching(equal, {a: attrs[a][seen:n] for a in eq}, n - seen))
        more = _grid.extended(held, new, attrs[by][new], attrs[along][new], self.ids, groups)
        return self._next_grid(-1, None, eq, by, along, groups) if more is None and seen else more

    def matching_rows(self, where: Where, by: str | None) -> tuple[np.ndarray, np.ndarray]:
        """The rows a filter matches, ordered by attribute `by` and then by slot, and their values of `by` (None: by
        slot, the rows twice). Its equalities (a layer's keys: layer) select rows remembered between calls (rows_by);
        the rest (a position range) is tested on those."""
        conditions = where.conditions()
        equal = frozenset(c for c in conditions if c[0] is np.equal)
        rows, values = self.rows_by(equal, by)
        if others := conditions - equal:
            keep = matching(others, {name: self._attrs[name][rows] for _, name, _ in others}, len(rows))
            rows, values = rows[keep], values[keep]
        return rows, values

    def rows_by(self, equalities: frozenset, by: str | None) -> tuple[np.ndarray, np.ndarray]:
        """The rows whose attributes equal these values, ordered by attribute `by`, then by slot, and their values of
        `by` (None: by slot, the rows twice). Remembered; as rows are appended, only the new ones are tested and merged
        in. A text's key search asks for a layer's rows by head 12 times a token: testing every row each time would be
        a pass over all of a text's keys each time, and sorting the layer's by head another."""
        key, n = (equalities, by), self.table.n
        if len(self._equal) >= MEMO and key not in self._equal:
            self._equal = {}
        seen, rows, values = self._equal.get(key, (0, NONE, NONE))
        if seen < n:
            tested = {a: self._attrs[a][seen:n] for _, a, _ in equalities}
            new = seen + np.flatnonzero(matching(equalities, tested, n - seen))
            rows = np.concatenate([rows, new])
            values = np.concatenate([values, self._attrs[by][new]]) if by else rows
            if by:  # the rows held are ordered already: a stable sort merges the new ones in
                order = np.argsort(values, kind="stable")
                rows, values = rows[order], values[order]
            self._equal[key] = (n, rows, values)
        return rows, values


MEMO = 256  # rows_by's answers remembered per collection (a text's key searches use one per layer)
NONE = np.zeros(0, np.int64)


@base.closes_after_calls
class InProcessStore(FolderStore):
    table_class: type[Table]
    metrics: tuple[Metric, ...] = ("l2", "ip")
    backend = "local"
    groups = True  # search_many takes grouped searches (Search.by)
    indexes: tuple[str, ...] = ()  # approximate indexes a Search may name (Search.index): FAISS's "hnsw"
    table_options: dict = {}  # keyword arguments every table of this store is made with (its kernel settings)

    def __init__(self, path: str | None = None):
        super().__init__(path)
        self._cols: dict[str, Collection] = {}

    # collections
    def create(self, name: str, dim: int, metric: Metric, attrs: Sequence[str] = (), payload: int = 0) -> None:
        base.check_metric(self.backend, metric, self.metrics)
        if self._has(name):
            col = self._col(name)
            base.check_same(name, (col.table.dim, col.table.metric, col.width), dim, metric, payload)
            return
        self._add(name, Collection(self.table_class(dim, metric, **self.table_options), attrs, payload))

    def upsert(self, name, ids, vectors, attrs=None, payload=None) -> None:
        col = self._col(name)
        ids, vectors = base.check_rows(name, ids, vectors, col.table.dim)
        payload = base.check_payload(name, payload, len(ids), col.width)
        record()
        rows = text_log.last_rows(name, text_log.Rows(ids, vectors, attrs or {}, payload), col.names)
        if is_text(name):
            col.log_end = text_log.append(self._log(name), text_log.chunk(col.meta, rows), col.log_end)
        col.upsert(rows)

    def clone(self, src: str, dst: str) -> None:
        """dst: a copy of src's rows, made in this process's memory (and dst's log, if a text's)."""
        if self._has(dst):
            raise VecgptError(f"cannot clone {src!r} to {dst!r}: {dst!r} exists; drop it first")
        record()
        self._add(dst, self._col(src).copy())

    def _add(self, name: str, col: Collection) -> None:
        if is_text(name):  # on disk from the start, as one chunk: a text's collection exists once made
            col.log_end = text_log.create(self._log(name), text_log.chunk(col.meta, col.rows()))
        self._cols[name] = col

    def search(self, name, queries, k=None, where=None) -> Hits:
        return self._search(Search(name, queries, k, where))

    def _search(self, s: Search) -> Hits:
        col = self._col(s.collection)
        queries = base.check_vectors(s.collection, s.queries, col.table.dim)
        if s.where is not None:
            base.check_where(s.collection, s.where, col.names)
        record(1, len(queries))
        radius = base.check_radius(s, queries.shape[:1])
        if radius is not None:
            found = col.table.within(queries, radius, col.slots(s.where))
            return base.ragged([(col.ids[rows], d) for d, rows in found], s.k)
        if s.index is not None:
            return self._approximate(s, col, queries)
        slots = col.slots(s.where)
        k = None if s.k is None else min(s.k, col.table.n if slots is None else len(slots))
        if k is None:
            dists, found = col.table.all_dists(queries, slots)  # found None: every row, in slot order
        elif k == 0:
            dists, found = np.zeros((len(queries), 0)), np.zeros((len(queries), 0), np.int64)
        else:
            dists, found = col.table.topk(queries, k, slots)
        hits = Hits(np.broadcast_to(col.ids_in_slot_order(), dists.shape) if found is None else col.ids[found], dists)
        if s.vectors:
            rows = np.broadcast_to(np.arange(col.table.n), dists.shape) if found is None else found
            hits = hits._replace(vectors=col.table.vectors(rows.ravel()).reshape(*rows.shape, col.table.dim))
        return hits

    def _approximate(self, s: Search, col: Collection, queries: np.ndarray) -> Hits:
        """The k nearest by the table's index of kind s.index (FaissTable.approximate) over the rows matching the
        filter's equalities, its ranges applied as the index's filter; ids -1 (distance inf) where it found fewer."""
        if s.index not in self.indexes:
            raise VecgptError(
                f"{self.backend} has no {s.index!r} index"
                + (f" (it has {', '.join(self.indexes)})" if self.indexes else "")
            )
        if s.k is None:
            raise VecgptError(f"an approximate search of {s.collection!r} needs k")
        where = s.where or Where()
        within = col.slots(Where(eq=where.eq)) if where.eq else None
        within = np.arange(col.table.n) if within is None else within
        allowed = col.slots(where)
        allowed = within if allowed is None else allowed
        k = min(s.k, len(allowed))
        if k == 0:
            return Hits(np.zeros((len(queries), 0), np.int64), np.zeros((len(queries), 0)), None, 0)
        dists, found, scored = col.table.approximate(queries, k, within, allowed, frozenset(where.eq.items()))
        ids = np.where(found >= 0, col.ids[np.maximum(found, 0)], -1)
        return Hits(ids, np.where(found >= 0, dists, np.inf), None, scored)

    def search_many(self, searches: Sequence[Search]) -> list[Hits]:
        return [self._groups(s) if s.by else self._search(s) for s in searches]

    def _groups(self, s: Search) -> Hits:
        """A grouped search of every row of each group (a layer's heads): the groups' rows found together, then one
        scan of each group's queries over its rows (FAISS: one kernel call for them all). Others: group by group."""
        if s.k is not None or s.vectors or s.index or s.radius is not None:
            return base.apart(lambda plain: [self._search(p) for p in plain], [s])[0]
        col = self._col(s.collection)
        queries = base.check_grouped(s.collection, s.queries, col.table.dim)
        where = base.group_filter(s)
        base.check_attributes(s.collection, where.attributes() | {s.by}, col.names)
        record(1, queries.shape[0] * queries.shape[1])
        found = col.grid(where, s.by, len(queries))
        if found is None:
            slots = col.group_slots(where, s.by, len(queries))
            base.check_groups(s.collection, [len(rows) for rows in slots])
            slots = stacked(slots) if slots else np.zeros((0, 0), np.int64)  # [G, n]
            found = _grid.Grid(slots, col.ids[slots], None)
        dists = col.table.all_dists_groups(queries, found.slots)  # [G, m, n]
        ids = found.ids[:, None]  # a decode step's one query a group: its shape already (broadcast_to costs more)
        ids.flags.writeable = False  # a view of the grid, which later searches read, as broadcast_to's is
        return Hits(ids if ids.shape == dists.shape else np.broadcast_to(ids, dists.shape), dists)

    def fetch(self, name, ids, payload=False):
        col = self._col(name)
        record()
        slots = col.slots_of(name, np.asarray(ids, np.int64))
        vectors = col.table.vectors(slots)
        return (vectors, col.payload[slots]) if payload else vectors

    def count(self, name) -> int:
        return self._col(name).table.n

    def drop(self, name) -> None:
        self._cols.pop(name, None)
        if is_text(name):
            self._log(name).unlink(missing_ok=True)
        else:
            shutil.rmtree(self._folder(name), ignore_errors=True)

    def collections(self) -> list[str]:
        folders = (self.path / "collections").glob("*/meta.json")
        models = [p.parent.name for p in folders if not p.parent.name.endswith(TEMPORARY)]
        texts = [p.stem for p in (self.path / "texts" / "keys").glob("*.log")]
        return sorted(set(models) | set(texts) | set(self._cols))

    def stats(self) -> dict:
        out = {}
        for name in self.collections():
            col = self._col(name)
            out[name] = {"documents": col.table.n, "bytes": col.table.n * (col.table.dim + col.width) * 4}
            if col.table.ran:
                out[name]["kernel"] = col.table.ran
        return out

    # persistence
    def flush(self) -> None:
        for name, col in self._cols.items():
            if col.dirty and not is_text(name):  # a text's rows are on disk as soon as written
                self._save(name, col)

    def close(self) -> None:
        self.flush()

    def _folder(self, name: str) -> Path:
        return self.path / "collections" / name

    def _log(self, name: str) -> Path:
        return self.path / "texts" / "keys" / f"{name}.log"  # beside texts/<id>.json, never named like one

    def _has(self, name: str) -> bool:
        on_disk = self._log(name) if is_text(name) else self._folder(name) / "meta.json"
        return name in self._cols or on_disk.is_file()

    def _col(self, name: str) -> Collection:
        if name not in self._cols:
            if not self._has(name):
                raise base.no_collection(self, name)
            self._cols[name] = self._replay(name) if is_text(name) else self._load(name)
        elif is_text(name):
            self._catch_up(name, self._cols[name])
        return self._cols[name]

    def _catch_up(self, name: str, col: Collection) -> None:
        """Rows another process appended to a text's log since this one last read or wrote it (one stat)."""
        col.log = col.log or str(self._log(name))  # a key search asks 12 times a token: the path made once
        try:
            size = os.stat(col.log).st_size
        except FileNotFoundError:  # closed by another process
            del self._cols[name]
            raise base.no_collection(self, name) from None
        if size == col.log_end:
            return
        _, chunks, end = text_log.read(self._log(name), col.log_end)
        if chunks:
            col.upsert(text_log.joined(name, chunks, col.names))
        col.log_end = end

    def _save(self, name: str, col: Collection) -> None:
        # Written beside the collection, then swapped in by renames: a kill at any point leaves
        # either the old folder or the new one under the collection's name, never a mix.
        folder, tmp, old = self._folder(name), self._folder(name + ".part"), self._folder(name + ".old")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        col.table.save(tmp)
        np.savez(tmp / "attrs.npz", __ids__=col.ids, **col.attrs)
        if col.width:
            np.save(tmp / "payload.npy", col.payload)
        base.write_json(tmp / "meta.json", col.meta)
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
        col.dirty = False

    def _load(self, name: str) -> Collection:
        folder = self._folder(name)
        try:
            meta = json.loads((folder / "meta.json").read_text())
            table = self.table_class.load(folder, meta["dim"], meta["metric"], **self.table_options)
            with np.load(folder / "attrs.npz") as saved:
                ids, attrs = saved["__ids__"], {a: saved[a] for a in meta["attrs"]}
            width = meta.get("payload", 0)  # saved before payloads: none
            payload = np.load(folder / "payload.npy") if width else np.zeros((len(ids), 0), np.float32)
        except Exception as e:  # any file missing, cut short or garbled: numpy, json and FAISS each raise their own
            raise self.damaged(f"collection {name!r} is damaged", e) from None
        sizes = {len(ids), table.n, len(payload), *(len(c) for c in attrs.values())}
        if len(sizes) > 1 or table.dim != meta["dim"] or payload.shape[1] != width:
            raise self.damaged(
                f"collection {name!r} is damaged", ValueError("its files disagree on the number of rows")
            )
        col = Collection(table, meta["attrs"], width)
        col.hold(ids, attrs, payload)
        col.dirty = False
        return col

    def _replay(self, name: str) -> Collection:
        """A text collection from its log: every whole chunk in order, the last write of each id kept."""
        try:
            meta, chunks, end = text_log.read(self._log(name))
        except OSError as e:
            raise self.damaged(f"collection {name!r} is damaged", e) from None
        if meta is None:
            raise self.damaged(f"collection {name!r} is damaged", ValueError(f"{self._log(name)} has no whole chunk"))
        table = self.table_class(meta["dim"], meta["metric"], **self.table_options)
        col = Collection(table, meta["attrs"], meta["payload"])
        col.upsert(text_log.joined(name, chunks, meta["attrs"]))
        col.dirty, col.log_end = False, end
        return col
