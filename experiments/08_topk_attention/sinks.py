"""Are a model's first positions attention sinks? Under full attention (measure.full_attention's weights), the
share of each query head's weight on positions 0..S-1, by layer and head, at each context's steps, beside what a
uniform spread over the query's keys would put there (S / (position + 1)): a sink head holds many times that."""

from __future__ import annotations

import numpy as np

SINK_POSITIONS = 4  # S: positions 0..S-1 (the policies' sinks)


def sink_weights(full, steps, sinks: int = SINK_POSITIONS) -> dict:
    """Per context: the mean weight [L][H] on positions 0..sinks-1 and on position 0 alone, uniform's share, and
    the ratio of each head's to it."""
    out = {}
    for c in steps.contexts:
        at = steps.at(c)
        first = np.stack([w[:, :, at, :sinks].sum(-1).mean(axis=(0, 2)) for w in full["weights"]])  # [L, H]
        zero = np.stack([w[:, :, at, 0].mean(axis=(0, 2)) for w in full["weights"]])
        uniform = float(np.mean(np.minimum(sinks, steps.positions[at] + 1) / (steps.positions[at] + 1)))
        out[str(c)] = {
            "sinks": sinks,
            "weight": first.round(6).tolist(),
            "weight_position_0": zero.round(6).tolist(),
            "uniform": uniform,
            "over_uniform": (first / uniform).round(3).tolist(),
            "mean": float(first.mean()),
            "max_head": float(first.max()),
            "heads_over_10x": int((first > 10 * uniform).sum()),
            "heads_over_half": int((first > 0.5).sum()),
        }
    return out
