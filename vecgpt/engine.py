"""GPT-2 with every matrix multiply as one exact search in a store; read beside reference.py.

The forward pass (`Step`) has reference.py's functions in its order; where the reference computes
`x @ weight + bias` the engine searches. A step's block of rows belongs to one text or to several (vecgpt.stepper
steps every text in flight together): each matrix is one search with every row, each text's keys are searched in
its own collection in the same round, and the layer norms, GELU and residual adds run once over the block.
`Engine.open()` starts a `Session`, one text's decoding state: its attention keys live in the store (collection
text-<id>, tagged layer/head/position) and in memory; `Session.read` is a step of that text alone.
Attention's output projection is applied per head to each position's value when it is computed
(collections h.<i>.attn.c_proj.<h>, in the same round as the key search), so a layer is four dependent
rounds: c_attn; key search and value projections; c_fc; c_proj. The projected values are kept in float32,
in memory and as the key rows' payload. Writes go out in order beside the searches (vecgpt.writer). The token
search brings the next token's rows along (its candidates' documents, the next position's wpe row), so a
generated token's first round is c_attn.
Layer norm, GELU, softmax, residual adds and sampling stay in numpy, in float64. A model loaded with
`--layout three` runs vecgpt.three_rounds' Session and Step instead: three rounds a layer (Engine.session picks
it); `--layout five` runs vecgpt.five_rounds': five, the textbook order, with the raw values kept.
A store holds any number of models; an Engine runs one, named by its store fingerprint (its collections
are `<fingerprint>.<matrix>`), and a text stays on that model whatever else is loaded or dropped.
Writing a model into a store is vecgpt.loading; counting requests is vecgpt.meter. `Session.inspect` reads a
position again, writing nothing, for what attention weighed there and the logit lens (the playground's token click).
"""

from __future__ import annotations

import importlib
import math
import time
import uuid
from contextlib import suppress
from functools import partial
from itertools import accumulate
from typing import NamedTuple

import numpy as np

from vecgpt import encoding, rounds
from vecgpt.backends.base import Search, Store, Where, row_order
from vecgpt.errors import VecgptError
from vecgpt.loading import check_layout, collection, text_row
from vecgpt.meter import SESSION_PREFIX, Metered, later
from vecgpt.reference import gelu, layer_norm
from vecgpt.sampling import Candidates, ordered
from vecgpt.weights import HParams
from vecgpt.writer import Writer

# A query at position i scores every earlier position's key (j < i) by a search of the store, and only its own key
# (j = i, computed in the same read) in numpy. Which key is scored where depends on positions alone, never on when
# a write landed, so a text resumed in another process computes what the first one did, bit for bit.
# Attention converts a chunk of kept values (float32) to float64 at a time: within a core's L2 cache, the chunk is
# read back from there, not from memory.
CHUNK_BYTES = 1 << 20
PREFILL_CHUNK = 64  # a prompt's tokens read in one step (a chunk: its boundaries at multiples of this, from 0)
AHEAD_MOST = 64  # candidates whose rows the token search brings along (Session.gpt2); more: the next read fetches


class Engine:
    """A store holding a model, ready to open decoding sessions."""

    def __init__(
        self,
        store: Store,
        top_k: int = 40,
        prompt_block: bool = True,
        tile: int = 0,
        model: str | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
        attention_top_k: int | None = None,
        attention_index: str | None = None,
    ):
        """`model`: the store fingerprint of the model to run (see `vecgpt ls`); None: the only one the store holds.
        A prompt is read `prefill_chunk` tokens at a time (prompt_block=False: one at a time). `attention_top_k`: a
        new session's K (Session.attention_top_k), None: every earlier key; `attention_index`: the store's approximate
        index those key searches use (one of its `indexes`, e.g. FAISS's "hnsw"), None: exact."""
        self.store, self.top_k, self.prompt_block, self.tile = store, top_k, prompt_block, tile
        self.chunk_size = prefill_chunk if prompt_block else 1
        self.key = model or only_model(store)
        manifest = store.read_manifest(self.key)
        if manifest is None:
            raise VecgptError(
                f"the store holds no model {self.key}; run `vecgpt load` first (`vecgpt ls` lists the models)"
            )
        self.manifest = manifest
        self.metric = manifest["metric"]
        self.hparams = HParams(**manifest["hparams"])
        self.m2 = manifest["m2"]
        self.attention_top_k = self.check_top_k(attention_top_k)
        self.attention_index = self.check_index(attention_index)

    def check_index(self, kind: str | None) -> str | None:
        """An approximate key index, refused in one line before any search on a store without one of that kind."""
        offered = getattr(self.store, "indexes", ())
        if kind is not None and kind not in offered:
            has = f"its indexes: {', '.join(offered)}" if offered else "it searches keys exactly only"
            raise VecgptError(f"attention_index {kind!r}: this store has no such index of keys ({has}); unset it")
        return kind

    def check_top_k(self, k: int | None) -> int | None:
        """K for top-k attention, refused in one line before any search where it cannot run: the key search must
        rank by q.k (a model loaded with metric ip), and K no more than the earlier keys a context holds."""
        if k is None:
            return None
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise VecgptError(f"attention_top_k must be 1 or more keys (unset: every key), not {k!r}")
        if k >= self.hparams.n_ctx:
            raise VecgptError(
                f"attention_top_k = {k} is more keys than a query can have: the context holds {self.hparams.n_ctx} "
                f"positions, so at most {self.hparams.n_ctx - 1} earlier keys; give fewer, or unset it for every key"
            )
        if self.metric != "ip":
            offers = getattr(self.store, "metrics", ("l2",))
            hint = (
                "load the model with --metric ip"
                if "ip" in offers
                else f"this store ranks by {'/'.join(offers)} only, so run top-k attention on one that ranks by ip"
            )
            raise VecgptError(f"attention_top_k ranks each head's earlier keys by q.k, not by l2 distance: {hint}")
        return k

    def name(self, matrix: str) -> str:
        """The collection holding one of this model's matrices or tables."""
        return collection(self.key, matrix)

    def dropped(self) -> bool:
        return self.store.read_manifest(self.key) is None

    def open(self) -> Session:
        return self.session()

    def session(self, name: str | None = None, create: bool = True) -> Session:
        """A Session of the model's layout (its manifest's "layout"; a model loaded before layouts existed: four)."""
        return session_class(self.manifest.get("layout") or "four")(self, name, create)


LAYOUTS: dict[str, type[Session]] = {}  # a layout's name -> its Session class; each registers itself (`layout`)


def layout(name: str):
    """Register a Session class as the layout `name` (vecgpt.config.LAYOUTS): a model loaded in it runs it."""

    def register(cls):
        cls.layout, LAYOUTS[name] = name, cls
        return cls

    return register


def session_class(name: str) -> type[Session]:
    """The Session class of a layout, its module (vecgpt.<name>_rounds) imported by name when first asked for."""
    if name not in LAYOUTS:
        importlib.import_module(f"vecgpt.{name}_rounds")
    return LAYOUTS[name]


def squared_norms(k32: np.ndarray) -> np.ndarray:
    """|k|^2 over the last axis in float64, summed the same way however many keys: a resumed text's norms
    (from the stored keys) equal those its first process computed, to the last bit."""
    k = np.ascontiguousarray(k32, np.float64)
    return (k * k).sum(axis=-1)


def own_scores(q: np.ndarray, k32: np.ndarray) -> np.ndarray:
    """q.k of each query with its own position's key, q [m, H, hd] and k32 [m, H, hd] -> [H, m], in float64 and
    summed the same way whatever m (as squared_norms)."""
    return (q * np.asarray(k32, np.float64)).sum(axis=-1).T


def softmax_in_place(s: np.ndarray) -> np.ndarray:
    """reference.softmax over the last axis, the same operations, in s itself: a prompt block's score table is the
    largest array a read holds (12 heads at 1,024 positions: 100 MB), and reference.softmax makes two more."""
    s -= s.max(axis=-1, keepdims=True)
    s = np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def searched_end(start: int, m: int = 1) -> int:
    """A read of m positions from `start` searches the store for the keys below this: every position before its
    last query's (each query sees those before its own); each query's own key is scored in memory."""
    return start + m - 1


def write_points(n_layer: int) -> frozenset[int]:
    """The layers after which a decode step queues its rows: the first half's, then the rest. Layer l's rows are
    first searched at the next token's layer l, half a token after the later of their writes is queued at least,
    and a token's rows go out in two writes instead of one per layer (a store charges a minimum per write)."""
    return frozenset({max(0, n_layer // 2 - 1), n_layer - 1})


def chunks(ids: list[int], start: int, size: int) -> list[list[int]]:
    """Tokens read from position `start`, cut where a position is a multiple of `size`: where a text's chunks end
    depends on the text alone, never on what else is read with it or where a read began."""
    cuts = [p - start for p in range((start // size + 1) * size, start + len(ids), size)]
    return [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)]) if b > a]


def keep_best(scores, k: int) -> np.ndarray:
    """scores [H, m, n] with -inf for keys a query may not see -> each query's k best kept, the rest -inf."""
    if (np.isfinite(scores).sum(axis=-1) <= k).all():
        return scores
    worse = np.argsort(-scores, axis=-1, kind="stable")[..., k:]
    np.put_along_axis(scores, worse, -np.inf, axis=-1)
    return scores


def put_rows(ids, values):  # outputs [m, n] found in the order of ids [m, n] -> in row order
    order = row_order(ids.shape[1])
    if ids.base is order or (ids == order).all():  # found in row order already (an in-process scan says so)
        return np.asarray(values, np.float64)
    y = np.empty(values.shape)
    np.put_along_axis(y, ids, values, axis=1)
    return y


class Ahead(NamedTuple):
    """Rows of the model read ahead for the next position: each candidate token's wte row, that position's wpe
    row. Rows of the model, not of a text: right for any text that reads one of these tokens there."""

    position: int
    tokens: dict[int, np.ndarray]  # token id -> its document as stored, [dim]
    wpe: np.ndarray  # [1, d]


class Inspection(NamedTuple):
    """What reading one position again computed (Session.inspect): attention's q.k and weights as the text's
    own read had them, the residual after each layer, and the logit lens."""

    position: int
    token: int
    scores: np.ndarray  # [L, H, position + 1]: q.k of each key up to the position (before the 1/sqrt(hd))
    weights: np.ndarray  # [L, H, position + 1]: softmax(q.k / sqrt(hd)), each head's summing to 1
    residuals: np.ndarray  # [L, d]: the residual stream after each layer
    lens: list[Candidates]  # per layer: the top LENS_K tokens of ln_f(residual) @ wte.T, each a top-k search


LENS_K = 5  # the logit lens's tokens a layer


def only_model(store: Store) -> str:
    check_layout(store)
    keys = sorted(store.manifests())
    if len(keys) != 1:
        raise VecgptError(
            "the store holds no model; run `vecgpt load` first"
            if not keys
            else f"the store holds {len(keys)} models ({', '.join(keys)}); name one"
        )
    return keys[0]


@layout("four")
class Session:
    """One decoding session: keys and projected values in the store (text-<id>); in memory the projected values
    and |k|^2 of each key (what attention needs besides the scores the store returns), and the tokens read so far.
    vecgpt.text keeps a text's record beside it, so another process can continue it."""

    layout: (
        str  # the model's layout (vecgpt.config.LAYOUTS), set by `layout`: tolerance derives its bound in that order
    )
    kept = np.float32  # `projected` in memory: each value is a float32 (as stored) in either
    capture: list | None = None  # set by `inspect`: weighted_values appends (q.k, weights) of each layer
    step: type[Step]  # the forward pass of a block in the layout's order (Step, or the layout's own)

    def __init__(self, engine: Engine, name: str | None = None, create: bool = True):
        """`name`: the text collection (text-<id>); create=False: it exists (call `restore` or `adopt`)."""
        self.engine, self.hp, self.metric = engine, engine.hparams, engine.metric
        self.store = Metered(engine.store)
        self.meter = self.store.meter
        self.name = name or f"{SESSION_PREFIX}{uuid.uuid4().hex[:12]}"
        hp = self.hp
        self.tokens: list[int] = []
        self.positions_read = 0  # positions put through the forward pass by this process
        self.trace: list | None = None  # set to []: each read appends [embedding, residual after layer 1..L]
        self.pending: list[tuple] = []  # the rows of the positions being read, queued as one write when read
        self.ahead: Ahead | None = None  # the next position's rows, come with the token search
        self.writer = Writer(self.store, background=getattr(engine.store, "concurrent", False))
        # a store without a writer thread gets a token's writes with its next round: one write a token is enough
        self.writes_at = write_points(hp.n_layer) if self.writer.background else frozenset({hp.n_layer - 1})
        self._written = 0  # positions < _written have landed in the store, every layer ...
        self._key_writes: list[tuple[int, int, int]] = []  # ... and these (ticket, start, end) writes, once acked
        self.layer_ticket: dict[int, int] = {}  # layer -> the last write queued with rows of that layer
        # each position's value, projected by its head's rows of c_proj: [L, ctx, H, d] as stored (zeros
        # allocate lazily: a page is taken when a position is written, about 450 MB at GPT-2 small's 1,024)
        self.projected = np.zeros((hp.n_layer, hp.n_ctx, hp.n_head, self.value_width()), self.kept)
        self.key_norms = np.zeros((hp.n_layer, hp.n_head, hp.n_ctx))  # [L, H, ctx]
        # each query's softmax over its own key and its K best earlier ones by q.k (None: every earlier key)
        self.attention_top_k: int | None = engine.attention_top_k
        dim, payload = self.row_widths()
        opening = [later.create(self.name, dim, self.metric, ("layer", "head", "position"), payload=payload)]
        opening = opening if create else []
        *_, table = self.store.together(*opening, later.fetch(engine.name("ln"), np.arange(4 * hp.n_layer + 2)))
        table = table.astype(np.float64)
        self.ln = [
            {
                "ln_1": {"weight": table[4 * i], "bias": table[4 * i + 1]},
                "ln_2": {"weight": table[4 * i + 2], "bias": table[4 * i + 3]},
            }
            for i in range(hp.n_layer)
        ]
        self.ln_f = {"weight": table[-2], "bias": table[-1]}

    def row_widths(self) -> tuple[int, int]:
        """A text row's vector and payload widths (vecgpt.loading.text_row)."""
        return text_row(self.hp, self.layout)

    def value_width(self) -> int:
        """The width of a position's kept value, a head's row of `projected`: projected by c_proj, d."""
        return self.hp.n_embd

    @property
    def position(self) -> int:
        return len(self.tokens)

    @property
    def written(self) -> int:
        """Positions < written have their keys and projected values in the store (acknowledged), every layer."""
        while self._key_writes and self.writer.acked(self._key_writes[0][0]):
            self._written = max(self._written, self._key_writes.pop(0)[2])
        return self._written

    def truncate(self, n: int) -> None:
        """Forget tokens from n on; their keys stay in the store until overwritten, unseen by filters."""
        self.tokens = self.tokens[:n]
        self._written = min(self.written, n)
        self._key_writes = [(t, a, min(b, n)) for t, a, b in self._key_writes if a < n]
        self.pending = []

    def write(self, call) -> int:
        """Queue a write (vecgpt.writer: in order, off the critical path where the store allows); its ticket."""
        return self.writer.queue(call)

    def acked(self, ticket: int) -> bool:
        return self.writer.acked(ticket)

    def drain(self) -> None:
        """Every write queued has landed (or the error of the one that failed)."""
        self.writer.wait()

    def close(self) -> None:
        with suppress(VecgptError):
            self.drain()
        self.store.drop(self.name)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self, ids, k: int | None = None) -> Candidates:
        """Feed tokens, a chunk of the engine's size at a time (a step of this text alone); the best k next tokens
        after the last one."""
        ids = [int(i) for i in ids]
        self.check_room(len(ids))
        pieces = chunks(ids, self.position, self.engine.chunk_size)
        for j, piece in enumerate(pieces):
            (out,) = self.step([Read(self, piece, (k or self.engine.top_k) if j == len(pieces) - 1 else None)]).run()
            if isinstance(out, BaseException):
                raise out
        return out

    def check_room(self, m: int) -> None:
        if self.position + m > self.hp.n_ctx:
            raise VecgptError(f"the text would reach {self.position + m} tokens; the context holds {self.hp.n_ctx}")

    def check_read(self, start: int) -> None:
        """Ready to read from `start`: every position before it queued for the store."""
        self.pending = []  # what a read cut short (Ctrl-C) left
        self.check_written(start)

    def model_dropped(self) -> VecgptError:
        return VecgptError(
            f"model {self.engine.key} was dropped from the store while this text was open; "
            f"load it again and start the text again"
        )

    # ------------------------------------------------------------ this text's part of a step (engine.Step)

    def weighted_values(self, q, searched, own, layer, start):  # q [m, H, hd] -> [H, m, value_width]
        """searched: q.k of every key below the last query's position, from the store [H, m, start + m - 1];
        own: each query's own key's, from memory [H, m]. Each query sees the positions up to its own."""
        m, n_head, hd = q.shape
        n, rows = start + m, np.arange(m)
        if m == 1 and self.capture is None and self.pruned(start, m):
            kept = np.isfinite(searched[:, 0])  # [H, n - 1]: K of each head's (fewer where an index found fewer)
            if (kept.sum(axis=1) == kept[0].sum()).all():
                return self.kept_values(searched, kept, own, layer, hd)
        scores = np.empty((n_head, m, n))
        scores[..., : n - 1] = searched
        scores[:, rows, start + rows] = own
        if m > 1:  # a block's later keys are masked (the last column of its earlier queries was never written)
            np.copyto(scores, -np.inf, where=np.arange(n) > (start + rows)[:, None])
        raw = scores.copy() if self.capture is not None else None  # an inspection keeps q.k and the weights
        scores /= math.sqrt(hd)  # in place, as the softmax below: a block's table is the largest array a read holds
        weights, chunk = softmax_in_place(scores), self.chunk(m)
        if raw is not None:
            self.capture.append((raw, weights.copy()))
        out = weights[..., :chunk] @ self.values_at(layer, 0, min(chunk, n))
        for t in range(chunk, n, chunk):  # the values in float64 a chunk at a time, while in cache
            out += weights[..., t : t + chunk] @ self.values_at(layer, t, min(t + chunk, n))
        return out

    def kept_values(self, searched, kept, own, layer, hd):  # a query's K best earlier keys' q.k [H, 1, n - 1]
        """weighted_values for one query under top-k attention ([H, 1, w]): the softmax over its kept keys (as many
        for every head) and its own, and only their values read (the kept positions differ by head)."""
        n_head, n = searched.shape[0], searched.shape[-1] + 1
        pos = np.nonzero(kept)[1].reshape(n_head, -1)  # [H, K], ascending
        pos = np.hstack([pos, np.full((n_head, 1), n - 1)])  # and the query's own
        scores = np.hstack([np.take_along_axis(searched[:, 0], pos[:, :-1], -1), own]) / math.sqrt(hd)  # [H, K + 1]
        weights = softmax_in_place(scores)
        values = self.projected[layer][pos, np.arange(n_head)[:, None]].astype(np.float64)  # [H, K + 1, w]
        return weights[:, None] @ values

    def pruned(self, start: int, m: int) -> bool:
        """Whether top-k attention leaves out an earlier key of some query of a read of m positions from `start`."""
        return self.attention_top_k is not None and self.attention_top_k < searched_end(start, m)

    def keys_asked(self, start: int, m: int) -> int | None:
        """The keys of each head a key search asks for: None, every one below the last query (no query has more
        than K earlier keys, or K + m - 1 reaches them all); else K + m - 1: a block's later positions are at most
        m - 1 of them, so every query's K best below its own position are among them."""
        if not self.pruned(start, m):
            return None
        k = self.attention_top_k + m - 1
        return k if k < searched_end(start, m) else None

    def chunk(self, m: int = 1) -> int:
        """Key positions whose kept values attention converts to float64 and sums at a time, for m queries: the
        config's `tile`, or (0) as many as fit in CHUNK_BYTES, and for a block no fewer than its queries (each
        chunk's sum is added into the block's output, [H, m, w]: a chunk's values weigh no more than that)."""
        return self.engine.tile or max(1, m, CHUNK_BYTES // (8 * self.hp.n_head * self.value_width()))

    def values_at(self, layer, a, b):  # positions a..b-1 -> their kept values [H, b - a, w] in float64
        return self.projected[layer, a:b].transpose(1, 0, 2).astype(np.float64, copy=False)

    def ended(self, ids: list[int], start: int) -> None:
        """A read of `ids` from `start` went through every layer: they are the text's, their rows queued."""
        self.tokens += ids
        self.positions_read += len(ids)
        self._key_writes.append((self.writer.issued - 1, start, self.position))  # the last layer's write

    def take_ahead(self, ids, start):  # -> (wte rows [1, dim], wpe row [1, d]) come with the last token search, or None
        ahead, self.ahead = self.ahead, None
        if ahead is not None and len(ids) == 1 and ahead.position == start and ids[0] in ahead.tokens:
            return ahead.tokens[ids[0]][None], ahead.wpe
        return None

    # ------------------------------------------------------------ the keys in the store

    def key_search(self, q, layer, start):  # q [m, H, hd] -> (sent, the round's call), or None: no earlier key
        """The search of this layer's keys below the last query's position, once their rows have landed."""
        end = searched_end(start, len(q))
        if not end:
            return None
        self.await_layer(layer)
        sent = encoding.key_queries(q.transpose(1, 0, 2), self.key_norms[layer, :, :end], self.metric)
        where = Where(eq={"layer": layer}, lt={"position": end})
        k = self.keys_asked(start, len(q))
        index = None if k is None else self.engine.attention_index
        search = Search(self.name, sent[0], k=k, where=where, by="head", index=index)  # each head's keys
        return sent, later.search_many([search])

    def key_scores(self, asked, found, layer, start, m):  # the key search's hits -> q.k [H, m, start + m - 1]
        """Every earlier key's q.k; under top-k attention -inf for each query's keys not among its K best."""
        n_head, end = self.hp.n_head, searched_end(start, m)
        if asked is None:
            self.meter.scored(store=0, memory=n_head * m, returned=0, values=n_head * m)
            return np.zeros((n_head, m, 0))
        k, returned = self.keys_asked(start, m), int((found[0].ids >= 0).sum())
        scores = (
            self.key_columns(asked[0], found, layer, end)
            if k is None
            else self.top_columns(asked[0], found, layer, end, k)
        )
        used = np.arange(end) < np.arange(start, start + m)[:, None]  # each query's earlier keys
        if self.pruned(start, m):
            scores = keep_best(np.where(used, scores, -np.inf), self.attention_top_k)
            read = int(np.isfinite(scores).sum())
        else:
            read = n_head * int(used.sum())
        store = n_head * int(used.sum()) if found[0].scored is None else found[0].scored  # an index: what it scored
        self.meter.scored(store=store, memory=n_head * m, returned=returned, values=read + n_head * m)
        return scores

    def top_columns(self, sent, found, layer, end, k):  # the k best keys' hits -> q.k [H, m, end], -inf where not found
        ids, dists = found[0].ids, found[0].dists  # [H, m, K]; an index may find fewer (id -1)
        n_head, n_ctx, missing = self.hp.n_head, self.hp.n_ctx, found[0].ids < 0
        heads = (layer * n_head + np.arange(n_head))[:, None, None]
        wrong = ((ids // n_ctx != heads) | (ids % n_ctx >= end)) & ~missing
        if ids.shape[-1] != k or wrong.any():
            raise VecgptError(
                f"the store's top-k key search in layer {layer} returned other keys than this session wrote; "
                f"start the text again"
            )
        scores = np.full((*ids.shape[:2], end + 1), -np.inf)  # a missing key's score goes to column `end`, cut off
        at = np.where(missing, end, ids % n_ctx)
        np.put_along_axis(scores, at, encoding.decode_key_dists(dists, *sent[:1], 0.0, self.metric, sent[1]), -1)
        return scores[..., :end]

    def key_columns(self, sent, found, layer, end):  # the key search's hits -> q.k [H, m, end], in position order
        ids, dists = found[0].ids, found[0].dists  # [H, m, n]
        if ids.shape[-1] != end:  # rows removed under the text (closed, lost by a store)
            raise VecgptError(
                f"the store lost keys of this session ({ids.shape[-1]} of {end} positions found in layer {layer}); "
                f"start the text again"
            )
        if not (ids[..., 1:] > ids[..., :-1]).all():  # each head: its keys in position order (in-process: already)
            order = np.argsort(ids, axis=-1)
            ids, dists = np.take_along_axis(ids, order, -1), np.take_along_axis(dists, order, -1)
        if not np.array_equal(ids[0, 0] % self.hp.n_ctx, np.arange(end)):  # the same for every head and query
            raise VecgptError(
                f"the store holds other keys than this session wrote in layer {layer}; start the text again"
            )
        norms = self.key_norms[layer][:, None, :end]  # [H, 1, n]
        return encoding.decode_key_dists(dists, *sent[:1], norms, self.metric, sent[1])

    def queue_rows(self, layer, start, vectors, payload) -> None:
        """A layer's rows of the positions being read: a block's are written at once (its key search waits for
        them); a decode step's go out at the layers of `writes_at`, with the layers read since the last write."""
        if self.capture is not None:  # an inspection writes nothing
            return
        self.pending.append((layer, start, vectors, np.asarray(payload, np.float32)))
        if len(vectors) > 1 or layer in self.writes_at:
            ticket = self.write(later.upsert(*self.key_rows(self.pending)))
            self.layer_ticket.update((entry[0], ticket) for entry in self.pending)
            self.pending = []

    def key_rows(self, entries):  # [(layer, start, k32 [m, H, hd], pv [m, H, d])] -> one upsert's arguments
        n_head = self.hp.n_head
        sizes = [len(k32) * n_head for _, _, k32, _ in entries]  # rows: m H each
        layer, start = (np.repeat([e[i] for e in entries], sizes) for i in (0, 1))
        offset = np.arange(sum(sizes)) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # a row's place in its entry
        pos, head = start + offset // n_head, offset % n_head
        vectors, values = (np.concatenate([e[i].reshape(-1, e[i].shape[-1]) for e in entries]) for i in (2, 3))
        return (
            self.name,
            self.key_ids(layer, head, pos),
            vectors,
            {"layer": layer, "head": head, "position": pos},
            values,
        )

    def key_ids(self, layer, head, pos):  # the row id of a key: one per (layer, head, position)
        return (layer * self.hp.n_head + head) * self.hp.n_ctx + pos

    def send(self, *calls) -> list:
        """One round trip of this text alone (vecgpt.rounds, as a step's): the calls, with the writes waiting to ride
        along (a store without a writer thread); the calls' results."""
        _, found, failed = rounds.send(self.engine.store, [], {}, {self: list(calls)})
        if self in failed:
            raise failed[self]
        return found.get(self, [])

    def await_layer(self, layer: int) -> None:
        """Block until this layer's rows of every position read have landed, counted as a wait with its seconds. A
        store without a writer thread gets them in the key search's own round (send), ahead of the search."""
        ticket = self.layer_ticket.get(layer)
        if ticket is None or self.writer.acked(ticket) or not self.writer.background:
            return
        began = time.perf_counter()
        self.writer.wait(ticket)
        self.meter.waited(time.perf_counter() - began)

    def check_written(self, start: int) -> None:
        """Every position before `start` has been queued for the store (a truncated text reads its lost ones again)."""
        queued = max([self.written, *(end for _, _, end in self._key_writes)])
        if queued < start:
            raise VecgptError(f"positions up to {start} of this text were never written; start the text again")

    # ------------------------------------------------------------ a text continued elsewhere

    def restore(self, tokens: list[int], *also) -> list:
        """Continue a text whose keys and values for these tokens are in the store: one fetch, nothing read
        (with `also`, other calls in the same round; their results)."""
        hp, n = self.hp, len(tokens)
        layer, pos, head = np.meshgrid(np.arange(hp.n_layer), np.arange(n), np.arange(hp.n_head), indexing="ij")
        found, *others = self.send(later.fetch(self.name, self.key_ids(layer, head, pos).ravel(), payload=True), *also)
        self.take_rows(*(a.reshape(hp.n_layer, n, hp.n_head, a.shape[-1]) for a in found))  # n may be 0
        self.tokens, self._written, self._key_writes, self.layer_ticket = list(tokens), n, [], {}
        return others

    def take_rows(self, vectors, payload) -> None:
        """The first n positions' rows as the store holds them, [L, n, H, hd] keys and [L, n, H, d] values."""
        n = vectors.shape[1]
        self.projected[:, :n] = payload
        self.key_norms[:, :, :n] = squared_norms(vectors).transpose(0, 2, 1)

    def adopt(self, other: Session, n: int) -> None:
        """Start from another session's first n positions, whose keys and values this text's collection holds."""
        self.projected[:, :n], self.key_norms[:, :, :n] = other.projected[:, :n], other.key_norms[:, :, :n]
        self.tokens, self._written, self._key_writes, self.layer_ticket = other.tokens[:n], n, [], {}

    # ------------------------------------------------------------ a position read again, to look inside

    def inspect(self, position: int, token: int) -> Inspection:
        """Read `token` at `position` again as a decode step reads it, every layer's searches sent, writing
        nothing: its scores of the keys before it come from the store's key search, its own from memory, as in
        the first read (which key is scored where depends on positions alone), so the weights are the ones the
        text used. Then the logit lens: one round of a top-LENS_K token search per layer."""
        self.check_inspectable(position)
        kept = self.projected[:, position].copy(), self.key_norms[:, :, position].copy()
        if any(self.meter.current["rounds"].values()):  # the inspection's requests make a meter entry of their own
            self.meter.start_token()
        self.capture = []
        try:
            residuals = self.read_again(position, token)
            captured = self.capture
        finally:  # a re-read overwrites the position's kept value and key norm: the same bits, or a later read's
            self.capture = None
            self.projected[:, position], self.key_norms[:, :, position] = kept
        scores, weights = (np.stack([pair[i][:, 0] for pair in captured]) for i in (0, 1))
        return Inspection(position, token, scores, weights, residuals, self.lens(residuals))

    def check_inspectable(self, position: int) -> None:
        """A position this session has read up to: the keys before it are in the store (or queued for it)."""
        if not 0 <= position <= min(self.position, self.hp.n_ctx - 1):
            raise VecgptError(
                f"position {position} cannot be inspected: positions 0 to {self.position} can (read the text first)"
            )
        self.check_written(position)

    def read_again(self, position: int, token: int) -> np.ndarray:  # -> the residual after each layer [L, d]
        step = self.step([Read(self, [token], None, position)], again=True)
        (out,) = step.run()
        if isinstance(out, BaseException):
            raise out
        return step.residuals[0]

    def lens(self, residuals: np.ndarray, k: int = LENS_K) -> list[Candidates]:
        """Each residual [L, d] through ln_f, then a top-k search of the token table (gpt2's, a row at a time, so
        the last layer's is bit for bit the text's own token search): L searches in one round."""
        m2, name = self.engine.m2["wte"], self.engine.name("wte")
        rows = [layer_norm(r[None], **self.ln_f, eps=self.hp.eps) for r in residuals]
        qs = [encoding.encode_queries(h, self.metric, m2) for h in rows]
        (found,) = self.send(later.search_many([Search(name, q, k=k) for q in qs]))
        return [
            ordered(hits.ids[0], encoding.decode_dists(hits.dists, q, m2, self.metric)[0]) for q, hits in zip(qs, found)
        ]


class Read(NamedTuple):
    """One text's rows in a step: tokens `ids` read from `start` (None: where the text is), and then, if `k`, the
    text's best k next tokens."""

    session: Session
    ids: list[int]
    k: int | None = None
    start: int | None = None


class Step:
    """One forward pass over a block of rows that belong to several texts (a text alone: a block of one), in
    reference.py's order; where the reference computes `x @ weight + bias`, one search with every text's rows. Each
    text's attention is its own: its keys are searched in its collection, in the same round for all texts. A row's
    numbers never depend on the others in the block: every store computes each query alone (docs/batching.md)."""

    def __init__(self, reads: list[Read], again: bool = False):
        """again: read positions a second time to look inside (Session.inspect): nothing written, no text changed."""
        self.reads, self.again = reads, again
        self.engine = reads[0].session.engine
        self.hp, self.metric = self.engine.hparams, self.engine.metric
        self.starts = [r.session.position if r.start is None else r.start for r in reads]
        self.bounds = [0, *accumulate(len(r.ids) for r in reads)]  # text i's rows: bounds[i] to bounds[i + 1]
        self.errors: dict[int, BaseException] = {}
        self.residuals: list = [None] * len(reads)  # again: each text's residual after each layer [L, d]
        self.ln, self.ln_f = reads[0].session.ln, reads[0].session.ln_f

    def texts(self, only=None):  # the texts still reading: (index, session, start, its rows in the block)
        for i, r in enumerate(self.reads):
            if i not in self.errors and (only is None or only(len(r.ids))):
                yield i, r.session, self.starts[i], slice(self.bounds[i], self.bounds[i + 1])

    def run(self) -> list:
        """Each read's candidates (None where it asked for none), or the error that stopped that text."""
        # a store that reads a manifest for free is asked each time (it may serve a dropped model from memory); any
        # other is asked when a read fails
        local_drop = getattr(self.engine.store, "local", False) and self.engine.dropped()
        for i, s, start, _ in self.texts():
            if local_drop:
                self.errors[i] = s.model_dropped()
            elif not self.again:
                self.guard(i, partial(s.check_read, start))
        out = {}
        with suppress(Stopped):
            out = self.gpt2(self.hidden()) if len(self.errors) < len(self.reads) else {}
        return [self.errors.get(i, out.get(i)) for i in range(len(self.reads))]

    def guard(self, i: int, fn):
        """fn(); its VecgptError stops text i alone (others read on)."""
        try:
            return fn()
        except VecgptError as e:
            self.fail(i, e)

    def fail(self, i: int, error: BaseException) -> None:
        session = self.reads[i].session
        dropped = isinstance(error, VecgptError) and self.engine.dropped()
        self.errors[i] = session.model_dropped() if dropped else error

    def send(self, shared=(), own=None, rows=None) -> tuple[list, dict]:
        """One round: `shared` calls for the texts' rows (`rows`: each text's part, by default its rows in the
        block), and each text's `own` calls {index: calls}; (the shared results, {index: its own results})."""
        session = {i: s for i, s, *_ in self.texts()}
        parts = {session[i]: (b.stop - b.start if rows is None else rows.get(i, 0)) for i, _, _, b in self.texts()}
        mine = {session[i]: c for i, c in (own or {}).items()}
        out, found, failed = rounds.send(self.engine.store, list(shared), parts, mine)
        index = {id(s): i for i, s in session.items()}
        for s, e in failed.items():
            self.fail(index[id(s)], e)
        if len(self.errors) == len(self.reads):
            raise Stopped
        return out, {index[id(s)]: r for s, r in found.items()}

    # ------------------------------------------------------------ the forward pass, in reference.py's order

    def linear(self, x, name):  # [m, in] -> [m, out]: x @ weight + bias as one search returning every row
        search, decode = self.search_of(x, name)
        (found,), _ = self.send([later.search_many([search])])
        return decode(found[0])

    def search_of(self, x, name):  # x [m, in] -> (a search of every row of a matrix, decode(hits) -> [m, out])
        q = encoding.encode_queries(x, self.metric, self.engine.m2[name])
        return Search(self.engine.name(name), q), lambda hits: self.scatter(hits, q, name)

    def scatter(self, hits, q, name):  # a search of every row -> outputs [m, out] in row order
        return put_rows(hits.ids, encoding.decode_dists(hits.dists, q, self.engine.m2[name], self.metric))

    def feed_forward(self, x, layer):  # [m, d] -> [m, d]
        return self.linear(gelu(self.linear(x, f"h.{layer}.mlp.c_fc")), f"h.{layer}.mlp.c_proj")

    def attention(self, q, searched, own, layer):  # q [m, H, hd] -> [m, d]: sum_h softmax(q k^T / sqrt(hd)) pv_h
        out = np.zeros((len(q), self.hp.n_embd))
        for i, s, start, rows in self.texts():
            out[rows] = s.weighted_values(q[rows], searched[i], own[:, rows], layer, start).sum(axis=0)
        return out

    def mha(self, x, layer):  # [m, d] -> [m, d]; earlier keys searched in the store, the own one in memory
        m = len(x)
        q, k, v = self.linear(x, f"h.{layer}.attn.c_attn").reshape(m, 3, self.hp.n_head, -1).transpose(1, 0, 2, 3)
        k32 = k.astype(np.float32)  # keys as the store holds them
        for _, s, start, rows in self.texts():
            s.key_norms[layer, :, start : start + rows.stop - rows.start] = squared_norms(k32[rows]).T
        searched = self.scores_and_projections(q, v, k32, layer)
        return self.attention(q, searched, own_scores(q, k32), layer)

    def scores_and_projections(self, q, v, k32, layer):  # -> {text: q.k of its earlier keys [H, m, start + m - 1]}
        """The new positions' values projected by their heads' rows of c_proj (kept in float32 in each text's
        `projected`), in one round with the key searches of the texts reading one position; a block's rows are
        written, then its keys searched in a round of its own."""
        project, decode = self.projections(v, layer)
        asked = self.key_searches(q, layer, one)
        (found,), own = self.send([later.search_many(project)], calls(asked))
        projected = decode(found)
        for _, s, start, rows in self.texts():
            s.projected[layer, start : start + rows.stop - rows.start] = projected[rows]
            s.queue_rows(layer, start, k32[rows], projected[rows])
        searched = self.key_scores(asked, own, layer)
        return {**searched, **self.key_round(q, layer, only=several)}

    def projections(self, v, layer):  # v [m, H, hd] -> (a search per head, decode(hits) -> [m, H, d])
        m, n_head, hd = v.shape
        names = [f"h.{layer}.attn.c_proj.{h}" for h in range(n_head)]
        m2 = np.repeat([self.engine.m2[name] for name in names], m)[:, None]  # [H m, 1]
        vq = encoding.encode_queries(v.transpose(1, 0, 2).reshape(n_head * m, hd), self.metric, m2[:, 0])
        searches = [Search(self.engine.name(name), vq[h * m : (h + 1) * m]) for h, name in enumerate(names)]

        def decode(found):  # H x hits [m, d] -> [m, H, d]
            ids = found[0].ids if all(h.ids is found[0].ids for h in found) else np.vstack([h.ids for h in found])
            dists = np.vstack([hits.dists for hits in found])
            y = put_rows(ids, encoding.decode_dists(dists, vq, m2, self.metric))
            return y.reshape(n_head, m, -1).transpose(1, 0, 2)

        return searches, decode

    def key_round(self, q, layer, only=None):  # q [m, H, hd] -> {text: q.k [H, m_text, start + m_text - 1]}
        """One round: each text's search of this layer's keys below its last query's position."""
        asked = self.key_searches(q, layer, only)
        _, own = self.send([], calls(asked)) if calls(asked) else ([], {})
        return self.key_scores(asked, own, layer)

    def key_searches(self, q, layer, only=None) -> dict:  # {text: (sent, its key search) or None: no earlier key}
        asked = {}
        for i, s, start, rows in self.texts(only=only):
            asked[i] = self.guard(i, partial(s.key_search, q[rows], layer, start))
        return {i: a for i, a in asked.items() if i not in self.errors}

    def key_scores(self, asked, own, layer):  # each text's key search's hits -> its q.k
        out = {}
        for i, s, start, rows in self.texts():
            if i in asked:
                found = own.get(i, [None])[0] if asked[i] is not None else None
                m = rows.stop - rows.start
                out[i] = self.guard(i, partial(s.key_scores, asked[i], found, layer, start, m))
        return out

    def transformer_block(self, x, layer):  # [m, d] -> [m, d]
        ln, eps = self.ln[layer], self.hp.eps
        x = x + self.mha(layer_norm(x, **ln["ln_1"], eps=eps), layer)
        return x + self.feed_forward(layer_norm(x, **ln["ln_2"], eps=eps), layer)

    def hidden(self) -> np.ndarray:  # the block's rows [m] -> [m, d], the final vectors ln_f(x)
        x = self.embeddings()  # [m, d]
        xs = [x]
        for layer in range(self.hp.n_layer):
            x = self.transformer_block(x, layer)
            xs.append(x)
        for i, s, start, rows in self.texts():
            if self.again:
                self.residuals[i] = np.stack([a[rows][0] for a in xs[1:]])
                continue
            if s.trace is not None:
                s.trace.append([a[rows] for a in xs])
            s.ended(self.reads[i].ids, start)
        return layer_norm(x, **self.ln_f, eps=self.hp.eps)

    def embeddings(self):  # every text's tokens -> their wte and wpe rows, as stored, summed [m, d]
        d, rows = self.hp.n_embd, [None] * len(self.reads)
        for i, s, start, _ in self.texts():
            rows[i] = None if self.again else s.take_ahead(self.reads[i].ids, start)
        need = [i for i, *_ in self.texts() if rows[i] is None]
        if need:
            ids = np.concatenate([self.reads[i].ids for i in need]).astype(np.int64)
            pos = np.concatenate([np.arange(self.starts[i], self.starts[i] + len(self.reads[i].ids)) for i in need])
            wte, wpe = self.fetch_rows([("wte", ids), ("wpe", pos)], {i: len(self.reads[i].ids) for i in need})
            at = np.cumsum([0] + [len(self.reads[i].ids) for i in need])
            for j, i in enumerate(need):
                rows[i] = wte[at[j] : at[j + 1]], wpe[at[j] : at[j + 1]]
        x = np.zeros((self.bounds[-1], d))
        for i, *_, block in self.texts():
            x[block] = rows[i][0][:, :d].astype(np.float64) + rows[i][1].astype(np.float64)
        return x

    def fetch_rows(self, tables, weights, shared=()) -> list:
        """Rows of the model's tables [(table, ids)] in one round (each table one fetch, its ids once), `shared`
        calls after them ({text: its part} `weights`); each table's rows in the order asked, then `shared`'s results."""
        fetches, inverse = [], []
        for table, ids in tables:
            unique, back = np.unique(ids, return_inverse=True)
            fetches.append(later.fetch(self.engine.name(table), unique))
            inverse.append(back)
        found, _ = self.send([*fetches, *shared], rows=weights)
        return [*(f[back] for f, back in zip(found, inverse)), *found[len(fetches) :]]

    def gpt2(self, h) -> dict:  # [m, d] -> {text: its k best next tokens}: h @ wte.T as a top-k search
        asking = [i for i, *_ in self.texts() if self.reads[i].k]
        if not asking:
            return {}
        m2 = self.engine.m2["wte"]
        q = encoding.encode_queries(h[[self.bounds[i + 1] - 1 for i in asking]], self.metric, m2)
        # The candidates' rows come with them (a token document's first d columns are its embedding), and the next
        # position's row beside them: the next token's read needs no round of its own for them. Not for a long
        # list of candidates, whose vectors would weigh more than a round (a token's top 1,000: 3 MB).
        sessions = {i: self.reads[i].session for i in asking}
        ahead = [i for i in asking if self.reads[i].k <= AHEAD_MOST and sessions[i].position < self.hp.n_ctx]
        groups: dict = {}  # (k, rows come along) -> the places in `asking` of the texts searched together
        for j, i in enumerate(asking):
            groups.setdefault((self.reads[i].k, i in ahead), []).append(j)
        searches = [Search(self.engine.name("wte"), q[js], k=k, vectors=a) for (k, a), js in groups.items()]
        nxt = np.array([sessions[i].position for i in ahead], np.int64)
        weights = dict.fromkeys(asking, 1)
        if len(ahead):
            wpe, found = self.fetch_rows([("wpe", nxt)], weights, [later.search_many(searches)])
        else:
            wpe, ((found,), _) = None, self.send([later.search_many(searches)], rows=weights)
        out = {}
        for hits, ((_, a), js) in zip(found, groups.items()):
            for row, j in enumerate(js):
                i, ids = asking[j], hits.ids[row]
                out[i] = ordered(
                    ids, encoding.decode_dists(hits.dists[row : row + 1], q[j : j + 1], m2, self.metric)[0]
                )
                if a and hits.vectors is not None:  # a store that cannot give them: the next read fetches them
                    s = sessions[i]
                    s.ahead = Ahead(s.position, dict(zip(ids.tolist(), hits.vectors[row])), wpe[ahead.index(i)][None])
        return out


class Stopped(Exception):
    """Every text of a step has failed: the step ends (each text's error is in Step.errors)."""


def one(m: int) -> bool:  # a text reading one position (a decode step)
    return m == 1


def several(m: int) -> bool:  # a text reading a block (a prompt's chunk)
    return m > 1


def calls(asked: dict) -> dict:  # {text: (sent, call) or None} -> {text: [call]} of the texts that search
    return {i: [a[1]] for i, a in asked.items() if a is not None}


Session.step = Step
