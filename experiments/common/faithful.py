"""The derived tolerance of a store's logits against float64 numpy, for either family: vecgpt.tolerance for GPT-2
(in the session's layout), vecgpt.llama_tolerance for the Llama family (layout five), and the rule that compares
(tolerance.disagreements): every candidate's logit within tol, no pair ranked against numpy's by over 2 tol, none
more than 2 tol below numpy's k-th."""

from __future__ import annotations

import numpy as np


def logit_tolerance(session, model64, prompt, tokens, backend: str, exact) -> np.ndarray:
    """Per step of a teacher-forced run (the prompt, then tokens[:-1] one at a time), the bound on |store logit -
    float64 numpy logit| the session's store, encoding and layout allow; exact: numpy's rows at those steps."""
    from vecgpt import llama_tolerance, tolerance

    from common.subjects import is_llama

    engine = session.engine
    u, metric = tolerance.unit_roundoff(backend), engine.metric
    bound = engine.key_bound
    padded_r2 = None if bound is None else float(max(bound)) ** 2
    if is_llama(model64):
        return llama_tolerance.logit_tolerance(model64, prompt, tokens, metric, u, padded_r2=padded_r2)
    layout = getattr(session, "layout", "four")
    return tolerance.logit_tolerance(
        model64, prompt, tokens, metric, u, np.asarray(exact), layout=layout, padded_r2=padded_r2
    )


def within(cands, exact, tol, k: int) -> dict:
    """The rule at every step: cands [(ids, logits)] against numpy's full rows exact, per-step tol."""
    from vecgpt import tolerance
    from vecgpt.sampling import Candidates

    broken = [
        f"step {i}: {d}"
        for i, ((ids, logits), row, t) in enumerate(zip(cands, exact, tol))
        for d in tolerance.disagreements(Candidates(ids, logits), np.asarray(row), k, float(t))
    ]
    errors = [
        float(np.abs(np.asarray(lg) - np.asarray(row)[np.asarray(ids)]).max()) for (ids, lg), row in zip(cands, exact)
    ]
    return {
        "tolerance_by_step": [float(t) for t in tol],
        "error_over_tolerance_max": float(max(e / t for e, t in zip(errors, tol))),
        "violations": broken[:20],
        "violation_count": len(broken),
    }
