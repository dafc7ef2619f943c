"""The residual stream, recorded: an engine Session's (`traced`) and the numpy reference's (`traced_reference`)."""

from __future__ import annotations

import numpy as np


def traced(session) -> list:
    """Make an engine Session record the residual stream: each read appends [embedding, layer 1..L]."""
    session.trace = []
    return session.trace


def stack_trace(trace) -> list[np.ndarray]:
    """Per layer, the residual of every position read: [positions, d]."""
    return [np.concatenate([np.asarray(fwd[i], np.float64) for fwd in trace]) for i in range(len(trace[0]))]


def traced_reference(model, dtype):
    """The model's numpy forward pass (vecgpt.reference, or reference_llama for a Llama) recording the residual
    stream like `traced`."""
    from common.subjects import reference

    ref = reference(model, dtype)
    ref.trace = []
    return ref


class NumpyReader:
    """The traced numpy reference as a reader (read(ids, k) -> Candidates), for float32."""

    def __init__(self, model, dtype):
        self.ref = traced_reference(model, dtype)

    def read(self, ids, k):
        from vecgpt.sampling import top_k

        return top_k(self.ref.logits(ids)[-1].astype(np.float64), k)
