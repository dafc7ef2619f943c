"""Experiment 1: does every store give the same answer, and how close to numpy is it?

For each prompt the float64 numpy reference picks N greedy tokens. Every subject (each configured
store, in each encoding it offers, and numpy in float32) then reads the same tokens (teacher
forcing), so every step compares the same context: up to the first divergence this is exactly a
free greedy run, and after it the errors still compare like with like. Per subject:

- greedy steps identical to the float64 reference until the first divergence, and whether the
  divergence happened at a near tie: the reference's top-2 gap at that step is below
  max(2 x the subject's typical logit error, 1e-3), the typical error being the median over the
  prompt's steps of the largest top-40 error at each step (`near_tie`, `typical_error`);
- overlap of the top-40 token sets at each step (`topk_overlap`);
- max and mean absolute error of the subject's top-40 logits against float64 numpy (`logit_error`);
- the residual stream's error after the embedding (layer 0) and after each layer (`residual_error`);
- for a store, the derived tolerance at each step (vecgpt.tolerance for GPT-2, vecgpt.llama_tolerance for the Llama
  family) and whether its candidates keep the rule (`common.faithful`): the largest error over tol, rules broken.

A Llama-family model (`--model shakespeare-llama`, any Llama folder) runs the same way: its numpy side is
vecgpt.reference_llama, its stores in layout five.

What the experiments share (models, store variants, traces, plots) is in experiments/common/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common/

import numpy as np  # noqa: E402

from common.plots import log_error_plot
from common.subjects import (  # noqa: F401
    GPT2_SMALL,
    add_common_arguments,
    codec,
    describe_variant,
    load_model,
    model_label,
    model_slug,
    open_engine,
    variants,
)
from common.tracing import NumpyReader, stack_trace, traced, traced_reference

NAME = "agreement"
HELP = "greedy tokens, top-40 sets, logit and per-layer errors of every store against numpy float64"
DEFAULT_PROMPTS = [
    "ROMEO:",
    "The history of the vector database begins",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
]
TIE_FACTOR, TIE_FLOOR = 2.0, 1e-3


# ---------------------------------------------------------------- metric functions (pure)


def first_divergence(tokens, ref_tokens) -> int | None:
    """The first step where the tokens differ from the reference's, or None if they agree throughout."""
    for i, (a, b) in enumerate(zip(tokens, ref_tokens)):
        if int(a) != int(b):
            return i
    return None


def top2_gap(logits) -> float:
    """Best logit minus the second best of a full vocabulary row."""
    top = np.partition(np.asarray(logits, np.float64), -2)[-2:]
    return float(top[1] - top[0])


def tie_threshold(logit_error: float, factor: float = TIE_FACTOR, floor: float = TIE_FLOOR) -> float:
    """A gap below this can be flipped by errors of logit_error on both logits (or is below the floor)."""
    return max(factor * float(logit_error), floor)


def near_tie(gap: float, logit_error: float, factor: float = TIE_FACTOR, floor: float = TIE_FLOOR) -> bool:
    return float(gap) < tie_threshold(logit_error, factor, floor)


def typical_error(max_error_by_step) -> float:
    """The subject's usual logit error: the median over steps of the largest top-k error at each step.
    (Not the error at the divergence step alone: if both flipped tokens are among the candidates,
    that error is at least half the gap by construction, so every divergence would look like a tie.)"""
    return float(np.median(max_error_by_step)) if len(max_error_by_step) else 0.0


def topk_overlap(ids, ref_ids) -> float:
    """Share of the reference's top-k set that the other top-k set holds."""
    ref = {int(i) for i in ref_ids}
    return len(ref & {int(i) for i in ids}) / len(ref) if ref else 1.0


def logit_errors(ids, logits, ref_logits) -> np.ndarray:
    """|logit - reference| for the candidate tokens ids, against a full reference row."""
    return np.abs(np.asarray(logits, np.float64) - np.asarray(ref_logits, np.float64)[np.asarray(ids, np.int64)])


def logit_error(ids, logits, ref_logits) -> dict:
    e = logit_errors(ids, logits, ref_logits)
    return {"max": float(e.max()) if e.size else 0.0, "mean": float(e.mean()) if e.size else 0.0}


def residual_error(layers, ref_layers) -> list[dict]:
    """Per layer ([positions, d] arrays): max absolute error and relative error |x - ref| / |ref|."""
    out = []
    for x, r in zip(layers, ref_layers):
        d = np.asarray(x, np.float64) - np.asarray(r, np.float64)
        norm = float(np.linalg.norm(r))
        out.append(
            {
                "max_abs": float(np.abs(d).max()) if d.size else 0.0,
                "relative": float(np.linalg.norm(d)) / norm if norm else 0.0,
            }
        )
    return out


# ---------------------------------------------------------------- the experiment


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, NAME)
    p.add_argument("--prompts", nargs="+", default=DEFAULT_PROMPTS)
    p.add_argument("-n", type=int, default=16, help="greedy steps per prompt")
    p.add_argument("--top-k", type=int, default=40, help="candidate set compared at each step")


def reference_run(model64, ids, n, k):
    """The float64 reference's greedy tokens, full logits and residual stream."""
    from vecgpt.sampling import top_k

    ref = traced_reference(model64, np.float64)
    rows, tokens, feed = [], [], list(ids)
    for _ in range(n):
        row = ref.logits(feed)[-1]
        rows.append(row)
        tokens.append(int(top_k(row, k).ids[0]))
        feed = [tokens[-1]]
    return {"tokens": tokens, "logits": rows, "residual": stack_trace(ref.trace)}


def forced_run(reader, ids, ref_tokens, k):
    """Read the prompt then the reference's tokens; the reader's candidates at every step."""
    cands, feed = [], list(ids)
    for step, token in enumerate(ref_tokens):
        if step and hasattr(reader, "meter"):
            reader.meter.start_token()
        c = reader.read(feed, k)
        cands.append((np.asarray(c.ids), np.asarray(c.logits, np.float64)))
        feed = [token]
    return cands


def score(cands, residual, ref, k) -> dict:
    """Every metric of one subject on one prompt against the float64 reference run."""
    from vecgpt.sampling import top_k

    own = [int(c[0][0]) for c in cands]
    div = first_divergence(own, ref["tokens"])
    errs = [logit_errors(i, l, r) for (i, l), r in zip(cands, ref["logits"])]
    ref_ids = [top_k(r, k).ids for r in ref["logits"]]
    overlap = [topk_overlap(i, r) for (i, _), r in zip(cands, ref_ids)]
    missing = [[rank for rank, t in enumerate(r, 1) if t not in set(i.tolist())] for (i, _), r in zip(cands, ref_ids)]
    out = {
        "own_tokens": own,
        "ref_tokens": ref["tokens"],
        "identical_steps": len(own) if div is None else div,
        "first_divergence": div,
        "agreeing_steps": sum(a == b for a, b in zip(own, ref["tokens"])),
        "topk_overlap": overlap,
        "missing_reference_ranks": missing,
        "logit_error_max_by_step": [float(e.max()) for e in errs],
        "logit_error_mean_by_step": [float(e.mean()) for e in errs],
        "logit_error_max": float(max(e.max() for e in errs)),
        "logit_error_mean": float(np.mean(np.concatenate(errs))),
        "residual_error": residual_error(residual, ref["residual"]),
    }
    if div is not None:
        gap, err = top2_gap(ref["logits"][div]), typical_error(out["logit_error_max_by_step"])
        out["divergence"] = {
            "step": div,
            "reference_top2_gap": gap,
            "typical_logit_error": err,
            "logit_error_at_step": float(errs[div].max()),
            "threshold": tie_threshold(err),
            "near_tie": near_tie(gap, err),
            "reference_token": ref["tokens"][div],
            "token": own[div],
        }
    return out


def summarize_subject(label, metric, per_prompt, n_layer) -> dict:
    divs = [p["divergence"] for p in per_prompt if "divergence" in p]
    res = [[p["residual_error"][layer] for p in per_prompt] for layer in range(n_layer + 1)]
    return {
        "subject": label,
        "metric": metric,
        "identical_steps": [p["identical_steps"] for p in per_prompt],
        "divergences": len(divs),
        "near_ties": sum(d["near_tie"] for d in divs),
        "topk_overlap_mean": float(np.mean([o for p in per_prompt for o in p["topk_overlap"]])),
        "topk_overlap_min": float(min(o for p in per_prompt for o in p["topk_overlap"])),
        "logit_error_max": max(p["logit_error_max"] for p in per_prompt),
        "logit_error_mean": float(np.mean([p["logit_error_mean"] for p in per_prompt])),
        "residual_max_abs_by_layer": [max(r["max_abs"] for r in layer) for layer in res],
        "residual_relative_by_layer": [max(r["relative"] for r in layer) for layer in res],
        **tolerance_summary(per_prompt),
    }


def tolerance_summary(per_prompt) -> dict:
    """A store's derived tolerance over its prompts: its range, the largest error over it, the rules broken."""
    if not all("tolerance_by_step" in p for p in per_prompt):
        return {}
    tol = [t for p in per_prompt for t in p["tolerance_by_step"]]
    return {
        "tolerance_min": min(tol),
        "tolerance_max": max(tol),
        "error_over_tolerance_max": max(p["error_over_tolerance_max"] for p in per_prompt),
        "violation_count": sum(p["violation_count"] for p in per_prompt),
    }


def table_rows(summaries, n) -> list[dict]:
    return [
        {
            "subject": s["subject"],
            f"identical steps (of {n}) per prompt": ", ".join(map(str, s["identical_steps"])),
            "divergences (near ties)": f"{s['divergences']} ({s['near_ties']})",
            "top-k overlap mean / min": f"{s['topk_overlap_mean']:.3f} / {s['topk_overlap_min']:.3f}",
            "logit err max": f"{s['logit_error_max']:.2e}",
            "logit err mean": f"{s['logit_error_mean']:.2e}",
            "residual err, last layer (max abs / rel)": f"{s['residual_max_abs_by_layer'][-1]:.2e} / {s['residual_relative_by_layer'][-1]:.2e}",
            "derived tol / max err over tol (rules broken)": "-"
            if "tolerance_max" not in s
            else f"{s['tolerance_min']:.1e}..{s['tolerance_max']:.1e} / {s['error_over_tolerance_max']:.3f} "
            f"({s['violation_count']})",
        }
        for s in summaries
    ]


def plot(summaries, path: Path, title: str) -> Path:
    curves = [
        (s["subject"], np.arange(len(s["residual_max_abs_by_layer"])), s["residual_max_abs_by_layer"])
        for s in summaries
    ]
    return log_error_plot(curves, path, "layer (0 = embedding)", "max |residual - float64 numpy|", title)


def run(args) -> int:
    from common.record import new_run

    model, model64 = load_model(args.model), load_model(args.model, np.float64)
    prompts = checked_prompts(args, model)
    vs = variants(args.configs, args.store_root, not args.no_swap)
    out = new_run(NAME, args.out)
    refs = [reference_run(model64, ids, args.n, args.top_k) for _, ids in prompts]
    subjects = [("numpy (float32)", "-", numpy_subject(model, prompts, refs, args.top_k))]
    for v in vs:
        subjects.append((v.label, v.config.metric, store_subject(v, (model, model64), prompts, refs, args)))
    write(out, args, model, vs, prompts, refs, subjects)
    return 0


def checked_prompts(args, model) -> list[tuple[str, list[int]]]:
    from vecgpt.api import check_request
    from vecgpt.errors import VecgptError

    if args.n < 1:
        raise VecgptError(f"-n must be at least 1, not {args.n}")
    prompts = [(p, codec(model).encode(p)) for p in args.prompts]
    for p, ids in prompts:
        if not ids:
            raise VecgptError(f"prompt {p!r} has no tokens")
        check_request(model.hparams, ids, args.n, args.top_k)
    return prompts


def numpy_subject(model, prompts, refs, k) -> list[dict]:
    """numpy in float32, teacher-forced along each reference run."""
    scores = []
    for (_, ids), ref in zip(prompts, refs):
        reader = NumpyReader(model, np.float32)
        scores.append(score(forced_run(reader, ids, ref["tokens"], k), stack_trace(reader.ref.trace), ref, k))
    return scores


def store_subject(v, models, prompts, refs, args) -> list[dict]:
    """One store variant, teacher-forced along each reference run, one decoding session per prompt; each step held
    to the derived tolerance (common.faithful)."""
    from common.faithful import logit_tolerance, within

    (model, model64), k = models, args.top_k
    engine = open_engine(v, model, progress=not args.quiet)
    print(f"{v.label} [{v.config_path}{', ' + v.note if v.note else ''}]", file=sys.stderr)
    scores, t = [], time.perf_counter()
    for (_, ids), ref in zip(prompts, refs):
        session = engine.open()
        trace = traced(session)
        try:
            cands = forced_run(session, ids, ref["tokens"], k)
            tol = logit_tolerance(session, model64, ids, ref["tokens"], v.config.backend, ref["logits"])
            scores.append({**score(cands, stack_trace(trace), ref, k), **within(cands, ref["logits"], tol, k)})
        finally:
            session.close()
    v.stats["run_s"] = time.perf_counter() - t
    engine.store.close()
    return scores


def write(out, args, model, vs, prompts, refs, subjects) -> None:
    """agreement.json, .md and .png in out; the table on stdout."""
    from common.record import markdown_table, provenance, publish

    n, k = args.n, args.top_k
    summaries = [summarize_subject(label, metric, pp, model.hparams.n_layer) for label, metric, pp in subjects]
    rows, what = table_rows(summaries, n), model_label(model, args.model)
    near_tie = (
        f"reference top-2 gap at the divergence < max({TIE_FACTOR} x the subject's typical logit error "
        f"(median over the prompt's steps of the largest top-k error), {TIE_FLOOR})"
    )
    data = {
        "experiment": NAME,
        "provenance": provenance(seed=args.seed, model=model, model_name=args.model),
        "settings": {"prompts": args.prompts, "n": n, "top_k": k, "near_tie": near_tie, "teacher_forced": True},
        "variants": [{**describe_variant(v), **v.stats} for v in vs],
        "prompts": [
            {
                "prompt": p,
                "ids": ids,
                "reference_tokens": r["tokens"],
                "reference_text": codec(model).decode(r["tokens"]),
                "reference_top2_gap_by_step": [top2_gap(row) for row in r["logits"]],
            }
            for (p, ids), r in zip(prompts, refs)
        ],
        "summary": summaries,
        "per_prompt": {label: pp for label, _, pp in subjects},
        "table": rows,
    }
    header = (
        f"Agreement with numpy float64, {len(prompts)} prompts x {n} greedy steps (teacher-forced), "
        f"top-{k}; model {what}\n\n"
    )
    publish(
        out,
        "agreement",
        data,
        header + markdown_table(rows),
        lambda path: plot(summaries, path, f"residual stream error per layer\n{what}"),
    )


if __name__ == "__main__":
    import common

    sys.exit(common.main(sys.modules[__name__]))
