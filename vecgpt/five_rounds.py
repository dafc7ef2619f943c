"""Five rounds a layer (`vecgpt load --layout five`): the textbook order, reference.mha's plain path.

The default layout (engine.Session) projects each position's value by its head's rows of c_proj when it is
computed: a search per head and position (144 a token at GPT-2 small), in the key search's round, so a layer
is four rounds. An embedded store pays nothing for a round but a fixed cost for each query, and the projected
values take d floats per (layer, position, head). Here attention's output projection is one search of the
whole c_proj (h.<i>.attn.c_proj) over the heads' outputs side by side, after attention; a text keeps the raw
values (hd floats). A layer is five dependent rounds: c_attn; key search; c_proj; c_fc; mlp.c_proj.

A text row: the key (hd) as its vector, the raw value (hd) as its payload. Which keys are searched, the writes,
restore, adopt and branching are the plain layout's: only what a row's payload holds and how attention ends differ.
"""

from __future__ import annotations

import numpy as np

from vecgpt.engine import Session, layout


@layout("five")
class FiveRounds(Session):
    """A Session on a model loaded with layout "five"; `projected` holds each position's raw value [.., H, hd]."""

    # hd floats a head: float64 in memory is twice a small array and spares attention converting every kept value
    # at every read
    kept = np.float64

    def value_width(self) -> int:
        """A position's kept value: the raw value of its head, hd."""
        return self.hp.n_embd // self.hp.n_head

    def scores_and_projections(self, q, v, k32, layer, start):
        """q.k of every earlier key (one round); a block's rows are queued first (its key search sees them), a decode
        step's after (its search needs only earlier rows: it waits for no write of its own)."""
        m, v32 = len(v), v.astype(np.float32)  # as the store holds them
        self.projected[layer, start : start + m] = v32
        if m > 1:
            self.queue_rows(layer, start, k32, v32)
        searched = self.key_round(q, layer, start)[0]
        if m == 1:
            self.queue_rows(layer, start, k32, v32)
        return searched

    def attention(
        self, q, searched, own, layer, start
    ):  # q [m, H, hd] -> [m, d]: concat_h softmax(q k^T / sqrt(hd)) v_h
        heads = self.weighted_values(q, searched, own, layer, start)  # [H, m, hd]
        return self.linear(heads.transpose(1, 0, 2).reshape(len(q), -1), f"h.{layer}.attn.c_proj")
