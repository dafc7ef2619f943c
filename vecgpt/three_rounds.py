"""Three rounds a layer (`vecgpt load --layout three`): exact rearrangements with weight products made at load.

The plain layout (engine.Session) has four dependent rounds a layer: c_attn; the key search with each head's
value projection; c_fc; c_proj. Here attention's whole round needs only the layer input x = ln_1(...):
- a position's projected value of head h is x W_vo + b_vo, W_vo = W_v W_o (h.<i>.attn.vo.<h>, made in float64
  at load, c_proj's bias on head 0), so it comes with c_attn instead of after it;
- for an earlier position j, q_i . k_j = (x_i W_q + b_q) . k_j = (x_i, 1) . (W_q k_j, b_q . k_j): a text stores
  that document of d + 1 floats per (layer, head, position), and the key search sends (x_i, 1).
The document is itself a multiply, k_j against the rows of W_q and b_q (h.<i>.attn.qk.<h>), off the critical
path: it rides with c_fc. Each query's own key is scored in numpy from c_attn's q and k, as in the plain layout.
A decode step's layer is then three rounds: c_attn + projected values + key search; c_fc + documents; c_proj.
A prompt block searches its own earlier positions too, so its documents are made and written before its key
search: c_attn + projected values; documents; key search; c_fc; c_proj.

A text row: the document as its vector (d + 1), the key and the projected value as its payload (hd + d);
`key_norms` holds |document|^2 (what the key search's decoding needs), recomputed from the rows on restore.
"""

from __future__ import annotations

import numpy as np

from vecgpt.engine import Session, Step, calls, layout, one, own_scores, several, squared_norms
from vecgpt.meter import later
from vecgpt.reference import gelu, layer_norm
from vecgpt.text_keys import keep_norms, queue_rows


class ThreeRoundsStep(Step):
    """A step on a model loaded with layout "three"."""

    def transformer_block(self, x, layer):  # [m, d] -> [m, d]
        ln, eps = self.ln[layer], self.hp.eps
        x = x + self.mha(layer_norm(x, **ln["ln_1"], eps=eps), layer)
        h = self.fc_and_documents(layer_norm(x, **ln["ln_2"], eps=eps), layer)
        return x + self.linear(gelu(h), f"h.{layer}.mlp.c_proj")

    def mha(self, x, layer):  # [m, d] -> [m, d]: a decode step's attention is one round, from x alone
        hp, m = self.hp, len(x)
        attn = self.search_of(x, f"h.{layer}.attn.c_attn")
        values = [self.search_of(x, f"h.{layer}.attn.vo.{h}") for h in range(hp.n_head)]
        x1 = np.broadcast_to(np.hstack([x, np.ones((m, 1))])[:, None], (m, hp.n_head, hp.n_embd + 1))
        asked = self.key_searches(x1, layer, one)
        found, own = self.send([later.search_many([attn[0]]), later.search_many([s for s, _ in values])], calls(asked))
        q, k = (a.reshape(m, hp.n_head, -1) for a in np.split(attn[1](found[0][0]), 3, axis=1)[:2])
        self.fresh = k.astype(np.float32)  # keys as the store holds them (in the rows' payload)
        projected = np.stack([d(h) for (_, d), h in zip(values, found[1])], axis=1)
        for _, s, start, rows in self.texts():
            s.keep_values(layer, start, projected[rows])
        searched = self.key_scores(asked, own, layer)
        blocks = [rows for *_, rows in self.texts(only=several)]
        if blocks:  # a block: its documents are made and written, then searched with the earlier ones
            picked = np.concatenate([np.arange(r.start, r.stop) for r in blocks])
            searches, decode = self.documents(layer, picked)
            (found,), _ = self.send([later.search_many(searches)], rows=self.parts(several))
            self.keep_documents(decode(found), layer, several, picked)
            searched.update(self.key_round(x1, layer, several))
        return self.attention(q, searched, own_scores(q, self.fresh), layer)

    def parts(self, only) -> dict:  # {text: its rows} of the texts `only` picks
        return {i: rows.stop - rows.start for i, _, _, rows in self.texts(only=only)}

    def documents(
        self, layer, picked
    ):  # rows' fresh keys -> (a search per head, decode(hits) -> [m, H, d + 1] float32)
        docs = [self.search_of(self.fresh[picked, h], f"h.{layer}.attn.qk.{h}") for h in range(self.hp.n_head)]
        decode = lambda found: np.stack([d(h) for (_, d), h in zip(docs, found)], axis=1).astype(np.float32)  # noqa: E731
        return [s for s, _ in docs], decode

    def keep_documents(self, doc32, layer, only, picked) -> None:  # |document|^2 for the key search, the rows queued
        at = 0
        for _, s, start, rows in self.texts(only=only):
            m = rows.stop - rows.start
            while picked[at] < rows.start:  # a text that failed since its rows were picked
                at += 1
            doc = doc32[at : at + m]
            keep_norms(s, layer, start, doc)
            payload = np.concatenate([self.fresh[rows], s.values(layer, start, m)], axis=2)
            queue_rows(s, layer, start, doc, payload)
            at += m

    def fc_and_documents(self, x, layer):  # [m, d] -> c_fc's [m, 4d]; a decode step's documents beside it
        picked = [rows.start for *_, rows in self.texts(only=one)]
        if not picked:  # a block's went before its key search
            return self.linear(x, f"h.{layer}.mlp.c_fc")
        fc, (searches, decode) = self.search_of(x, f"h.{layer}.mlp.c_fc"), self.documents(layer, np.array(picked))
        (fc_found, doc_found), _ = self.send([later.search_many([fc[0]]), later.search_many(searches)])
        self.keep_documents(decode(doc_found), layer, one, np.array(picked))
        return fc[1](fc_found[0])


@layout("three")
class ThreeRounds(Session):
    """A Session on a model loaded with layout "three"."""

    def take_rows(self, vectors, payload) -> None:
        """The first n positions' rows as the store holds them: documents [L, n, H, d + 1], payload [.., hd + d]."""
        n, hd = vectors.shape[1], self.hp.n_embd // self.hp.n_head
        self.reserve(n)
        self.projected[:, :, :n] = payload[..., hd:].transpose(0, 2, 1, 3)
        self.key_norms[:, :, :n] = squared_norms(vectors).transpose(0, 2, 1)


ThreeRounds.step = ThreeRoundsStep
