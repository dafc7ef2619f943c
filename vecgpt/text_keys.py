"""A text's attention keys in the store: the rows a read writes, the search of a layer's earlier keys, and the
decoding of its hits into q.k (engine.Step runs these for every text of a step, their searches in one call).

A query at position i scores every earlier position's key (j < i) by a search of the store, and only its own key
(j = i, computed in the same read) in numpy. Which key is scored where depends on positions alone, never on when
a write landed, so a text resumed in another process computes what the first one did, bit for bit.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from vecgpt import encoding, key_bounds
from vecgpt.backends.base import Search, Where
from vecgpt.errors import VecgptError
from vecgpt.meter import later
from vecgpt.policy import Policy
from vecgpt.policy import dropped_bound as bound
from vecgpt.session import squared_norms


class Asked(NamedTuple):
    """A text's key searches of a layer: the queries as sent (sent, scale), its searches, and for each what it is:
    "all" (every earlier key), "sinks", "window", "top" (the K best between them), "best" (the best between them,
    for a threshold's radius) or "range" (every key between them within the radius); the positions (lo, hi) it
    searches (the keys an exact search scores), and the query of the read it serves (None: every one)."""

    sent: tuple
    searches: list
    kinds: list
    spans: list
    rows: list


def searched_end(start: int, m: int = 1) -> int:
    """A read of m positions from `start` searches the store for the keys below this: every position before its
    last query's (each query sees those before its own); each query's own key is scored in memory."""
    return start + m - 1


def drops(policy: Policy, i: int) -> bool:
    """Whether a policy may leave out an earlier key of a query at position i."""
    if not policy.active:
        return False
    a, b = policy.middle(i)
    if policy.top_k is not None:
        return policy.top_k < b - a
    return b - a > (1 if policy.threshold is not None else 0)


def pruned(s, start: int, m: int) -> bool:
    """Whether the session's policy may leave out an earlier key of some query of a read of m positions."""
    return s.policy.active and any(drops(s.policy, i) for i in range(start, start + m))


def stacked(q: np.ndarray, group: int) -> np.ndarray:  # q [m, H, hd] -> [H_kv, m group, hd]
    """Queries by the key head they read (grouped-query attention: `group` query heads a key head, consecutive), each
    key head's row r * group + g the read's row r of its query head g; group 1: by head."""
    m, n_head, hd = q.shape
    if group == 1:
        return q.transpose(1, 0, 2)
    return q.reshape(m, n_head // group, group, hd).transpose(1, 0, 2, 3).reshape(n_head // group, m * group, hd)


def by_query_head(a: np.ndarray, group: int) -> np.ndarray:  # [H_kv, m group, n] -> [H, m, n]: stacked's inverse
    if group == 1:
        return a
    n_kv, rows, n = a.shape
    return a.reshape(n_kv, rows // group, group, n).transpose(0, 2, 1, 3).reshape(n_kv * group, rows // group, n)


def key_search(s, q, layer, start, group: int = 1) -> Asked | None:  # q [m, H, hd] -> its searches, or None
    """The searches of this layer's keys below the last query's position, once their rows have landed: every one
    in one search, or (a policy that drops keys) each query's own: its sinks, its window and the policy's choice
    between them, each a filter on positions (and a top-k or a range search) of the store's. Each key head's search
    carries its `group` query heads' queries (`stacked`); a text's `hp` counts its key heads."""
    end = searched_end(start, len(q))
    if not end:
        return None
    s.await_layer(layer)
    sent = encoding.key_queries(stacked(q, group), s.key_norms[layer, :, :end], s.metric)
    if s.engine.key_bound is not None:  # the queries' pad column: 0
        sent = (np.concatenate([sent[0], np.zeros((*sent[0].shape[:-1], 1), np.float32)], -1), sent[1])
    if not pruned(s, start, len(q)):
        return Asked(sent, [keys(s, sent[0], layer, 0, end)], ["all"], [(0, end)], [None])
    parts = [(r, *part) for r in range(len(q)) for part in query_parts(s.policy, start + r, s.engine.attention_index)]
    searches = [keys(s, sent[0][:, r * group : (r + 1) * group], layer, lo, hi, **kw) for r, _, lo, hi, kw in parts]
    return Asked(sent, searches, [p[1] for p in parts], [(p[2], p[3]) for p in parts], [p[0] for p in parts])


def query_parts(policy: Policy, i: int, index) -> list[tuple]:
    """A query at position i: its searches as (kind, lo, hi, options), the empty ones left out."""
    if not drops(policy, i):
        return [("all", 0, i, {})] if i else []
    a, b = policy.middle(i)
    parts = [("sinks", 0, a, {}), ("window", b, i, {})]
    if policy.top_k is not None:
        parts.append(("top", a, b, {"k": min(policy.top_k, b - a), "index": index}))
    elif policy.threshold is not None:
        parts.append(("best", a, b, {"k": 1}))
    return [p for p in parts if p[2] > p[1]]


def keys(s, queries, layer, lo, hi, **options) -> Search:  # a search of each head's keys at positions lo..hi-1
    where = Where(eq={"layer": layer}, ge={"position": lo} if lo else {}, lt={"position": hi})
    return Search(s.name, queries, where=where, by="head", **options)


def follow_up(s, asked: Asked, found, layer, group: int = 1) -> Asked | None:
    """A threshold's second searches, once the first found each query's best key between its sinks and window:
    every key there whose distance is within the radius that beta makes of the best's (the store's range search)."""
    best = [j for j, kind in enumerate(asked.kinds) if kind == "best"]
    if not best:
        return None
    gap = s.policy.threshold * math.sqrt(s.hp.head_dim)  # in q.k; a distance moves by it times:
    searches, kinds, spans, rows = list(asked.searches), list(asked.kinds), list(asked.spans), list(asked.rows)
    for j in best:
        r, (a, b) = asked.rows[j], asked.spans[j]
        part = slice(r * group, (r + 1) * group)
        per_qk = 1.0 if s.metric == "ip" else 2.0 * np.asarray(asked.sent[1], np.float64)[:, part]  # l2: 2 s
        radius = found[j].dists[..., 0].astype(np.float64) + gap * per_qk  # [H_kv, group]
        searches.append(keys(s, asked.sent[0][:, part], layer, a, b, radius=radius))
        kinds.append("range"), spans.append((a, b)), rows.append(r)
    return Asked(asked.sent, searches, kinds, spans, rows)


def key_scores(s, asked, found, layer, start, m, group: int = 1):  # hits -> q.k [H, m, start + m - 1]
    """Every earlier key's q.k by query head, -inf for keys the policy leaves out."""
    n_head, end = s.hp.n_head * group, searched_end(start, m)
    if asked is None:
        s.meter.scored(store=0, memory=n_head * m, returned=0, values=n_head * m)
        return np.zeros((n_head, m, 0))
    if asked.kinds == ["all"]:  # every earlier key: query r has start + r of them, all scored
        scores = by_query_head(key_columns(s, asked.sent, found[0], layer, end), group)
        returned, store = int(found[0].ids.size), n_head * (m * start + m * (m - 1) // 2)
        kept = np.broadcast_to(np.arange(start, start + m), (n_head, m))
    else:
        scores = chosen_columns(s, asked, found, layer, end, m, group)
        returned = sum(int((h.ids >= 0).sum()) for h, k in zip(found, asked.kinds) if k != "best")
        store = sum(n_head * (hi - lo) if h.scored is None else h.scored for h, (lo, hi) in zip(found, asked.spans))
        earlier = np.arange(end) < np.arange(start, start + m)[:, None]  # each query's earlier keys
        kept = (np.isfinite(scores) & earlier).sum(axis=-1)  # [H, m]
    s.meter.scored(store=store, memory=n_head * m, returned=returned, values=int(kept.sum()) + n_head * m)
    if s.policy.active:
        s.meter.kept(kept, dropped_bound(s.policy, kept, start))
    return scores


def dropped_bound(policy: Policy, kept, start: int):  # the most weight a threshold's dropped keys could hold
    if policy.threshold is None:
        return None
    earlier = np.arange(start, start + kept.shape[1])  # each query's earlier keys
    return float(bound(policy.threshold, earlier - kept).max())


def chosen_columns(s, asked, found, layer, end, m, group=1):  # a policy's hits -> q.k [H, m, end], else -inf
    n_kv, n_ctx = s.hp.n_head, s.hp.n_ctx
    scores = np.full((n_kv, m * group, end + 1), -np.inf)  # a missing key (id -1) goes to column `end`, cut off
    heads = (layer * n_kv + np.arange(n_kv))[:, None, None]
    for hits, kind, r in zip(found, asked.kinds, asked.rows):
        if kind == "best":
            continue
        part, ids, missing = slice(r * group, (r + 1) * group), hits.ids, hits.ids < 0  # ids [H_kv, group, n]
        if ((ids // n_ctx != heads) | (ids % n_ctx >= end)).any(where=~missing):
            raise VecgptError(
                f"the store's key search in layer {layer} returned other keys than this session wrote; "
                f"start the text again"
            )
        at = np.where(missing, end, ids % n_ctx)
        norms = s.key_norms[layer][np.arange(n_kv)[:, None, None], np.minimum(at, end - 1)]
        scale = np.asarray(asked.sent[1])[:, part]
        qk = encoding.decode_key_dists(hits.dists, asked.sent[0][:, part], norms, s.metric, scale)
        np.put_along_axis(scores[:, part], at, qk, -1)
    return by_query_head(scores[..., :end], group)


def key_columns(s, sent, found, layer, end):  # every earlier key's hits -> q.k [H, m, end], in position order
    ids, dists = found.ids, found.dists  # [H, m, n]
    if ids.shape[-1] != end:  # rows removed under the text (closed, lost by a store)
        raise VecgptError(
            f"the store lost keys of this session ({ids.shape[-1]} of {end} positions found in layer {layer}); "
            f"start the text again"
        )
    if not (ids[..., 1:] > ids[..., :-1]).all():  # each head: its keys in position order (in-process: already)
        order = np.argsort(ids, axis=-1)
        ids, dists = np.take_along_axis(ids, order, -1), np.take_along_axis(dists, order, -1)
    if not np.array_equal(ids[0, 0] % s.hp.n_ctx, np.arange(end)):  # the same for every head and query
        raise VecgptError(f"the store holds other keys than this session wrote in layer {layer}; start the text again")
    norms = s.key_norms[layer][:, None, :end]  # [H, 1, n]
    return encoding.decode_key_dists(dists, *sent[:1], norms, s.metric, sent[1])


def stored_rows(s, layer, vectors) -> np.ndarray:
    """Key rows [m, H, w] as the store holds them: float32, and under l2 with the pad to the layer's bound R
    (vecgpt.key_bounds), so that the store's distance ranks them by q.k."""
    bound = s.engine.key_bound
    return np.asarray(vectors, np.float32) if bound is None else key_bounds.padded(vectors, bound[layer])


def keep_norms(s, layer, start, vectors) -> None:
    """|row|^2 of the positions start.. of a layer, rows [m, H, w] as stored: what decoding their distances needs."""
    s.reserve(start + len(vectors))
    s.key_norms[layer, :, start : start + len(vectors)] = squared_norms(stored_rows(s, layer, vectors)).T


def queue_rows(s, layer, start, vectors, payload) -> None:
    """A layer's rows of the positions being read: a block's are written at once (its key search waits for
    them); a decode step's go out at the layers of `writes_at`, with the layers read since the last write."""
    if s.capture is not None:  # an inspection writes nothing
        return
    s.pending.append((layer, start, stored_rows(s, layer, vectors), np.asarray(payload, np.float32)))
    if len(vectors) > 1 or layer in s.writes_at:
        ticket = s.write(later.upsert(*key_rows(s, s.pending)))
        s.layer_ticket.update((entry[0], ticket) for entry in s.pending)
        s.pending = []


def key_rows(s, entries):  # [(layer, start, k32 [m, H, hd], pv [m, H, d])] -> one upsert's arguments
    n_head = s.hp.n_head
    sizes = [len(k32) * n_head for _, _, k32, _ in entries]  # rows: m H each
    layer, start = (np.repeat([e[i] for e in entries], sizes) for i in (0, 1))
    offset = np.arange(sum(sizes)) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # a row's place in its entry
    pos, head = start + offset // n_head, offset % n_head
    vectors, values = (np.concatenate([e[i].reshape(-1, e[i].shape[-1]) for e in entries]) for i in (2, 3))
    return s.name, s.key_ids(layer, head, pos), vectors, {"layer": layer, "head": head, "position": pos}, values
