"""The LanceDB store: one Lance table per collection, exact flat scans, compaction as keys grow."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from datetime import timedelta

import lancedb
import numpy as np
import pyarrow as pa
from lancedb.index import Bitmap, IvfFlat

from vecgpt.backends import base
from vecgpt.backends._text_log import Rows, last_rows
from vecgpt.backends.base import FolderStore, Metric, record
from vecgpt.backends.lancedb.search import Searching
from vecgpt.backends.lancedb.table import (
    DISTANCE,
    FLAT_INDEX,
    RESERVED,
    Table,
    fixed,
    floats,
    lance_errors,
    schema,
)
from vecgpt.errors import VecgptError

FEW = 1024  # ids a fetch names in its filter; more are read as a range
FILE_FORMATS = ("legacy", "stable", "2.0", "2.1", "2.2")  # Lance's names for its file formats


@base.closes_after_calls
class LanceStore(Searching, FolderStore):
    metrics: tuple[Metric, ...] = ("l2", "ip")
    backend = "lancedb"

    def __init__(
        self,
        path: str | None = None,
        compact_every: int = 12,
        concurrent: bool = True,
        index_attrs: Sequence[str] = ("layer", "head"),
        index_rows: int = 2048,
        file_format: str = "legacy",
        flat_index: bool = True,
    ):
        if file_format not in FILE_FORMATS:
            raise VecgptError(f"file_format {file_format!r} is not one of Lance's: {', '.join(FILE_FORMATS)}")
        super().__init__(path)
        self.path.mkdir(parents=True, exist_ok=True)
        # The format of the tables this store makes. Lance's v1 ("legacy") files are scanned with less than half
        # the CPU of its v2 ("stable") files for vectors this wide (docs/lancedb.md); tables keep their format.
        options = {"new_table_data_storage_version": file_format}
        self.db = lancedb.connect(str(self.path), storage_options=options)
        self.compact_every = compact_every
        self.concurrent = concurrent  # the engine may send a round's requests from several threads
        self.index_attrs, self.index_rows = tuple(index_attrs), index_rows
        self.flat_index = flat_index  # a model's tables get an IVF_FLAT index of one partition when compacted
        self._tables: dict[str, Table] = {}
        self._lock = threading.Lock()  # guards _tables

    # collections
    @lance_errors
    def create(self, name: str, dim: int, metric: Metric, attrs: Sequence[str] = (), payload: int = 0) -> None:
        base.check_metric(self.backend, metric, self.metrics)
        if set(attrs) & RESERVED:
            raise VecgptError(f"attribute names {sorted(RESERVED)} are reserved")
        table = self._open(name)
        if table is not None:
            base.check_same(name, (table.dim, table.metric, table.width), dim, metric, payload)
            return
        handle = self.db.create_table(name, schema=schema(dim, metric, list(attrs), payload), exist_ok=True)
        table = Table(handle)
        table.ids, table.rows = set(), 0
        self._opened(name, table)

    @lance_errors
    def clone(self, src: str, dst: str) -> None:
        """dst: a new table made from src's Arrow batches by LanceDB itself. (LanceDB 0.40's clone_table makes
        only shallow clones, which read src's data files: src's next compaction deletes them under dst.)"""
        table = self._table(src)
        if self._open(dst) is not None:
            raise VecgptError(f"cannot clone {src!r} to {dst!r}: {dst!r} exists; drop it first")
        record()
        with table.lock.read():
            batches = table.handle.search().limit(None).to_batches()
            handle = self.db.create_table(dst, data=batches, schema=table.handle.schema)
        self._opened(dst, Table(handle))

    def _opened(self, name: str, table: Table) -> None:
        with self._lock:
            self._tables[name] = table

    @lance_errors
    def upsert(self, name, ids, vectors, attrs=None, payload=None) -> None:
        table = self._table(name)
        ids, vectors = base.check_rows(name, ids, vectors, table.dim)
        payload = base.check_payload(name, payload, len(ids), table.width)
        if len(ids) == 0:
            return
        ids, vectors, attrs, payload = last_rows(name, Rows(ids, vectors, attrs or {}, payload), table.attrs)
        columns = [pa.array(ids), fixed(vectors), *(pa.array(attrs[a]) for a in table.attrs)]
        columns += [fixed(payload)] if table.width else []
        data = pa.Table.from_arrays(columns, schema=table.handle.schema)
        record()
        with table.lock.write():
            held = table.held_ids()
            new = [i for i in ids.tolist() if i not in held]
            if len(new) == len(ids):
                table.handle.add(data)
            else:
                table.handle.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(data)
            held.update(new)
            table.rows = table.row_count() + len(new)
            table.writes += 1
            table.changed()
            if self.compact_every and table.writes >= self.compact_every:
                self._compact(table, index=table.flat)  # a load's first rows are not indexed: flush() does that

    @lance_errors
    def fetch(self, name, ids, payload=False):
        table = self._table(name)
        if base.is_text(name):  # a text resumed here may have been written by another process since
            table.latest()
        ids = np.asarray(ids, np.int64)
        record()
        columns = ["id", "vector"] + (["payload"] if payload and table.width else [])
        result = self._rows(table, np.unique(ids), columns)
        got = result["id"].to_numpy()
        base.check_found(name, ids[~np.isin(ids, got)], ())
        at = np.searchsorted(got, ids)
        vectors = floats(result["vector"], table.dim)[at]
        if not payload:
            return vectors
        if not table.width:
            return vectors, np.zeros((len(ids), 0), np.float32)
        return vectors, floats(result["payload"], table.width)[at]

    def _rows(self, table: Table, wanted: np.ndarray, columns: list[str]) -> pa.Table:
        """The rows of these ids (sorted, distinct) that the table holds, sorted by id. Up to FEW ids are
        named in the filter; more (a text's every key, on resume) are read as the range they span."""
        if len(wanted) == 0:
            return table.handle.schema.empty_table().select(columns)
        few = len(wanted) <= FEW
        condition = (
            f"id IN ({', '.join(map(str, wanted.tolist()))})" if few else f"id >= {wanted[0]} AND id <= {wanted[-1]}"
        )
        with table.lock.read():
            limit = len(wanted) if few else max(table.row_count(), 1)
            result = table.scan(columns, limit, condition)
        result = result.sort_by("id")
        return result if few else result.filter(pa.array(np.isin(result["id"].to_numpy(), wanted)))

    @lance_errors
    def count(self, name) -> int:
        table = self._table(name)
        with table.lock.read():
            return table.row_count()

    @lance_errors
    def drop(self, name) -> None:
        with self._lock:
            self._tables.pop(name, None)
        self.db.drop_table(name, ignore_missing=True)

    @lance_errors
    def collections(self) -> list[str]:
        names, token = [], None
        while True:
            page = self.db.list_tables(page_token=token)
            names += page.tables
            token = page.page_token
            if not token or not page.tables:
                return sorted(set(names))

    @lance_errors
    def stats(self) -> dict:
        out = {}
        for name in self.collections():
            table = self._table(name)
            with table.lock.read():
                s = table.handle.stats()
            out[name] = {
                "documents": int(s["num_rows"]),
                "bytes": int(s["total_bytes"]),
                "fragments": int(s["fragment_stats"]["num_fragments"]),
                "version": table.handle.version,
            }
        return out

    # maintenance
    @lance_errors
    def compact(self, name: str | None = None) -> None:
        """Compact one table (or every table written since its last compaction) and drop old versions."""
        tables = [self._table(name)] if name else [t for t in list(self._tables.values()) if t.writes]
        for table in tables:
            with table.lock.write():
                self._compact(table)

    def _compact(self, table: Table, index: bool = True) -> None:  # the caller holds table.lock.write()
        with warnings.catch_warnings():  # "a concurrent reader would fail": none can, we hold the write lock
            warnings.simplefilter("ignore")
            if table.flat:  # rebuilt below: Lance 0.40's optimize, merging new rows into it, lost most rows' vectors
                table.handle.drop_index(FLAT_INDEX)
                table.flat = False
            table.handle.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)
            table.changed()
            if index and self.flat_index and table.row_count() and not base.is_text(table.handle.name):
                # One partition holds every row, so a search of it is a flat scan, of vectors LanceDB keeps in memory
                # (faster than a scan of its files, docs/lancedb.md); a text's keys, written every token, are scanned
                # as they lie.
                config = IvfFlat(distance_type=DISTANCE[table.metric], num_partitions=1)
                table.handle.create_index("vector", config=config, name=FLAT_INDEX)
                table.flat = True
            if table.row_count() >= self.index_rows:  # bitmaps, so a filter reads only the rows it keeps
                for attr in [a for a in self.index_attrs if a in table.attrs and a not in table.indexed]:
                    table.handle.create_index(attr, config=Bitmap())
                    table.indexed.add(attr)
        table.writes = 0

    # persistence
    def flush(self) -> None:
        self.compact()  # the end of a load: one fragment per table, no old versions

    def close(self) -> None:
        with self._lock:
            self._tables.clear()

    def _open(self, name: str) -> Table | None:
        table = self._tables.get(name)
        if table is not None:
            return table
        with self._lock:
            if name not in self._tables:
                try:
                    handle = self.db.open_table(name)
                except (FileNotFoundError, ValueError):
                    return None
                self._tables[name] = Table(handle)
            return self._tables[name]

    def _table(self, name: str) -> Table:
        return base.existing(self._open(name), self, name)
