"""A text's candidates: what each generated position was drawn from, in memory and as rows of text-<id>.c.

One row a position: the top-k ids and each float64 logit as three float32s whose float64 sum is exactly it (`pack`).
A row is not written as it is made: rows wait (`pending`) and go out together, one upsert through the session's
writer, every FLUSH_EVERY positions and at the end of each operation (`flush`). A text's first rows go out sooner,
after 1, 1, 2, 4 and 8 (as many as were written before), so its record claims its first tokens soon after they
are drawn. `landed` is `scored` as the store holds it: the rows of every generated position below it were
acknowledged.
"""

from __future__ import annotations

import numpy as np

from vecgpt.engine import Engine, Session
from vecgpt.meter import later
from vecgpt.sampling import Candidates

CANDIDATES = ".c"  # text-<id>.c: a row a generated position, its candidates as `pack` lays them out
FLUSH_EVERY = 16  # positions whose rows go out as one upsert; a text's record follows them, so it too is 1 in 16


class CandidateRows:
    """A text's candidates by position, the positions whose rows wait to be written, and the tickets of those queued
    (Session.write)."""

    def __init__(self, session: Session, scored: int, first: int):
        self.session, self.first = session, first  # first: the first generated position (the prompt's length)
        self.known: dict[int, Candidates] = {}
        self.scored = scored  # the rows of generated positions below it are in the store
        self.pending: set[int] = set()
        self.tickets: dict[int, int] = {}  # position -> the ticket of the write carrying its row

    def add(self, p: int, c: Candidates) -> None:
        """Position p's candidates, their row written with the next flush."""
        self.known[p] = c
        self.pending.add(p)

    def due(self) -> bool:
        """FLUSH_EVERY rows wait, or as many as the generated positions before them."""
        return bool(self.pending) and len(self.pending) >= min(FLUSH_EVERY, max(1, min(self.pending) - self.first))

    def flush(self) -> None:
        """The waiting rows, queued as one upsert behind every write queued before."""
        if not self.pending:
            return
        ps = np.array(sorted(self.pending))
        rows = np.stack([pack(self.known[p]) for p in ps.tolist()])
        call = later.upsert(self.session.name + CANDIDATES, ps, ps[:, None].astype(np.float32), None, rows)
        ticket = self.session.write(call)
        self.tickets.update(dict.fromkeys(ps.tolist(), ticket))
        self.pending.clear()

    def landed(self) -> int:
        """`scored` as the store holds it: past every position whose row was acknowledged (or needed no write)."""
        s = self.scored
        while s in self.known and s not in self.pending and self.session.acked(self.tickets.get(s, -1)):
            self.tickets.pop(s, None)
            s += 1
        self.scored = s
        return s

    def cut(self, p: int) -> None:
        """Forget the positions after p (p's candidates stay: the next token drawn there is drawn from them)."""
        self.known = {q: c for q, c in self.known.items() if q <= p}
        self.pending = {q for q in self.pending if q <= p}
        self.tickets = {q: t for q, t in self.tickets.items() if q <= p}
        self.scored = min(self.scored, p + 1)

    def take(self, positions: np.ndarray, rows: np.ndarray) -> None:
        """Rows fetched from the store (`fetch`'s payload): known, and nothing to write."""
        self.known.update(zip(positions.tolist(), unpack(rows)))


def fetch(name: str, positions: np.ndarray):
    """The call fetching the candidates rows of these positions of text collection `name` (payload: the rows)."""
    return later.fetch(name + CANDIDATES, positions, payload=True)


def new_session(engine: Engine, name: str, top_k: int) -> Session:
    """A session on a new text collection, with the collection its candidates go to (a row of 4 top_k floats)."""
    session = engine.session(name)
    session.store.create(name + CANDIDATES, 1, "l2", payload=4 * top_k)
    return session


def pack(c: Candidates) -> np.ndarray:
    """[4k] float32: the ids, then each float64 logit as three float32s whose float64 sum is exactly it."""
    hi = c.logits.astype(np.float32)
    rest = c.logits - hi
    mid = rest.astype(np.float32)
    lo = (rest - mid).astype(np.float32)
    return np.concatenate([c.ids.astype(np.float32), hi, mid, lo])


def unpack(rows: np.ndarray) -> list[Candidates]:
    k = rows.shape[1] // 4
    ids, hi, mid, lo = (rows[:, i * k : (i + 1) * k] for i in range(4))
    logits = hi.astype(np.float64) + mid.astype(np.float64) + lo.astype(np.float64)
    return [Candidates(i.astype(np.int64), x) for i, x in zip(ids, logits)]
