"""A session's writes, sent in the order they were queued, each batch once the one before has landed.

`queue(call)` returns a ticket; `acked(ticket)` says whether that write has landed; `wait(ticket)` blocks until
it has (None: every write queued so far). Writes queued together go out as one round, and a batch is sent
only after the previous one returned, so a write that lands has every earlier write landed before it. Upserts
queued one after another into one collection go out as one upsert (`merged`).

A store that takes concurrent requests (`concurrent`, e.g. turbopuffer over HTTP) gets the writes from a
thread of their own: no search waits for them. Any other store gets them with the session's next round
(`take`), as one round with its searches. A failed write stops the writer: every later call raises its error
(the session is done; a text is opened again from what landed).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager, suppress

import numpy as np

from vecgpt.errors import VecgptError
from vecgpt.meter import Call, Metered

CUT_SHORT = "this session's writes were cut short (interrupted) before all of them landed; open the text again"


class Writer:
    def __init__(self, store: Metered, background: bool):
        self.store, self.background = store, background
        self.queued: list[tuple[Call, object]] = []  # (call, the token tally it is counted in)
        self.issued = self.landed = 0  # tickets < issued were queued, < landed have landed
        self.error: BaseException | None = None
        self.running = False  # a thread is sending
        self.cond = threading.Condition()

    def queue(self, call: Call) -> int:
        """Queue a write; its ticket."""
        self.check()
        with self.cond:
            self.queued.append((call, self.store.meter.current))
            self.issued += 1
            if self.background and not self.running:
                self.running = True
                threading.Thread(target=self._run, name="vecgpt-writer", daemon=True).start()
            return self.issued - 1

    def acked(self, ticket: int) -> bool:
        return ticket < self.landed

    def take(self) -> tuple[list[Call], int]:
        """Without a thread: the writes to send with the next round, and the ticket they land up to."""
        self.check()
        if self.background:
            return [], self.landed
        if not self.queued:  # read without the lock: only this text's own thread queues its writes
            return [], self.issued
        with self.cond:
            calls, self.queued = merged([c for c, _ in self.queued]), []
            return calls, self.issued

    def done(self, upto: int) -> None:
        """The writes `take` handed out, up to ticket `upto`, have landed."""
        if upto <= self.landed:
            return
        with self.cond:
            self.landed = max(self.landed, upto)
            self.cond.notify_all()

    def wait(self, ticket: int | None = None) -> None:
        """Block until write `ticket` (None: every write queued) has landed; a failed write's error."""
        target = self.issued if ticket is None else ticket + 1
        calls, upto = self.take()
        if calls:
            with self.failing():
                self.store.together(*calls)
            self.done(upto)
        with self.cond:
            while self.landed < target and self.error is None and self.running:
                self.cond.wait()
        self.check()

    @contextmanager
    def failing(self):
        """Around a round that carries writes: if it fails, the writer stops with its error. Cut short (Ctrl-C), some
        of its writes may have landed and others not, and a later round's acknowledgement would count them all as
        landed (and a text's record would claim rows never stored): the writer stops too."""
        try:
            yield
        except BaseException as e:
            with self.cond:
                self.error = e if isinstance(e, Exception) else VecgptError(CUT_SHORT)
            raise

    def fail(self, error: Exception) -> None:
        """A round carrying writes failed (vecgpt.rounds): the writer stops with its error, as in `failing`."""
        with self.cond:
            self.error = error
            self.cond.notify_all()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while True:
            with self.cond:
                if not self.queued or self.error is not None:
                    self.running = False
                    self.cond.notify_all()
                    return
                tally = self.queued[0][1]  # a batch is counted in one token: the first write's
                n = next((i for i, (_, t) in enumerate(self.queued) if t is not tally), len(self.queued))
                batch, self.queued = merged([c for c, _ in self.queued[:n]]), self.queued[n:]
                upto = self.issued - len(self.queued)
            with suppress(BaseException), self.failing():  # raised by the session's next call
                self.store.together(*batch, background=tally)
                self.done(upto)


def merged(calls: list[Call]) -> list[Call]:
    """The calls, with each run of upserts into one collection joined into one upsert of all their rows (the rows
    of different ids only: a store's last-write-wins within one request is not assumed)."""
    out: list[Call] = []
    for call in calls:
        if out and joinable(out[-1], call):
            out[-1] = joined(out[-1], call)
        else:
            out.append(call)
    return out


def joinable(a: Call, b: Call) -> bool:
    if a.method != "upsert" or b.method != "upsert" or a.kwargs or b.kwargs or len(a.args) != 5 or len(b.args) != 5:
        return False
    (name, ids, _, attrs, payload), (name_b, ids_b, _, attrs_b, payload_b) = a.args, b.args
    same_attrs = (attrs is None and attrs_b is None) or (
        attrs is not None and attrs_b is not None and attrs.keys() == attrs_b.keys()
    )
    return (
        name == name_b
        and same_attrs
        and (payload is None) == (payload_b is None)
        and not np.intersect1d(ids, ids_b).size
    )


def joined(a: Call, b: Call) -> Call:
    (name, ids, vectors, attrs, payload), (_, ids_b, vectors_b, attrs_b, payload_b) = a.args, b.args
    attrs = None if attrs is None else {k: np.concatenate([attrs[k], attrs_b[k]]) for k in attrs}
    payload = None if payload is None else np.concatenate([payload, payload_b])
    return Call(
        "upsert", (name, np.concatenate([ids, ids_b]), np.concatenate([vectors, vectors_b]), attrs, payload), {}
    )
