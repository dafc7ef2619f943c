"""Writes of the turbopuffer store: upserts sent as batches to every copy of a part (rows moved between parts
deleted from the one they left), and during a load written in the background, a collection's upserts in order
(loads.py)."""

from __future__ import annotations

import base64
import contextlib

import numpy as np

from vecgpt.backends.base import check_payload, check_rows, is_text, last_writes, parallel
from vecgpt.backends.turbopuffer.cost import b64_length
from vecgpt.backends.turbopuffer.loads import Background
from vecgpt.errors import VecgptError

ROW = "__row"  # a column last_writes carries through, never sent
# the payload as base64 of its little-endian float32 bytes, in an unindexed string (half-price storage): bit
# exact, and 4/3 bytes a byte where []float (f64 on the service, ~20 characters a number in JSON) would take 8
# stored and 2.4x the transfer (docs/turbopuffer.md, "Texts")
PAYLOAD_SCHEMA = {"payload": {"type": "string", "filterable": False}}


def b64(vectors: np.ndarray) -> list[str]:
    v = np.ascontiguousarray(vectors, "<f4")
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in v]


class Writes:
    """Mixed into TurbopufferStore, which gives _spec, _specs, _base, _replicas, _enter_parts, _write,
    _write_spec, _lock, _spans, _part_of and the write settings."""

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
