"""Three rounds a layer (`vecgpt load --layout three`): exact rearrangements with weight products made at load.

The plain layout (engine.Session) has four dependent rounds a layer: c_attn; the key search with each head's
value projection; c_fc; c_proj. Here attention's whole round needs only the layer input x = ln_1(...):
- a position's projected value of head h is x W_vo + b_vo, W_vo = W_v W_o (h.<i>.attn.vo.<h>, made in float64
  at load, c_proj's bias on head 0), so it comes with c_attn instead of after it;
- for an earlier position j, q_i . k_j = (x_i W_q + b_q) . k_j = (x_i, 1) . (W_q k_j, b_q . k_j): a text stores
  that document of d + 1 floats per (layer, head, position), and the key search sends (x_i, 1).
The document is itself a multiply, k_j against the rows of W_q and b_q (h.<i>.attn.qk.<h>), off the critical
path: it rides with c_fc. The own position and the WINDOW latest are scored in numpy from c_attn's q and
the keys in memory, as in the plain layout, so no search waits for a write. A layer is then three rounds:
c_attn + projected values + key search; c_fc + documents; c_proj.

A text row: the document as its vector (d + 1), the key and the projected value as its payload (hd + d);
`key_norms` holds |document|^2 (what the key search's decoding needs), recomputed from the rows on restore.
"""

from __future__ import annotations

import numpy as np

from vecgpt.engine import Session, searched_end, squared_norms
from vecgpt.meter import later
from vecgpt.reference import gelu, layer_norm


class ThreeRounds(Session):
    """A Session on a model loaded with layout "three"."""

    layout = "three"

    def transformer_block(self, x, layer, start):  # [m, d] -> [m, d]
        ln, eps = self.ln[layer], self.hp.eps
        x = x + self.mha(layer_norm(x, **ln["ln_1"], eps=eps), layer, start)
        h = self.fc_and_documents(layer_norm(x, **ln["ln_2"], eps=eps), layer, start)
        return x + self.linear(gelu(h), f"h.{layer}.mlp.c_proj")

    def mha(self, x, layer, start):  # [m, d] -> [m, d]: one round, from x alone
        hp, m = self.hp, len(x)
        searched = searched_end(start)  # keys < searched from the store, the rest from memory (WINDOW)
        attn = self.search_of(x, f"h.{layer}.attn.c_attn")
        values = [self.search_of(x, f"h.{layer}.attn.vo.{h}") for h in range(hp.n_head)]
        x1 = np.broadcast_to(np.hstack([x, np.ones((m, 1))])[:, None], (m, hp.n_head, hp.n_embd + 1))
        sent, keys = self.key_searches(x1, layer, searched) if searched else (None, [])
        calls = [later.search_many([attn[0]]), later.search_many([s for s, _ in values])]
        found = self.store.together(*calls, *([later.search_many(keys)] if keys else []))  # filed as a key search
        qkv = attn[1](found[0][0])
        q, k = (a.reshape(m, hp.n_head, -1) for a in np.split(qkv, 3, axis=1)[:2])
        self.keys[layer, start : start + m] = k.astype(np.float32)  # keys as the store holds them
        self.projected[layer, start : start + m] = np.stack([d(h) for (_, d), h in zip(values, found[1])], axis=1)
        columns = [self.key_columns(sent, found[2], layer, searched)] if keys else []
        columns.append(self.memory_scores(q, layer, searched, start + m))
        return self.attention(q, columns, layer, start)

    def fc_and_documents(self, x, layer, start):  # [m, d] -> c_fc's [m, 4d]; the new rows' documents beside it
        m, n_head = len(x), self.hp.n_head
        k32 = self.keys[layer, start : start + m]  # [m, H, hd]
        fc = self.search_of(x, f"h.{layer}.mlp.c_fc")
        docs = [self.search_of(k32[:, h], f"h.{layer}.attn.qk.{h}") for h in range(n_head)]
        found = self.store.together(later.search_many([fc[0]]), later.search_many([s for s, _ in docs]))
        doc32 = np.stack([d(h) for (_, d), h in zip(docs, found[1])], axis=1).astype(np.float32)  # [m, H, d + 1]
        self.key_norms[layer, :, start : start + m] = squared_norms(doc32).T
        payload = np.concatenate([k32, self.projected[layer, start : start + m]], axis=2)
        self.pending.append((layer, start, doc32, payload))
        if m > 1:  # a block's rows go layer by layer, as in the plain layout
            self.write(later.upsert(*self.key_rows(self.pending)))
            self.pending = []
        return fc[1](found[0][0])

    def take_rows(self, vectors, payload) -> None:
        """The first n positions' rows as the store holds them: documents [L, n, H, d + 1], payload [.., hd + d]."""
        n, hd = vectors.shape[1], self.hp.n_embd // self.hp.n_head
        self.keys[:, :n], self.projected[:, :n] = payload[..., :hd], payload[..., hd:]
        self.key_norms[:, :, :n] = squared_norms(vectors).transpose(0, 2, 1)
