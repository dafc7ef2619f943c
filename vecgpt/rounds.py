"""One round trip for the texts of a step (vecgpt.engine.Step): the model's matrices searched once for every text's
rows, each text's own calls (its keys, its writes) beside them, and what was sent counted in each text's meter.

A shared call is split among the texts in it by their share of its queries (a text's meter counts fractional
requests); a text's own calls are its alone, and so is their failure: a text whose key search or write fails gets the
error and the others read on. A shared call that fails fails every text in the round.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from functools import partial

from vecgpt.backends.base import parallel, tally
from vecgpt.meter import Call, bound


def send(store, shared: list[Call], weights: dict, own: dict) -> tuple[list, dict, dict]:
    """Send `shared` calls (each text's part by `weights`: session -> its rows) and each session's `own` calls, with
    the writes waiting to ride along, as one round: (the shared results, {session: its own results}, {session: the
    error that failed it})."""
    members = [s for s in weights if (shared and weights[s]) or own.get(s)] + [s for s in own if s not in weights]
    plan, takes, failed = [], {}, {}
    for s in members:
        try:
            writes, takes[s] = s.writer.take()
        except Exception as e:  # its writer stopped on an earlier failure
            failed[s] = e
            continue
        plan += [(c, s, True) for c in writes]
    plan += [(c, None, False) for c in shared]
    plan += [(c, s, False) for s in members if s not in failed for c in own.get(s, ())]
    began = time.perf_counter()
    with ExitStack() as stack:  # cut short (Ctrl-C): the writers whose rows rode along stop (Writer.failing)
        for s in {s for _, s, write in plan if write}:
            stack.enter_context(s.writer.failing())
        outcomes = run(store, [c for c, *_ in plan])
    seconds = time.perf_counter() - began
    return settle(plan, outcomes, weights, members, takes, failed, seconds)


def settle(plan, outcomes, weights, members, takes, failed, seconds) -> tuple[list, dict, dict]:
    """Each member's results and meter, from the round's outcomes [(result or error, counts)]."""
    shared_out, own_out, last = [], {s: [] for s in members}, {}  # last: a member's round is filed under its
    total = sum(weights.values()) or 1  # last call's kind (writes, then the shared calls, then its own: plan's order)
    for (call, owner, write), (result, counts) in zip(plan, outcomes):
        kind = call.kind
        if owner is None:
            shared_out.append(result)
            for s in members:
                if isinstance(result, Exception):
                    failed.setdefault(s, result)
                elif weights.get(s):
                    s.meter.shared_requests(kind, counts, weights[s] / total)
                last[s] = kind
            continue
        last[owner] = kind
        if isinstance(result, Exception):
            failed.setdefault(owner, result)
            if write:  # as Writer.failing: a later round's acknowledgement must not count this write as landed
                owner.writer.fail(result)
            continue
        owner.meter.shared_requests(kind, counts, 1.0)
        if not write:
            own_out[owner].append(result)
    for s in members:
        if s in last:
            s.meter.shared_round(last[s], seconds)
        if s not in failed:
            s.writer.done(takes[s])
    return shared_out, own_out, failed


def run(store, calls: list[Call]) -> list[tuple]:
    """The calls, concurrently where the store allows, else in order: each one's result or error, and the requests
    it sent."""

    def one(c: Call):
        try:
            with tally() as counts:
                out = bound(store, c)()
            return out, dict(counts)
        except Exception as e:
            return e, {"requests": 0, "subqueries": 0}

    if getattr(store, "concurrent", False) and len(calls) > 1:
        return parallel([partial(one, c) for c in calls])
    return [one(c) for c in calls]
