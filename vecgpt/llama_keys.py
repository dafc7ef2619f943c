"""Grouped-query attention's key searches and softmax for the Llama family (vecgpt.llama_rounds).

A text keeps n_kv_head heads of keys (its Session's `hp` counts those). Query heads kv * group .. kv * group + group - 1
read key head kv (families.key_head), so a layer's key search is text_keys' search by head with each key head's
group of queries stacked: row r * group + g of key head kv is query head kv * group + g at the read's row r. A search
by head counts a request per key head: n_kv_head a layer, not n_head. What a search returns is decoded by
text_keys' functions, then laid out again by query head [n_head, m, n].
"""

from __future__ import annotations

import math

import numpy as np

from vecgpt import encoding
from vecgpt.attend import softmax_in_place
from vecgpt.errors import VecgptError
from vecgpt.text_keys import Asked, dropped_bound, key_columns, keys, pruned, query_parts, searched_end


def stacked(q: np.ndarray, group: int) -> np.ndarray:  # q [m, H, hd] -> [H_kv, m group, hd]
    m, n_head, hd = q.shape
    return q.reshape(m, n_head // group, group, hd).transpose(1, 0, 2, 3).reshape(n_head // group, m * group, hd)


def by_query_head(a: np.ndarray, group: int) -> np.ndarray:  # [H_kv, m group, n] -> [H, m, n]
    n_kv, rows, n = a.shape
    return a.reshape(n_kv, rows // group, group, n).transpose(0, 2, 1, 3).reshape(n_kv * group, rows // group, n)


def key_search(s, q, layer, start, group) -> Asked | None:  # q [m, H, hd] -> its searches, or None: no earlier key
    """text_keys.key_search with each key head's group of queries stacked: every earlier key in one search, or
    (a policy that drops keys) each read row's own searches, its group's queries together (each its own top K)."""
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


def follow_up(s, asked: Asked, found, layer, group) -> Asked | None:
    """A threshold's range searches (text_keys.follow_up), a radius per stacked query."""
    best = [j for j, kind in enumerate(asked.kinds) if kind == "best"]
    if not best:
        return None
    gap = s.policy.threshold * math.sqrt(s.hp.head_dim)
    searches, kinds, spans, rows = list(asked.searches), list(asked.kinds), list(asked.spans), list(asked.rows)
    for j in best:
        r, (a, b) = asked.rows[j], asked.spans[j]
        part = slice(r * group, (r + 1) * group)
        per_qk = 1.0 if s.metric == "ip" else 2.0 * np.asarray(asked.sent[1], np.float64)[:, part]
        radius = found[j].dists[..., 0].astype(np.float64) + gap * per_qk  # [H_kv, group]
        searches.append(keys(s, asked.sent[0][:, part], layer, a, b, radius=radius))
        kinds.append("range"), spans.append((a, b)), rows.append(r)
    return Asked(asked.sent, searches, kinds, spans, rows)


def key_scores(s, asked, found, layer, start, m, group):  # hits -> q.k [H, m, start + m - 1], -inf: left out
    """text_keys.key_scores for stacked queries, counted by query head."""
    n_head, end = s.hp.n_head * group, searched_end(start, m)
    if asked is None:
        s.meter.scored(store=0, memory=n_head * m, returned=0, values=n_head * m)
        return np.zeros((n_head, m, 0))
    earlier = np.arange(end) < np.arange(start, start + m)[:, None]
    if asked.kinds == ["all"]:
        scores = by_query_head(key_columns(s, asked.sent, found[0], layer, end), group)
        returned, store = int(found[0].ids.size), n_head * int(earlier.sum())
    else:
        scores = chosen_columns(s, asked, found, layer, end, m, group)
        returned = sum(int((h.ids >= 0).sum()) for h, k in zip(found, asked.kinds) if k != "best")
        store = sum(n_head * (hi - lo) if h.scored is None else h.scored for h, (lo, hi) in zip(found, asked.spans))
    kept = (np.isfinite(scores) & earlier).sum(axis=-1)  # [H, m]
    s.meter.scored(store=store, memory=n_head * m, returned=returned, values=int(kept.sum()) + n_head * m)
    if s.policy.active:
        s.meter.kept(kept, dropped_bound(s.policy, kept, start))
    return scores


def chosen_columns(s, asked, found, layer, end, m, group):  # a policy's hits -> q.k [H, m, end], else -inf
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


def attend(s, searched, own, start, layer, group) -> np.ndarray:  # -> [H, m, hd]
    """One text's grouped-query attention (reference_llama.attention's maths): each query head's softmax over its
    earlier keys' q.k (-inf where a policy left one out) and its own, by 1 / sqrt(hd), times its key head's values."""
    n_head, m = own.shape
    n, rows, hd = start + m, np.arange(m), s.hp.head_dim
    scores = np.empty((n_head, m, n))
    scores[..., : n - 1] = searched
    scores[:, rows, start + rows] = own
    if m > 1:  # a block's later keys are masked
        np.copyto(scores, -np.inf, where=np.arange(n) > (start + rows)[:, None])
    scores /= math.sqrt(hd)
    weights = softmax_in_place(scores).reshape(n_head // group, group * m, n)
    return (weights @ s.projected[layer, :, :n]).reshape(n_head, m, hd)
