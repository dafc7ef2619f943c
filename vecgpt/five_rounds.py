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

from vecgpt.engine import Session, Step, layout, one, several
from vecgpt.text_keys import queue_rows


@layout("five")
class FiveRounds(Session):
    """A Session on a model loaded with layout "five"; `projected` holds each position's raw value [.., H, hd]."""

    def value_width(self) -> int:
        """A position's kept value: the raw value of its head, hd."""
        return self.hp.n_embd // self.hp.n_head


class FiveRoundsStep(Step):
    """A step on a model loaded with layout "five": attention's heads side by side, then one search of c_proj."""

    def scores_and_projections(self, q, v, k32, layer):  # -> {text: q.k of its earlier keys}
        """q.k of every earlier key (one round for every text); a block's rows are queued first (its key search sees
        them), a decode step's after (its search needs only earlier rows: it waits for no write of its own)."""
        v32 = v.astype(np.float32)  # as the store holds them
        for _, s, start, rows in self.texts():
            s.keep_values(layer, start, v32[rows])
        for _, s, start, rows in self.texts(only=several):
            queue_rows(s, layer, start, k32[rows], v32[rows])
        searched = self.key_round(q, layer)
        for _, s, start, rows in self.texts(only=one):
            queue_rows(s, layer, start, k32[rows], v32[rows])
        return searched

    def attention(self, q, searched, own, layer):  # q [m, H, hd] -> [m, d]: concat_h softmax(q k^T / sqrt(hd)) v_h
        heads = np.zeros((len(q), self.hp.n_embd))
        for rows, h in self.weighted_values(searched, own, layer):  # each text's [H, m, hd]
            heads[rows] = h.transpose(1, 0, 2).reshape(rows.stop - rows.start, -1)
        return self.linear(heads, f"h.{layer}.attn.c_proj")


FiveRounds.step = FiveRoundsStep
