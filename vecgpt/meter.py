"""Counting what the engine asks of a store: requests by kind, subqueries, sequential round trips."""

from __future__ import annotations

import time
from collections import Counter

from vecgpt.backends.base import parallel, tally

KINDS = ("open", "lookup", "matrix", "key_write", "key_search", "token_search")


class Meter:
    """Per-token tallies. A round groups requests sent together: it counts one round trip."""

    def __init__(self, store):
        self.concurrent = getattr(store, "concurrent", False)
        self.tokens: list[dict] = []
        self.start_token()

    def start_token(self) -> None:
        self.current = {"requests": Counter(), "subqueries": Counter(), "rounds": Counter(), "seconds": Counter()}
        self.tokens.append(self.current)

    def together(self, *calls) -> list:
        """Run (kind, fn) pairs as one round trip, concurrently where the store allows; their results."""
        start = time.perf_counter()
        wrapped = [lambda kind=kind, fn=fn: self._counted(kind, fn) for kind, fn in calls]
        results = parallel(wrapped) if self.concurrent else [w() for w in wrapped]
        self.current["rounds"][calls[-1][0]] += 1  # a round is filed under its last (main) kind
        self.current["seconds"][calls[-1][0]] += time.perf_counter() - start
        return results

    def _counted(self, kind: str, fn):
        with tally() as counts:
            result = fn()
        self.current["requests"][kind] += counts["requests"] or 1  # a store that does not record: one per call
        self.current["subqueries"][kind] += counts["subqueries"]
        return result

    def summary(self) -> dict:
        return {**summarize(self.tokens), "per_token": [summarize([t]) for t in self.tokens]}


def summarize(tokens: list[dict]) -> dict:
    requests, subqueries, rounds, seconds = Counter(), Counter(), Counter(), Counter()
    for t in tokens:
        requests.update(t["requests"]), subqueries.update(t["subqueries"])
        rounds.update(t["rounds"]), seconds.update(t["seconds"])
    return {
        "total": sum(requests.values()),
        "by_kind": {k: requests[k] for k in KINDS if requests[k]},
        "subqueries": sum(subqueries.values()),
        "subqueries_by_kind": {k: subqueries[k] for k in KINDS if subqueries[k]},
        "round_trips": sum(rounds.values()),
        "round_trips_by_kind": {k: rounds[k] for k in KINDS if rounds[k]},
        "seconds": round(sum(seconds.values()), 6),
        "seconds_by_kind": {k: round(seconds[k], 6) for k in KINDS if seconds[k]},
    }
