"""One round trip for the texts of a step (vecgpt.engine.Step): the model's matrices searched once for every text's
rows, every text's key searches pooled into one call, each text's own calls (its writes) beside them, and what was
sent counted in each text's meter.

A shared call is split among the texts in it by their share of its queries (a text's meter counts fractional
requests). The texts' key searches (`pooled`) go to the store as one `search_many`, which a store answers in as few
requests as it can; each text's part of it is its searches' share. A key search that fails fails its own text alone:
when the pooled call fails, each text's searches are sent again apart, and only those that fail then get the error.
A text's own calls are its alone, and so is their failure. A shared call that fails fails every text in the round.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from functools import partial

from vecgpt.backends.base import parallel, tally
from vecgpt.meter import Call, bound

POOL = "pool"  # the owner of the round's pooled key searches in its plan


def send(store, shared: list[Call], weights: dict, own: dict, pooled: dict | None = None) -> tuple[list, dict, dict]:
    """Send `shared` calls (each text's part by `weights`: session -> its rows), every session's `pooled` searches
    ({session: [Search]}) as one call, and each session's `own` calls, with the writes waiting to ride along, as one
    round: (the shared results, {session: its own results, then its pooled searches' hits}, {session: its error})."""
    pooled = {s: p for s, p in (pooled or {}).items() if p}
    members = [s for s in weights if (shared and weights[s]) or own.get(s)]
    members += [s for s in [*own, *pooled] if s not in members]
    plan, takes, failed = [], {}, {}
    for s in members:
        try:
            writes, takes[s] = s.writer.take()
        except Exception as e:  # its writer stopped on an earlier failure
            failed[s] = e
            continue
        plan += [(c, s, True) for c in writes]
    plan += [(c, None, False) for c in shared]
    pool = {s: p for s, p in pooled.items() if s not in failed}
    if pool:
        plan.append((Call("search_many", ([x for p in pool.values() for x in p],), {}), POOL, False))
    plan += [(c, s, False) for s in members if s not in failed for c in own.get(s, ())]
    began = time.perf_counter()
    with ExitStack() as stack:  # cut short (Ctrl-C): the writers whose rows rode along stop (Writer.failing)
        for s in {s for _, s, write in plan if write}:
            stack.enter_context(s.writer.failing())
        outcomes = run(store, [c for c, *_ in plan])
        at = next((i for i, (_, owner, _) in enumerate(plan) if owner is POOL), None)
        if at is not None and isinstance(outcomes[at][0], Exception):
            outcomes = apart(store, plan, outcomes, pool, at)
    return settle(plan, outcomes, weights, members, takes, failed, time.perf_counter() - began, pool)


def apart(store, plan, outcomes, pool, at: int) -> list:
    """The pooled call failed: each text's searches again, alone, so that only a text whose own search fails gets the
    error (its store lost its keys) and the others read on. The pooled entry's outcome becomes one per text."""
    each = run(store, [Call("search_many", (p,), {}) for p in pool.values()])
    return [*outcomes[:at], (dict(zip(pool, each)), None), *outcomes[at + 1 :]]


def settle(plan, outcomes, weights, members, takes, failed, seconds, pool) -> tuple[list, dict, dict]:
    """Each member's results and meter, from the round's outcomes [(result or error, counts)]."""
    shared_out, own_out, last = [], {s: [] for s in members}, {}  # last: a member's round is filed under its
    total = sum(weights.values()) or 1  # last call's kind (writes, then the shared calls, then its own: plan's order)
    tallies, pooled_out = {s: [] for s in members}, {}  # each member's share of each call: (kind, counts, share)
    for (call, owner, write), (result, counts) in zip(plan, outcomes):
        kind = call.kind
        if owner is POOL:
            pooled_out = share_pool(pool, result, counts, kind, failed, last, tallies)
        elif owner is None:
            shared_out.append(result)
            for s in members:
                if isinstance(result, Exception):
                    failed.setdefault(s, result)
                elif weights.get(s):
                    tallies[s].append((kind, counts, weights[s] / total))
                last[s] = kind
        else:
            last[owner] = kind
            if isinstance(result, Exception):
                failed.setdefault(owner, result)
                if write:  # as Writer.failing: a later round's acknowledgement must not count this write as landed
                    owner.writer.fail(result)
            else:
                tallies[owner].append((kind, counts, 1.0))
                if not write:
                    own_out[owner].append(result)
    for s, hits in pooled_out.items():
        own_out[s].append(hits)
    for s in members:
        s.meter.shared(tallies[s], last.get(s), seconds)
        if s not in failed:
            s.writer.done(takes[s])
    return shared_out, own_out, failed


def share_pool(pool, result, counts, kind, failed, last, tallies) -> dict:
    """The pooled key searches' hits, split back by text ({session: [Hits]}), each text's meter counting its share
    of the requests (by its searches); sent again apart (`apart`): each text's own outcome and requests."""
    out, total = {}, sum(len(p) for p in pool.values())
    if counts is None:  # sent apart
        for s, (hits, each) in result.items():
            last[s] = kind
            if isinstance(hits, Exception):
                failed.setdefault(s, hits)
            else:
                tallies[s].append((kind, each, 1.0))
                out[s] = hits
        return out
    at = 0
    for s, p in pool.items():
        last[s] = kind
        if isinstance(result, Exception):
            failed.setdefault(s, result)
        else:
            tallies[s].append((kind, counts, len(p) / total))
            out[s] = result[at : at + len(p)]
        at += len(p)
    return out


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
