"""A position read again, to look inside (the playground's token click): what attention weighed there, the residual
after each layer, and the logit lens. Nothing is written and no text changes."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from vecgpt import encoding
from vecgpt.backends.base import Search
from vecgpt.errors import VecgptError
from vecgpt.meter import later
from vecgpt.reference import layer_norm
from vecgpt.sampling import Candidates, ordered
from vecgpt.session import Read

LENS_K = 5  # the logit lens's tokens a layer


class Inspection(NamedTuple):
    """What reading one position again computed: attention's q.k and weights as the text's own read had them, the
    residual after each layer, and the logit lens."""

    position: int
    token: int
    scores: np.ndarray  # [L, H, position + 1]: q.k of each key up to the position (before the 1/sqrt(hd))
    weights: np.ndarray  # [L, H, position + 1]: softmax(q.k / sqrt(hd)), each head's summing to 1
    residuals: np.ndarray  # [L, d]: the residual stream after each layer
    lens: list[Candidates]  # per layer: the top LENS_K tokens of ln_f(residual) @ wte.T, each a top-k search


def inspect(s, position: int, token: int) -> Inspection:
    """Read `token` at `position` again as a decode step reads it, every layer's searches sent, writing nothing:
    its scores of the keys before it come from the store's key search, its own from memory, as in the first read
    (which key is scored where depends on positions alone), so the weights are the ones the text used. Then the
    logit lens: one round of a top-LENS_K token search per layer."""
    check_inspectable(s, position)
    kept = s.projected[:, :, position].copy(), s.key_norms[:, :, position].copy()
    if any(s.meter.current["rounds"].values()):  # the inspection's requests make a meter entry of their own
        s.meter.start_token()
    s.capture = []
    try:
        residuals = read_again(s, position, token)
        captured = s.capture
    finally:  # a re-read overwrites the position's kept value and key norm: the same bits, or a later read's
        s.capture = None
        s.projected[:, :, position], s.key_norms[:, :, position] = kept
    scores, weights = (np.stack([pair[i][:, 0] for pair in captured]) for i in (0, 1))
    return Inspection(position, token, scores, weights, residuals, lens(s, residuals))


def check_inspectable(s, position: int) -> None:
    """A position the session has read up to: the keys before it are in the store (or queued for it)."""
    if not 0 <= position <= min(s.position, s.hp.n_ctx - 1):
        raise VecgptError(
            f"position {position} cannot be inspected: positions 0 to {s.position} can (read the text first)"
        )
    s.check_written(position)


def read_again(s, position: int, token: int) -> np.ndarray:  # -> the residual after each layer [L, d]
    step = s.step([Read(s, [token], None, position)], again=True)
    (out,) = step.run()
    if isinstance(out, BaseException):
        raise out
    return step.residuals[0]


def lens(s, residuals: np.ndarray, k: int = LENS_K) -> list[Candidates]:
    """Each residual [L, d] through ln_f, then a top-k search of the token table (gpt2's, a row at a time, so the
    last layer's is bit for bit the text's own token search): L searches in one round."""
    engine = s.engine
    m2, name, ln_f = engine.m2["wte"], engine.name("wte"), engine.layer_norms()[1]
    rows = [layer_norm(r[None], **ln_f, eps=s.hp.eps) for r in residuals]
    qs = [encoding.encode_queries(h, s.metric, m2) for h in rows]
    (found,) = s.send(later.search_many([Search(name, q, k=k) for q in qs]))
    return [ordered(hits.ids[0], encoding.decode_dists(hits.dists, q, m2, s.metric)[0]) for q, hits in zip(qs, found)]
