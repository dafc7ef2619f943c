"""A position read again, to look inside (the playground's token click): what attention weighed there, the residual
after each layer, and the logit lens. Nothing is written and no text changes. Both families: GPT-2's (layer norm,
the token table) and the Llama family's in layouts five and four (each query head's weights over its key head's
keys; the lens through the final RMSNorm and the output matrix, wte when tied, else lm_head)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from vecgpt import encoding
from vecgpt.backends.base import Search
from vecgpt.errors import VecgptError
from vecgpt.families import LlamaHParams, key_head
from vecgpt.meter import later
from vecgpt.reference import layer_norm
from vecgpt.reference_llama import rms_norm
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
    key_heads: list[int]  # [H]: the key head each query head reads (grouped-query attention; GPT-2: its own)


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
    return Inspection(position, token, scores, weights, residuals, lens(s, residuals), key_heads(s.engine.hparams))


def key_heads(hp) -> list[int]:
    n_kv = getattr(hp, "n_kv_head", hp.n_head)
    return [key_head(h, hp.n_head, n_kv) for h in range(hp.n_head)]


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
    """Each residual [L, d] through the final norm, then a top-k search of the output matrix (as the text's token
    search, a row at a time, so the last layer's is bit for bit the text's own): L searches in one round."""
    engine, hp = s.engine, s.engine.hparams
    output = "lm_head" if isinstance(hp, LlamaHParams) and not hp.tied else "wte"
    m2, name, ln_f = engine.m2[output], engine.name(output), engine.layer_norms()[1]
    if isinstance(hp, LlamaHParams):  # its engine holds the final RMSNorm's weight (llama_rounds.norms)
        rows = [rms_norm(r[None], ln_f["weight"], hp.eps) for r in residuals]
    else:
        rows = [layer_norm(r[None], **ln_f, eps=hp.eps) for r in residuals]
    qs = [encoding.encode_queries(h, s.metric, m2) for h in rows]
    (found,) = s.send(later.search_many([Search(name, q, k=k) for q in qs]))
    return [ordered(hits.ids[0], encoding.decode_dists(hits.dists, q, m2, s.metric)[0]) for q, hits in zip(qs, found)]
