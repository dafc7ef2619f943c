"""The residual stream, recorded: an engine Text's (`traced`) and the numpy reference's (`traced_reference`)."""

from __future__ import annotations

import numpy as np


def traced(text) -> list:
    """Make an engine Text record the residual stream: each forward appends [embedding, layer 1..L]."""
    trace: list = []
    embed, block = text._embed, text._block

    def _embed(ids, start):
        x = embed(ids, start)
        trace.append([x])
        return x

    def _block(x, layer, start):
        x = block(x, layer, start)
        trace[-1].append(x)
        return x

    text._embed, text._block = _embed, _block
    return trace


def stack_trace(trace) -> list[np.ndarray]:
    """Per layer, the residual of every position read: [positions, d]."""
    return [np.concatenate([np.asarray(fwd[i], np.float64) for fwd in trace]) for i in range(len(trace[0]))]


def traced_reference(model, dtype):
    """numpy GPT-2 (vecgpt.reference) that records the residual stream like `traced`."""
    from vecgpt.reference import Reference, layer_norm, transformer_block

    class TracedReference(Reference):
        def __init__(self):
            super().__init__(model, dtype)
            self.trace: list = []

        def logits(self, ids):  # vecgpt.reference.gpt2, keeping x after each layer
            ids, p, hp, start = np.asarray(ids, np.int64), self.params, self.hparams, self.position
            x = p["wte"]["weight"][ids] + p["wpe"]["weight"][start:start + len(ids)]
            xs = [x]
            for block, cache in zip(p["h"], self.caches):
                x = transformer_block(x, block["ln_1"], block["attn"], block["ln_2"], block["mlp"], hp.n_head, hp.eps, cache)
                xs.append(x)
            self.trace.append(xs)
            return layer_norm(x, **p["ln_f"], eps=hp.eps) @ p["wte"]["weight"].T

    return TracedReference()


class NumpyReader:
    """The traced numpy reference as a reader (read(ids, k) -> Candidates), for float32."""

    def __init__(self, model, dtype):
        self.ref = traced_reference(model, dtype)

    def read(self, ids, k):
        from vecgpt.sampling import top_k

        return top_k(self.ref.logits(ids)[-1].astype(np.float64), k)
