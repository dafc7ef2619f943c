"""Counting what the engine asks of a store: requests by kind, subqueries, sequential round trips, the waits for
writes a search needed, and the attention scores (q.k products) taken from the store and from memory.

`Metered` wraps a store: every call through it is counted, and is one round trip unless sent
`together` with others (a wrapper cannot see which calls the engine could send at once; the engine
says so). `later.search(...)` names a call without making it, for `together`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from functools import partial
from typing import NamedTuple

import numpy as np

from vecgpt.backends.base import TEXT_PREFIX, apart, parallel, tally

KINDS = ("open", "lookup", "matrix", "key_write", "key_search", "token_search", "record", "restore", "clone", "wait")
SESSION_PREFIX = TEXT_PREFIX  # a decoding session's keys: text-<id>, tagged layer/head/position
METERED = ("create", "upsert", "search", "search_many", "fetch", "clone", "read_text", "write_text")
ON_TEXTS = {"create": "open", "upsert": "key_write", "fetch": "restore", "clone": "clone"}  # else key_search


class Call(NamedTuple):
    method: str
    args: tuple
    kwargs: dict

    @property
    def kind(self) -> str:
        """What the engine asks for, told by the collection it asks."""
        if self.method in ("read_text", "write_text"):
            return "record"
        first = self.args[0]
        name = first if isinstance(first, str) else first[0].collection  # search_many: a list of Search
        if name.startswith(SESSION_PREFIX):
            return ON_TEXTS.get(self.method, "key_search")
        table = name.rpartition(".")[2]  # a model's collections are <store fingerprint>.<matrix>
        if table == "ln":
            return "open"
        if table in ("wte", "wpe", "lm_head", "embed_tokens"):  # an untied Llama's output matrix and token table
            return "lookup" if self.method == "fetch" else "token_search"
        return "matrix"


class _Later:
    def __getattr__(self, method: str):
        return lambda *args, **kwargs: Call(method, args, kwargs)


later = _Later()


class Meter:
    """Per-token tallies. A round groups requests sent together: it counts one round trip."""

    def __init__(self, store):
        self.concurrent = getattr(store, "concurrent", False)
        self.lock = threading.Lock()
        self.tokens: list[dict] = []
        self.start_token()

    def start_token(self) -> None:
        self.current = {
            "requests": Counter(),
            "subqueries": Counter(),
            "rounds": Counter(),
            "seconds": Counter(),
            "scores": Counter(),
        }
        self.tokens.append(self.current)

    def scored(self, store: int, memory: int, returned: int, values: int) -> None:
        """q.k products attention took: `store` from a key search's distances, `memory` computed in numpy; the keys
        the search `returned` and the `values` attention read (top-k attention: each query's K best and its own)."""
        self.current["scores"].update(store=store, memory=memory, returned=returned, values=values)

    def kept(self, kept, bound: float | None) -> None:
        """Under an attention policy: the earlier keys each head's queries kept ([H, m]), and (a threshold) the most
        weight the keys it dropped could have held."""
        with self.lock:
            by_head = self.current.setdefault("kept", [0] * len(kept))
            self.current["kept"] = [a + int(b) for a, b in zip(by_head, kept.sum(axis=1))]
            self.current["queries"] = self.current.get("queries", 0) + int(kept.shape[1])
            if bound is not None:
                self.current["bound"] = max(self.current.get("bound", 0.0), bound)

    def waited(self, seconds: float) -> None:
        """A search waited for a write to land (kind "wait"): on the critical path, but no request of its own."""
        with self.lock:
            self.current["requests"]["wait"] += 1
            self.current["seconds"]["wait"] += seconds

    def round(self, calls: list[tuple[str, object]], background: dict | None = None) -> list:
        """Run (kind, fn) pairs as one round trip, concurrently where the store allows; their results.
        background: a token's tallies; the round runs beside the critical path (vecgpt.writer), so its requests
        are counted there and it is no round trip."""
        start = time.perf_counter()
        into = background or self.current
        if self.concurrent:
            results = parallel([partial(self._counted, kind, fn, into) for kind, fn in calls])
        else:
            results = [self._counted(kind, fn, into) for kind, fn in calls]
        if background is None:
            with self.lock:
                self.current["rounds"][calls[-1][0]] += 1  # a round is filed under its last (main) kind
                self.current["seconds"][calls[-1][0]] += time.perf_counter() - start
        return results

    def shared(self, requests: list, kind: str | None, seconds: float) -> None:
        """A round this text took part in, sent with other texts' (vecgpt.rounds): its share of each call's requests
        and subqueries, [(kind, counts, share)], and the round trip, filed under `kind` (None: no round trip)."""
        current = self.current
        with self.lock:
            for k, counts, share in requests:
                current["requests"][k] += share * (counts["requests"] or 1)
                current["subqueries"][k] += share * counts["subqueries"]
            if kind is not None:
                current["rounds"][kind] += 1
                current["seconds"][kind] += seconds

    def _counted(self, kind: str, fn, into: dict):
        with tally() as counts:
            result = fn()
        with self.lock:  # a writer thread counts too
            into["requests"][kind] += counts["requests"] or 1  # a store that does not record: one per call
            into["subqueries"][kind] += counts["subqueries"]
        return result

    def summary(self) -> dict:
        return {**summarize(self.tokens), "per_token": [summarize([t]) for t in self.tokens]}


class Metered:
    """A store whose calls in METERED are counted by `meter`; the rest pass through."""

    def __init__(self, store, meter: Meter | None = None):
        self.inner, self.meter = store, meter or Meter(store)

    def together(self, *calls: Call, background: dict | None = None) -> list:
        """Send the calls as one round trip; their results in order (background: see Meter.round)."""
        return self.meter.round([(c.kind, bound(self.inner, c)) for c in calls], background)

    def __getattr__(self, name: str):
        if name in METERED:
            counted = partial(self._one, name)
            setattr(self, name, counted)  # made once: the engine makes about 60 such calls a token
            return counted
        return getattr(self.inner, name)

    def _one(self, name: str, *args, **kwargs):
        return self.together(Call(name, args, kwargs))[0]


def bound(store, c: Call):
    """The call made on the store, ready to run (grouped searches sent apart to a store that cannot take them)."""
    method = getattr(store, c.method)
    if c.method == "search_many" and not getattr(store, "groups", False):
        method = partial(apart, method)
    return partial(method, *c.args, **c.kwargs)


def summarize(tokens: list[dict]) -> dict:
    requests, subqueries, rounds, seconds, scores = Counter(), Counter(), Counter(), Counter(), Counter()
    for t in tokens:
        requests.update(t["requests"]), subqueries.update(t["subqueries"])
        rounds.update(t["rounds"]), seconds.update(t["seconds"]), scores.update(t.get("scores", {}))
    return {
        **policy_summary(tokens),
        "total": exact(sum(n for k, n in requests.items() if k != "wait")),  # requests sent; a wait is none
        "by_kind": {k: exact(requests[k]) for k in KINDS if requests[k]},
        "subqueries": exact(sum(subqueries.values())),
        "subqueries_by_kind": {k: exact(subqueries[k]) for k in KINDS if subqueries[k]},
        "round_trips": sum(rounds.values()),
        "round_trips_by_kind": {k: rounds[k] for k in KINDS if rounds[k]},
        "seconds": round(sum(seconds.values()), 6),
        "seconds_by_kind": {k: round(seconds[k], 6) for k in KINDS if seconds[k]},
        "scores": {k: scores[k] for k in ("store", "memory", "returned", "values")},
    }


def policy_summary(tokens: list[dict]) -> dict:
    """Under an attention policy: the earlier keys kept per head and query, on average, and the most weight a
    threshold's dropped keys could have held in any query (vecgpt.policy.dropped_bound)."""
    kept = [t["kept"] for t in tokens if "kept" in t]
    if not kept:
        return {}
    per_head = np.sum(kept, axis=0) / max(1, sum(t.get("queries", 0) for t in tokens))
    bounds = [t["bound"] for t in tokens if "bound" in t]
    return {
        "kept_per_head": [round(float(k), 3) for k in per_head],
        **({"dropped_bound": max(bounds)} if bounds else {}),
    }


def exact(n: float) -> float | int:
    """A count: a whole number as an int; a share of requests sent for several texts (vecgpt.rounds) rounded."""
    return int(n) if float(n).is_integer() else round(n, 4)
