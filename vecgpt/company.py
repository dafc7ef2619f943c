"""Texts that read in company: their rounds go to the store together, one search per matrix for all of them.

Each text reads in a thread of its own with its own Session, exactly as it reads alone. A `Company` stands
between those sessions and the store: while texts are in a read (a step), a round trip goes out only once
every text in the step has handed in its round (or finished its read), and then as one round. In it, searches
of one of a model's matrices with the same settings become one search with every text's queries (FAISS scans
the matrix once for all; pgvector runs one statement; turbopuffer packs them into multi_query requests), and fetches of one model table become one fetch. A text's own collection (its keys) is searched
and written per text, in the same round. Results are split back, so each session decodes its own rows.

Steps: a text enters a read at a step's start. One arriving while a step runs waits for its end (at most one
token's time) and starts with the next: texts join and leave between steps, and texts in a step stay on the
same matrix round after round. A step starts once every member (a text whose generation is in progress) is
waiting for it, or a grace after the last step ended (`grace`). A text's numbers do not depend on its company: every store
computes each query alone (docs/batching.md; tests/test_batch.py compares every logit's bits), but for the hosted
turbopuffer, whose subqueries are held to the tolerance rule.

What a shared request costs is split among the texts in it by their share of its queries: a text's meter
counts fractional requests, and every round trip it waited for.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from functools import partial

import numpy as np

from vecgpt.backends.base import Hits, Search, is_text, parallel, tally
from vecgpt.meter import Call, bound

# How long a step waits for a member that is between reads (sampling, saving its record): GRACE_S, or a share of
# the last step's time if longer, up to GRACE_MOST. With many texts each one's work between reads queues for the
# GIL behind the others', and a fixed grace would start steps without the last ones, which then take turns.
GRACE_S, GRACE_SHARE, GRACE_MOST = 0.02, 0.5, 2.0


class Company:
    """The texts of one process that share their rounds trips to one store."""

    def __init__(self, store):
        self.store = store  # the store itself, not a text's Metered
        self.cond = threading.Condition()
        self.members: set = set()  # Metered of texts whose generation is in progress
        self.waiting: set = set()  # ... waiting for the next step
        self.reading: set = set()  # ... reading in this step
        self.handed: dict = {}  # member -> its round's calls
        self.answers: dict = {}  # member -> its calls' results, or the error they raised
        self.ended = self.since = time.monotonic()  # when the last step ended; when the first waiting text came
        self.last_step = 0.0  # how long the last step took
        self.began = self.ended  # when the running step began
        self.rounds = Counter()  # rounds sent, by the number of texts in them (the throughput experiment's)

    # ------------------------------------------------------------ membership and steps

    def join(self, session) -> None:
        """The session's reads go through this company from now on, until `leave`."""
        session.company = session.store.company = self
        with self.cond:
            self.members.add(session.store)

    def leave(self, session) -> None:
        """The session reads alone again (after its generation, or when it failed or was closed)."""
        session.company = session.store.company = None
        with self.cond:
            self.members.discard(session.store)
            self.waiting.discard(session.store)
            self.cond.notify_all()
        if session.store in self.reading:  # left mid-read (from another thread): the others' round goes on
            self._exit(session.store)

    @contextmanager
    def read(self, member):
        """One read of one text: waits for a step to start, and leaves it when done."""
        self._enter(member)
        try:
            yield
        finally:
            self._exit(member)

    def _enter(self, member) -> None:
        with self.cond:
            if not self.waiting:
                self.since = time.monotonic()
            self.waiting.add(member)
            self.cond.notify_all()
            while member not in self.reading:
                if not self.reading and self._ready():
                    self.reading, self.waiting, self.began = set(self.waiting), set(), time.monotonic()
                    self.cond.notify_all()
                    continue
                self.cond.wait(max(0.001, self._grace_left()) if not self.reading else None)

    def _ready(self) -> bool:
        """A step starts once every member waits for it, or a grace after the last step ended (or, if later, after
        the first text began to wait): texts that miss it start the next."""
        return self.waiting >= self.members or self._grace_left() <= 0

    def _grace_left(self) -> float:
        grace = min(max(GRACE_S, GRACE_SHARE * self.last_step), GRACE_MOST)
        return grace - (time.monotonic() - max(self.ended, self.since))

    def _exit(self, member) -> None:
        with self.cond:
            self.reading.discard(member)
            if not self.reading:
                self.ended = time.monotonic()
                self.last_step = self.ended - self.began
            self.handed.pop(member, None)
            self.cond.notify_all()
            ready = self._full()
        if ready:
            self._send()

    def stepping(self, member) -> bool:
        return member in self.reading

    # ------------------------------------------------------------ rounds

    def round(self, member, calls: tuple[Call, ...]) -> list:
        """Hand in a text's round; its results once the round every text in the step handed in has run."""
        with self.cond:
            self.handed[member] = calls
            ready = self._full()
        if ready:
            self._send()
        with self.cond:
            while member not in self.answers:
                self.cond.wait()
            answer = self.answers.pop(member)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _full(self) -> bool:
        return bool(self.handed) and self.reading <= self.handed.keys()

    def _send(self) -> None:
        with self.cond:
            if not self._full():  # another thread took this round
                return
            handed, self.handed = self.handed, {}
        began = time.perf_counter()
        try:
            answers = self._run(handed)
        except BaseException as e:  # a fault of this module's own: every text in the round gets it, none waits on
            answers = dict.fromkeys(handed, e)
        seconds = time.perf_counter() - began
        for member, calls in handed.items():
            if not isinstance(answers[member], BaseException):
                member.meter.shared_round(calls[-1].kind, seconds)
        with self.cond:
            self.rounds[len(handed)] += 1
            self.answers.update(answers)
            self.cond.notify_all()

    def _run(self, handed: dict) -> dict:
        """Every text's calls as one round: writes and fetches first (each text's in its order), then the searches,
        those of one matrix as one search. Each text gets its calls' results, or the first error among them."""
        plan = Plan(handed)
        outcomes, counts = self._call_all(plan.calls)
        answers = {}
        for member in handed:
            failed = next((outcomes[i] for i in plan.used[member] if isinstance(outcomes[i], BaseException)), None)
            answers[member] = failed or plan.results(member, outcomes)
            for i, share in plan.shares[member].items():
                if not isinstance(outcomes[i], BaseException):
                    member.meter.shared_requests(plan.calls[i].kind, counts[i], share)
        return answers

    def _call_all(self, calls: list[Call]) -> tuple[list, list[dict]]:
        """The merged calls, concurrently where the store allows, else in order (writes and fetches before the
        searches): each one's result or error, and the requests it sent."""
        counts = [{"requests": 0, "subqueries": 0} for _ in calls]

        def one(i: int):
            try:
                with tally() as tallied:
                    out = bound(self.store, calls[i])()
                counts[i] = dict(tallied)
                return out
            except Exception as e:  # the texts that asked for this call get it; the others go on
                return e

        if getattr(self.store, "concurrent", False):
            return parallel([partial(one, i) for i in range(len(calls))]), counts
        return [one(i) for i in range(len(calls))], counts


class Plan:
    """How a round's calls from several texts become fewer calls, and how their results go back."""

    def __init__(self, handed: dict):
        self.calls: list[Call] = []
        self.used: dict = defaultdict(list)  # member -> indexes of the merged calls its results need
        self.shares: dict = defaultdict(dict)  # member -> {merged call index: its share of that call}
        self.back: dict = {}  # member -> per call of its own: how to take its result from the merged ones
        searches: dict = {}  # a key naming searches that merge -> [(member, call index, search index, Search)]
        fetches: dict = {}
        for member, calls in handed.items():
            self.back[member] = [self._place(member, i, c, searches, fetches) for i, c in enumerate(calls)]
        self._merge_fetches(fetches)
        self._merge_searches(searches)

    def _place(self, member, i: int, c: Call, searches: dict, fetches: dict):
        if c.method == "search":  # Store.search(name, queries, k=None, where=None): one Search
            s = Search(*c.args, **c.kwargs)
            searches.setdefault(search_key(s), []).append((member, i, 0, s))
            return ("search", 1)
        if c.method == "search_many" and not c.kwargs:
            for j, s in enumerate(c.args[0]):
                searches.setdefault(search_key(s), []).append((member, i, j, s))
            return ("searches", len(c.args[0]))
        if c.method == "fetch" and shared_table(c.args[0]) and len(c.args) == 2 and set(c.kwargs) <= {"payload"}:
            fetches.setdefault((c.args[0], bool(c.kwargs.get("payload"))), []).append((member, i, c))
            return ("fetch", None)
        self.calls.append(c)
        self._use(member, len(self.calls) - 1, 1.0)
        return ("call", len(self.calls) - 1)

    def _use(self, member, index: int, share: float) -> None:
        self.used[member].append(index)
        self.shares[member][index] = self.shares[member].get(index, 0.0) + share

    def _merge_fetches(self, fetches: dict) -> None:
        self.fetched: dict = {}  # (member, call index) -> (merged call index, where its rows are in the answer)
        for (name, payload), asks in fetches.items():
            wanted = [np.asarray(c.args[1], np.int64).ravel() for _, _, c in asks]
            ids, inverse = np.unique(np.concatenate(wanted), return_inverse=True)
            self.calls.append(Call("fetch", (name, ids), {"payload": True} if payload else {}))
            at, index = 0, len(self.calls) - 1
            for (member, i, _), w in zip(asks, wanted):
                self.fetched[member, i] = (index, inverse[at : at + len(w)])
                self._use(member, index, len(w) / len(inverse))
                at += len(w)

    def _merge_searches(self, searches: dict) -> None:
        """Searches of one kind go out as one search_many; searches of one matrix with the same settings in it as
        one Search with all their queries."""
        by_kind: dict = defaultdict(list)  # (kind, its text) -> [(merged Search, [(member, call, search, rows)])]
        for key, asks in searches.items():
            if key is None or len(asks) == 1:  # a text's own collection: a call of its own, whose error is its alone
                for member, i, j, s in asks:
                    kind = Call("search_many", ([s],), {}).kind
                    by_kind[kind, None if shared_table(s.collection) else member].append((s, [(member, i, j, None)]))
                continue
            queries = [np.asarray(s.queries) for *_, s in asks]
            bounds = np.cumsum([0] + [len(q) for q in queries])
            first = asks[0][3]
            merged = Search(first.collection, np.concatenate(queries), first.k, first.where, first.vectors)
            spans = [(m, i, j, (int(a), int(b))) for (m, i, j, _), a, b in zip(asks, bounds[:-1], bounds[1:])]
            by_kind[Call("search_many", ([merged],), {}).kind, None].append((merged, spans))
        self.searched: dict = {}  # (member, call, search) -> (merged call index, search index, rows or None)
        for group in by_kind.values():
            self.calls.append(Call("search_many", ([s for s, _ in group],), {}))
            index = len(self.calls) - 1
            total = sum(len(s.queries) for s, _ in group)
            for j, (s, spans) in enumerate(group):
                for member, i, k, rows in spans:
                    self.searched[member, i, k] = (index, j, rows)
                    self._use(member, index, (len(s.queries) if rows is None else rows[1] - rows[0]) / total)

    def results(self, member, outcomes: list) -> list:
        out = []
        for i, (how, what) in enumerate(self.back[member]):
            if how == "call":
                out.append(outcomes[what])
            elif how == "fetch":
                index, rows = self.fetched[member, i]
                found = outcomes[index]
                out.append(tuple(a[rows] for a in found) if isinstance(found, tuple) else found[rows])
            else:
                hits = [self._hits(outcomes, self.searched[member, i, j]) for j in range(what)]
                out.append(hits[0] if how == "search" else hits)
        return out

    @staticmethod
    def _hits(outcomes: list, where: tuple) -> Hits:
        index, j, rows = where
        hits = outcomes[index][j]
        if rows is None:
            return hits
        a, b = rows
        ids = hits.ids if len(hits.ids) == 1 and len(hits.dists) > 1 else hits.ids[a:b]  # one row: every query's
        return Hits(ids, hits.dists[a:b], None if hits.vectors is None else hits.vectors[a:b])


def shared_table(name: str) -> bool:
    """A model's collection (every text reads it alike), not a text's own."""
    return isinstance(name, str) and not is_text(name)


def search_key(s: Search):
    """What searches must share to become one (None: this one never merges: a text's keys, a grouped search)."""
    if s.by is not None or not shared_table(s.collection) or np.ndim(s.queries) != 2:
        return None
    where = None if s.where is None else tuple(sorted((k, tuple(sorted(v.items()))) for k, v in vars(s.where).items()))
    return s.collection, s.k, where, s.vectors, np.shape(s.queries)[1]
