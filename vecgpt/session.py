"""One text's decoding state on an engine, as data: its tokens, the positions it has written, its keys' norms and
kept values, its writes in flight. The work of a step is the runner's (engine.Step), for every text at once; a
Session only keeps what a text needs between steps, and the bookkeeping of its writes.

Its attention keys live in the store (collection text-<id>, tagged layer/head/position) and, for what attention
needs besides the scores the store returns, in memory: each key's |k|^2 and each position's kept value (a value
projected by its head's rows of c_proj, or the raw value in layout five) in float64, converted once from the
float32 the store holds. vecgpt.text keeps a text's record beside it, so another process can continue it.
"""

from __future__ import annotations

import time
import uuid
from contextlib import suppress
from typing import NamedTuple

import numpy as np

from vecgpt import rounds, stepper
from vecgpt.errors import VecgptError
from vecgpt.loading import text_row
from vecgpt.meter import SESSION_PREFIX, Metered, later
from vecgpt.writer import Writer


class Read(NamedTuple):
    """One text's rows in a step: tokens `ids` read from `start` (None: where the text is), and then, if `k`, the
    text's best k next tokens."""

    session: Session
    ids: list[int]
    k: int | None = None
    start: int | None = None


class Ahead(NamedTuple):
    """Rows of the model read ahead for the next position: each candidate token's wte row, that position's wpe
    row. Rows of the model, not of a text: right for any text that reads one of these tokens there."""

    position: int
    tokens: dict[int, np.ndarray]  # token id -> its document as stored, [dim]
    wpe: np.ndarray  # [1, d]


def write_points(n_layer: int) -> frozenset[int]:
    """The layers after which a decode step queues its rows: the first half's, then the rest. Layer l's rows are
    first searched at the next token's layer l, half a token after the later of their writes is queued at least,
    and a token's rows go out in two writes instead of one per layer (a store charges a minimum per write)."""
    return frozenset({max(0, n_layer // 2 - 1), n_layer - 1})


ROOM = 64  # positions a text's kept values and key norms take room for at a time (vecgpt.attend.PAD's multiple)


def grown(a: np.ndarray, size: int) -> np.ndarray:  # [L, H, n, ...] -> [L, H, size, ...], the first n kept
    out = np.zeros((*a.shape[:2], size, *a.shape[3:]), a.dtype)
    out[:, :, : a.shape[2]] = a
    return out


def squared_norms(k32: np.ndarray) -> np.ndarray:
    """|k|^2 over the last axis in float64, summed the same way however many keys: a resumed text's norms
    (from the stored keys) equal those its first process computed, to the last bit."""
    k = np.ascontiguousarray(k32, np.float64)
    return (k * k).sum(axis=-1)


def chunks(ids: list[int], start: int, size: int) -> list[list[int]]:
    """Tokens read from position `start`, cut where a position is a multiple of `size`: where a text's chunks end
    depends on the text alone, never on what else is read with it or where a read began."""
    cuts = [p - start for p in range((start // size + 1) * size, start + len(ids), size)]
    return [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)]) if b > a]


class Session:
    """One text's state on an engine (see the module's docstring); a layout's subclass says what a kept value and
    a text row hold (vecgpt.three_rounds, vecgpt.five_rounds)."""

    layout: str  # the model's layout (vecgpt.config.LAYOUTS), set by engine.layout
    capture: list | None = None  # set by an inspection: attention appends (q.k, weights) of each layer
    step: type  # the layout's runner (engine.Step or its subclass)

    def __init__(self, engine, name: str | None = None, create: bool = True):
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
        self.hold_positions(hp.n_head, hp.n_head)
        self.policy = engine.policy  # the earlier keys each query keeps (vecgpt.policy; inactive: every one)
        if create:
            dim, payload = self.row_widths()
            self.store.create(self.name, dim, self.metric, ("layer", "head", "position"), payload=payload)

    @property
    def attention_top_k(self) -> int | None:
        return self.policy.top_k

    @attention_top_k.setter
    def attention_top_k(self, k: int | None) -> None:
        self.policy = self.policy._replace(top_k=k)

    def row_widths(self) -> tuple[int, int]:
        """A text row's vector and payload widths (vecgpt.loading.text_row)."""
        return text_row(self.hp, self.layout, padded=self.engine.key_bound is not None)

    def value_width(self) -> int:
        """The width of a position's kept value, a head's row of `projected`: projected by c_proj, d."""
        return self.hp.n_embd

    def hold_positions(self, value_heads: int, key_heads: int) -> None:
        """Room for the first positions' kept values and key norms, grown as the text reaches further (`reserve`)."""
        hp, first = self.hp, min(ROOM, self.hp.n_ctx)
        # each position's kept value, [L, H, positions, w] in float64: a head's values are contiguous rows, which
        # attention multiplies by its weights as they are
        self.projected = np.zeros((hp.n_layer, value_heads, first, self.value_width()))
        self.key_norms = np.zeros((hp.n_layer, key_heads, first))  # [L, H, positions]

    def reserve(self, end: int) -> None:
        """Room for positions below `end`: doubled (at least to a whole ROOM, at most the context) when they do not
        fit. A text holds the positions it reached, not its model's whole context: a new text's first read takes
        pages for its own positions only (a whole context a text, 75 MB at GPT-2 small, cost 16 new texts a second
        of page faults), and attention's padded rows (vecgpt.attend.padded) always fit."""
        have = self.key_norms.shape[2]
        if end > have:
            size = min(self.hp.n_ctx, max(2 * have, -(-end // ROOM) * ROOM))
            self.projected, self.key_norms = grown(self.projected, size), grown(self.key_norms, size)

    def keep_values(self, layer: int, start: int, values: np.ndarray) -> None:
        """Positions start.. of a layer: their values [m, H, w] as the store holds them (float32), kept in float64."""
        self.reserve(start + len(values))
        self.projected[layer, :, start : start + len(values)] = values.astype(np.float32).transpose(1, 0, 2)

    def values(self, layer: int, start: int, m: int) -> np.ndarray:  # -> [m, H, w], as kept
        return self.projected[layer, :, start : start + m].transpose(1, 0, 2)

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

    def read(self, ids, k: int | None = None):
        """Feed tokens, a chunk of the engine's size at a time, as a stepper of this text alone; the best k next
        tokens after the last one."""
        return stepper.run_one(self.reading(ids, k))

    def reading(self, ids, k: int | None = None):
        """`read` as an operation for a stepper: it yields each chunk's Read and returns the last one's candidates."""
        ids = [int(i) for i in ids]
        self.check_room(len(ids))
        pieces = chunks(ids, self.position, self.engine.chunk_size)
        out = None
        for j, piece in enumerate(pieces):
            out = yield Read(self, piece, (k or self.engine.top_k) if j == len(pieces) - 1 else None)
        return out

    def check_room(self, m: int) -> None:
        if self.position + m > self.hp.n_ctx:
            raise VecgptError(f"the text would reach {self.position + m} tokens; the context holds {self.hp.n_ctx}")

    def check_read(self, start: int) -> None:
        """Ready to read from `start`: every position before it queued for the store."""
        self.pending = []  # what a read cut short (Ctrl-C) left
        self.check_written(start)

    def check_written(self, start: int) -> None:
        """Every position before `start` has been queued for the store (a truncated text reads its lost ones again)."""
        queued = max([self.written, *(end for _, _, end in self._key_writes)])
        if queued < start:
            raise VecgptError(f"positions up to {start} of this text were never written; start the text again")

    def model_dropped(self) -> VecgptError:
        return VecgptError(
            f"model {self.engine.key} was dropped from the store while this text was open; "
            f"load it again and start the text again"
        )

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

    def await_layer(self, layer: int) -> None:
        """Block until this layer's rows of every position read have landed, counted as a wait with its seconds. A
        store without a writer thread gets them in the key search's own round, ahead of the search."""
        ticket = self.layer_ticket.get(layer)
        if ticket is None or self.writer.acked(ticket) or not self.writer.background:
            return
        began = time.perf_counter()
        self.writer.wait(ticket)
        self.meter.waited(time.perf_counter() - began)

    def key_ids(self, layer, head, pos):  # the row id of a key: one per (layer, head, position)
        return (layer * self.hp.n_head + head) * self.hp.n_ctx + pos

    def send(self, *calls) -> list:
        """One round trip of this text alone (vecgpt.rounds, as a step's): the calls, with the writes waiting to ride
        along (a store without a writer thread); the calls' results."""
        _, found, failed = rounds.send(self.engine.store, [], {}, {self: list(calls)})
        if self in failed:
            raise failed[self]
        return found.get(self, [])

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
        self.reserve(n)
        self.projected[:, :, :n] = payload.transpose(0, 2, 1, 3)
        self.key_norms[:, :, :n] = squared_norms(vectors).transpose(0, 2, 1)

    def adopt(self, other: Session, n: int) -> None:
        """Start from another session's first n positions, whose keys and values this text's collection holds."""
        self.reserve(n)
        self.projected[:, :, :n], self.key_norms[:, :, :n] = other.projected[:, :, :n], other.key_norms[:, :, :n]
        self.tokens, self._written, self._key_writes, self.layer_ticket = other.tokens[:n], n, [], {}

    def inspect(self, position: int, token: int):
        """What reading `token` at `position` again computes, writing nothing (vecgpt.inspection)."""
        return self.engine.inspect(self, position, token)
