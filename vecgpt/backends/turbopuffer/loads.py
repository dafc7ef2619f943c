"""A load's writes in the background: several upserts at once, those of the same ids in the order given.

The service takes a namespace's writes at a documented 32 MB/s and commits each in up to 200 ms, and `loading.push`
hands over one matrix after another; writing several namespaces at once is what makes a load run at the service's
pace rather than one namespace's (`benchmarks/ingest.py` measures it against the client writing them all at once)."""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import Future, ThreadPoolExecutor


class Background:
    """Writes queued by collection and id span: up to `workers` run at once, one whose span meets an earlier one's
    in the same collection after it (the last write of an id wins), at most `max_bytes` of bodies held; `wait`
    returns when all have run and raises the first failure."""

    def __init__(self, workers: int, max_bytes: int):
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="tpuf-load")
        self.max_bytes, self.held = max_bytes, 0
        self.room = threading.Condition()
        self.pending: dict[str, list[tuple[int, int, Future]]] = {}
        self.futures: list[Future] = []

    def submit(self, collection: str, span: tuple[int, int], nbytes: int, write) -> None:
        """Queue write(), the upsert of ids lo..hi (span) of a collection."""
        lo, hi = span
        with self.room:  # one write larger than the budget still goes, alone
            self.room.wait_for(lambda: self.held == 0 or self.held + nbytes <= self.max_bytes)
            self.held += nbytes
            # a write that failed stays: a later write of its ids must fail too, however soon it failed
            held = [p for p in self.pending.get(collection, []) if not p[2].done() or p[2].exception() is not None]
            before = [f for a, b, f in held if a <= hi and lo <= b]
            # a pool starts tasks in the order given, so each of `before` has started when this one waits for it
            future = self.pool.submit(contextvars.copy_context().run, self._run, before, nbytes, write)
            self.pending[collection] = held + [(lo, hi, future)]
            self.futures.append(future)

    def _run(self, before: list[Future], nbytes: int, write) -> None:
        try:
            for earlier in before:
                earlier.result()  # its failure is this one's: an id's writes land in order or not at all
            write()
        finally:
            with self.room:
                self.held -= nbytes
                self.room.notify_all()

    def wait(self) -> None:
        """Every write queued so far has run; the first failure raised."""
        with self.room:
            futures, self.futures, self.pending = self.futures, [], {}
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def close(self, cancel: bool = False) -> None:
        """Stop the pool once what runs has run (cancel: what has not started never does)."""
        self.pool.shutdown(wait=True, cancel_futures=cancel)
