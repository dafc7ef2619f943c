"""The Llama family (Llama, Qwen2, Mistral), every product a search; read beside reference_llama.py.

reference_llama's functions in its order, where `x @ weight.T + bias` is one search of every row of a matrix
(vecgpt.loading.LlamaLoad's documents): q, k and v one search (h.<i>.attn.c_attn), rotary positions applied in numpy
to q and k, the keys written after rotation, so a search's q.k is the rotated score; the key search, each key head's
group of query heads together (vecgpt.text_keys); gate and up one search (h.<i>.mlp.c_fc); down one (h.<i>.mlp.c_proj).
The next token is a top-k search over the output matrix's rows (wte when tied to the token table, else lm_head), and
a token's embedding is fetched by id (the first d columns of its wte document, or its row of embed_tokens); tied, the
token search brings its candidates' rows along. RMSNorm, SiLU, softmax and residual adds stay in numpy, in float64.

Layout five (LlamaSession): after attention (the softmax vecgpt.llama_keys), o_proj one search (h.<i>.attn.c_proj);
five dependent rounds a layer. A text row: a key head's rotated key (head_dim) as its vector, its raw value as its
payload. Layout four (LlamaFourSession): each position's value of key head kv is projected, when it is computed, by
the slices of o_proj of the query heads it serves (h.<i>.attn.c_proj.<kv>, one search a key head) in the key search's
round, and attention sums each query head's softmax-weighted projected values (engine.Step's order); four rounds a
layer. A text row: the rotated key as its vector, its group's projected values (group x d) as its payload.
A text keeps n_kv_head heads of keys, and its Session's `hp` counts those heads (n_head = n_kv_head), as the key
searches, writes, restore and branching (vecgpt.text_keys, vecgpt.session) read it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from vecgpt import encoding, llama_keys
from vecgpt.attend import attend
from vecgpt.backends.base import Search
from vecgpt.engine import AHEAD_MOST, LAYOUTS, Session, Step
from vecgpt.five_rounds import FiveRoundsStep
from vecgpt.meter import later
from vecgpt.reference_llama import inv_freq, rms_norm, rotate_heads, silu
from vecgpt.sampling import ordered
from vecgpt.session import Ahead
from vecgpt.text_keys import keep_norms


class LlamaSession(Session):
    """A text on a Llama-family model loaded in layout five: n_kv_head heads of keys and raw values."""

    def __init__(self, engine, name: str | None = None, create: bool = True):
        super().__init__(engine, name, create=False)
        self.hp = hp = replace(engine.hparams, n_head=engine.hparams.n_kv_head)  # the key heads
        self.hold_positions(self.value_heads(), hp.n_head)
        if create:
            dim, payload = self.row_widths()
            self.store.create(self.name, dim, self.metric, ("layer", "head", "position"), payload=payload)

    def row_widths(self) -> tuple[int, int]:
        """A rotated key (and under l2 its pad, vecgpt.key_bounds) and its raw value, head_dim each."""
        hd = self.engine.hparams.head_dim
        return hd + int(self.engine.key_bound is not None), hd

    def value_heads(self) -> int:
        """The heads of a position's kept values: the key heads' raw values."""
        return self.engine.hparams.n_kv_head

    def value_width(self) -> int:
        return self.engine.hparams.head_dim


class LlamaFourSession(LlamaSession):
    """A text on a Llama-family model loaded in layout four: n_kv_head heads of rotated keys; each query head's
    projected values (its key head's value times its slice of o_proj, d floats) kept by query head, [L, n_head, ctx,
    d], and stored as its key head's row's payload, the group's side by side (group x d)."""

    def row_widths(self) -> tuple[int, int]:
        hp = self.engine.hparams
        return hp.head_dim + int(self.engine.key_bound is not None), hp.group * hp.n_embd

    def value_heads(self) -> int:
        return self.engine.hparams.n_head

    def value_width(self) -> int:
        return self.engine.hparams.n_embd

    def keep_values(self, layer: int, start: int, values: np.ndarray) -> None:
        """Positions start.. of a layer: their projected values [m, H_kv, group d] as the store holds them."""
        super().keep_values(layer, start, values.reshape(len(values), -1, self.engine.hparams.n_embd))

    def take_rows(self, vectors, payload) -> None:
        """The first n positions' rows as the store holds them: keys [L, n, H_kv, hd], payload [.., group d]."""
        n_layer, n = payload.shape[:2]
        super().take_rows(vectors, payload.reshape(n_layer, n, -1, self.engine.hparams.n_embd))


def norms(engine) -> tuple[list[dict], dict]:
    """Each layer's two RMSNorm weights and the final one, fetched once an engine: held where Step reads GPT-2's."""
    if engine._ln is None:
        n = engine.hparams.n_layer
        table = engine.store.fetch(engine.name("ln"), np.arange(2 * n + 1)).astype(np.float64)
        layers = [{"input_layernorm": table[2 * i], "post_attention_layernorm": table[2 * i + 1]} for i in range(n)]
        engine._ln = layers, {"weight": table[2 * n]}
    return engine._ln


class LlamaStep(FiveRoundsStep):
    """A step on a Llama-family model: FiveRoundsStep's writes and rounds, the family's block."""

    def __init__(self, reads, again: bool = False):
        norms(reads[0].session.engine)
        super().__init__(reads, again)
        self.freq = inv_freq(self.hp.head_dim, self.hp.rope_theta, self.hp.scaling)
        self.group = self.hp.n_head // self.hp.n_kv_head
        self.output = "wte" if self.hp.tied else "lm_head"

    def positions(self) -> np.ndarray:  # each row of the block's position, float64 as reference_llama's
        return np.concatenate([np.arange(a, a + len(r.ids), dtype=np.float64) for a, r in zip(self.starts, self.reads)])

    def gqa(self, x, layer):  # [m, d] -> [m, d]; reference_llama.gqa
        q, v, k32 = self.rotated(x, layer)
        searched = self.scores_and_projections(q, v, k32, layer)
        own = (q * np.repeat(k32, self.group, axis=1).astype(np.float64)).sum(axis=-1).T  # [H, m], engine.own_scores
        return self.attention(q, searched, own, layer)

    def rotated(
        self, x, layer
    ):  # [m, d] -> q [m, H, hd] and k32 [m, H_kv, hd] rotated (k32 as stored), v [m, H_kv, hd]
        hp, m = self.hp, len(x)
        hd, n_kv = hp.head_dim, hp.n_kv_head
        q, k, v = np.split(self.linear(x, f"h.{layer}.attn.c_attn"), [hp.n_head * hd, (hp.n_head + n_kv) * hd], axis=1)
        at = self.positions()
        q = rotate_heads(q, hp.n_head, at, self.freq).reshape(m, hp.n_head, hd)
        k32 = rotate_heads(k, n_kv, at, self.freq).reshape(m, n_kv, hd).astype(np.float32)  # as the store holds them
        for _, s, start, rows in self.texts():
            keep_norms(s, layer, start, k32[rows])
        return q, v.reshape(m, n_kv, hd), k32

    def attention(self, q, searched, own, layer):  # -> [m, d]: each query head's softmax times its key head's values,
        heads = np.zeros((len(q), self.hp.n_head * self.hp.head_dim))  # side by side, then o_proj one search
        for i, s, start, rows in self.texts():
            if i in searched:
                out = llama_keys.attend(s, searched[i], own[:, rows], start, layer, self.group)
                heads[rows] = out.transpose(1, 0, 2).reshape(rows.stop - rows.start, -1)
        return self.linear(heads, f"h.{layer}.attn.c_proj")

    def swiglu(self, x, layer):  # [m, d] -> [m, d]: gate and up one search, down one
        gate, up = np.split(self.linear(x, f"h.{layer}.mlp.c_fc"), 2, axis=1)
        return self.linear(silu(gate) * up, f"h.{layer}.mlp.c_proj")

    def transformer_block(self, x, layer):  # [m, d] -> [m, d]
        norm, eps = self.ln[layer], self.hp.eps
        x = x + self.gqa(rms_norm(x, norm["input_layernorm"], eps), layer)
        return x + self.swiglu(rms_norm(x, norm["post_attention_layernorm"], eps), layer)

    def hidden(self) -> np.ndarray:  # the block's rows [m] -> [m, d], the final vectors norm(x)
        x = self.embeddings()
        xs = [x]
        for layer in range(self.hp.n_layer):
            x = self.transformer_block(x, layer)
            xs.append(x)
        for i, s, start, rows in self.texts():
            if self.again:  # an inspection: the residual after each layer, nothing ended
                self.residuals[i] = np.stack([a[rows][0] for a in xs[1:]])
                continue
            if s.trace is not None:
                s.trace.append([a[rows] for a in xs])
            s.ended(self.reads[i].ids, start)
        return rms_norm(x, self.ln_f["weight"], self.hp.eps)

    def embeddings(self):  # every text's tokens -> their rows of the token table, as stored [m, d]
        d, rows = self.hp.n_embd, [None] * len(self.reads)
        for i, s, start, _ in self.texts():
            rows[i] = None if self.again else s.take_ahead(self.reads[i].ids, start)
        need = [i for i, *_ in self.texts() if rows[i] is None]
        if need:
            ids = np.concatenate([self.reads[i].ids for i in need]).astype(np.int64)
            table = "wte" if self.hp.tied else "embed_tokens"
            (found,) = self.fetch_rows([(table, ids)], {i: len(self.reads[i].ids) for i in need})
            at = np.cumsum([0] + [len(self.reads[i].ids) for i in need])
            for j, i in enumerate(need):
                rows[i] = (found[at[j] : at[j + 1]], None)
        x = np.zeros((self.bounds[-1], d))
        for i, *_, block in self.texts():
            x[block] = rows[i][0][:, :d].astype(np.float64)
        return x

    def llama(self, h) -> dict:  # [m, d] -> {text: its k best next tokens}: h @ output.T as a top-k search
        asking = [i for i, *_ in self.texts() if self.reads[i].k]
        if not asking:
            return {}
        m2 = self.engine.m2[self.output]
        q = encoding.encode_queries(h[[self.bounds[i + 1] - 1 for i in asking]], self.metric, m2)
        # tied, a candidate's document begins with its embedding: it comes along for the next read
        ahead = [self.hp.tied and self.reads[i].k <= AHEAD_MOST for i in asking]
        groups: dict = {}
        for j, i in enumerate(asking):
            groups.setdefault((self.reads[i].k, ahead[j]), []).append(j)
        searches = [Search(self.engine.name(self.output), q[js], k=k, vectors=a) for (k, a), js in groups.items()]
        (found,), _ = self.send([later.search_many(searches)], rows=dict.fromkeys(asking, 1))
        out = {}
        for hits, ((_, a), js) in zip(found, groups.items()):
            for row, j in enumerate(js):
                i, ids = asking[j], hits.ids[row]
                dists = encoding.decode_dists(hits.dists[row : row + 1], q[j : j + 1], m2, self.metric)[0]
                out[i] = ordered(ids, dists)
                if a and hits.vectors is not None:
                    s = self.reads[i].session
                    s.ahead = Ahead(s.position, dict(zip(ids.tolist(), hits.vectors[row])), None)
        return out

    gpt2 = llama  # Step.run's name for the output layer


class LlamaFourStep(LlamaStep):
    """A step on a Llama-family model loaded in layout four: engine.Step's attention (values projected in the key
    search's round by key head, each query head's weighted projected values summed), the family's block."""

    scores_and_projections = Step.scores_and_projections
    attention = Step.attention

    def weighted_values(self, searched, own, layer) -> list:  # Step's, scaled by the family's head_dim
        texts = list(self.texts())
        entries = [(s, searched[i], own[:, rows], start) for i, s, start, rows in texts]
        values = attend(entries, layer, self.hp.head_dim)
        return [(rows, v) for (*_, rows), v in zip(texts, values)]


LlamaSession.layout, LlamaSession.step = "five", LlamaStep
LlamaFourSession.layout, LlamaFourSession.step = "four", LlamaFourStep
LAYOUTS["llama_five"], LAYOUTS["llama_four"] = LlamaSession, LlamaFourSession
