"""A text's attention keys in the store: the rows a read writes, the search of a layer's earlier keys, and the
decoding of its hits into q.k (engine.Step runs these for every text of a step, their searches in one call).

A query at position i scores every earlier position's key (j < i) by a search of the store, and only its own key
(j = i, computed in the same read) in numpy. Which key is scored where depends on positions alone, never on when
a write landed, so a text resumed in another process computes what the first one did, bit for bit.
"""

from __future__ import annotations

import numpy as np

from vecgpt import encoding
from vecgpt.backends.base import Search, Where
from vecgpt.errors import VecgptError
from vecgpt.meter import later


def searched_end(start: int, m: int = 1) -> int:
    """A read of m positions from `start` searches the store for the keys below this: every position before its
    last query's (each query sees those before its own); each query's own key is scored in memory."""
    return start + m - 1


def pruned(s, start: int, m: int) -> bool:
    """Whether top-k attention leaves out an earlier key of some query of a read of m positions from `start`."""
    return s.attention_top_k is not None and s.attention_top_k < searched_end(start, m)


def keys_asked(s, start: int, m: int) -> int | None:
    """The keys of each head a key search asks for: None, every one below the last query (no query has more
    than K earlier keys, or K + m - 1 reaches them all); else K + m - 1: a block's later positions are at most
    m - 1 of them, so every query's K best below its own position are among them."""
    if not pruned(s, start, m):
        return None
    k = s.attention_top_k + m - 1
    return k if k < searched_end(start, m) else None


def keep_best(scores, k: int) -> np.ndarray:
    """scores [H, m, n] with -inf for keys a query may not see -> each query's k best kept, the rest -inf."""
    if (np.isfinite(scores).sum(axis=-1) <= k).all():
        return scores
    worse = np.argsort(-scores, axis=-1, kind="stable")[..., k:]
    np.put_along_axis(scores, worse, -np.inf, axis=-1)
    return scores


def key_search(s, q, layer, start):  # q [m, H, hd] -> (sent, its Search), or None: no earlier key
    """The search of this layer's keys below the last query's position, once their rows have landed."""
    end = searched_end(start, len(q))
    if not end:
        return None
    s.await_layer(layer)
    sent = encoding.key_queries(q.transpose(1, 0, 2), s.key_norms[layer, :, :end], s.metric)
    where = Where(eq={"layer": layer}, lt={"position": end})
    k = keys_asked(s, start, len(q))
    index = None if k is None else s.engine.attention_index
    return sent, Search(s.name, sent[0], k=k, where=where, by="head", index=index)  # each head's keys


def key_scores(s, asked, found, layer, start, m):  # the key search's hits -> q.k [H, m, start + m - 1]
    """Every earlier key's q.k; under top-k attention -inf for each query's keys not among its K best."""
    n_head, end = s.hp.n_head, searched_end(start, m)
    if asked is None:
        s.meter.scored(store=0, memory=n_head * m, returned=0, values=n_head * m)
        return np.zeros((n_head, m, 0))
    k, returned = keys_asked(s, start, m), int((found[0].ids >= 0).sum())
    scores = (
        key_columns(s, asked[0], found, layer, end) if k is None else top_columns(s, asked[0], found, layer, end, k)
    )
    used = np.arange(end) < np.arange(start, start + m)[:, None]  # each query's earlier keys
    if pruned(s, start, m):
        scores = keep_best(np.where(used, scores, -np.inf), s.attention_top_k)
        read = int(np.isfinite(scores).sum())
    else:
        read = n_head * int(used.sum())
    store = n_head * int(used.sum()) if found[0].scored is None else found[0].scored  # an index: what it scored
    s.meter.scored(store=store, memory=n_head * m, returned=returned, values=read + n_head * m)
    return scores


def top_columns(s, sent, found, layer, end, k):  # the k best keys' hits -> q.k [H, m, end], -inf where not found
    ids, dists = found[0].ids, found[0].dists  # [H, m, K]; an index may find fewer (id -1)
    n_head, n_ctx, missing = s.hp.n_head, s.hp.n_ctx, found[0].ids < 0
    heads = (layer * n_head + np.arange(n_head))[:, None, None]
    wrong = ((ids // n_ctx != heads) | (ids % n_ctx >= end)) & ~missing
    if ids.shape[-1] != k or wrong.any():
        raise VecgptError(
            f"the store's top-k key search in layer {layer} returned other keys than this session wrote; "
            f"start the text again"
        )
    scores = np.full((*ids.shape[:2], end + 1), -np.inf)  # a missing key's score goes to column `end`, cut off
    at = np.where(missing, end, ids % n_ctx)
    np.put_along_axis(scores, at, encoding.decode_key_dists(dists, *sent[:1], 0.0, s.metric, sent[1]), -1)
    return scores[..., :end]


def key_columns(s, sent, found, layer, end):  # the key search's hits -> q.k [H, m, end], in position order
    ids, dists = found[0].ids, found[0].dists  # [H, m, n]
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


def queue_rows(s, layer, start, vectors, payload) -> None:
    """A layer's rows of the positions being read: a block's are written at once (its key search waits for
    them); a decode step's go out at the layers of `writes_at`, with the layers read since the last write."""
    if s.capture is not None:  # an inspection writes nothing
        return
    s.pending.append((layer, start, vectors, np.asarray(payload, np.float32)))
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
