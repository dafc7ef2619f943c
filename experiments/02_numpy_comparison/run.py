"""Experiment 2: the puffergpt write-up's comparison, per store.

A ten-token prompt goes through each store and through numpy (float64, and float32 for scale);
the 40 scores after it are shown side by side, keyed by numpy float64's ranking. Then both
generate greedily, each on its own (no teacher forcing); the write-up reports the first eight
tokens identical either way. Per store: whether the first eight are identical, and for how many
of the n steps identity holds, and how long a token takes: each subject's reads are timed (the prompt's apart; ms a
token: the median over the generated tokens' reads), against numpy float32's in the same process.

A Llama-family model (`--model shakespeare-llama`, any Llama folder) runs the same way: numpy is
vecgpt.reference_llama, its stores run layout five.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common/

import numpy as np  # noqa: E402

from common.plots import log_error_plot
from common.subjects import (
    add_common_arguments,
    codec,
    describe_variant,
    load_model,
    model_label,
    open_engine,
    reference,
    variants,
)
from common.tracing import NumpyReader

NAME = "numpy-comparison"
HELP = "a ten-token prompt: the 40 scores through each store and numpy, then greedy tokens either way"
DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog."  # ten GPT-2 tokens
WRITEUP_IDENTICAL = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, NAME)
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("-n", type=int, default=32, help="greedy tokens generated either way")
    p.add_argument("--top-k", type=int, default=40)


class Timed:
    """A reader whose reads are timed (seconds, in order); everything else is the reader's (its meter, if any)."""

    def __init__(self, reader):
        self.reader, self.seconds = reader, []

    def __getattr__(self, name):
        return getattr(self.reader, name)

    def read(self, ids, k):
        t = time.perf_counter()
        cands = self.reader.read(ids, k)
        self.seconds.append(time.perf_counter() - t)
        return cands


def timing(seconds) -> dict:
    """A run's reads: the prompt's, then ms a token (the median over the generated tokens' reads)."""
    after = seconds[1:]
    return {
        "prompt_read_ms": 1000 * seconds[0],
        "ms_per_token": 1000 * float(np.median(after)) if after else None,
        "read_ms": [1000 * t for t in seconds],
    }


def identical_prefix(a, b) -> int:
    """How many leading tokens two generations share."""
    n = 0
    for x, y in zip(a, b):
        if int(x) != int(y):
            break
        n += 1
    return n


def side_by_side(ref_cands, subjects: dict) -> list[dict]:
    """One row per numpy-float64 candidate: its score through every subject (None if outside its top-k)."""
    rows = []
    for rank, (tok, ref) in enumerate(ref_cands, 1):
        row = {"rank": rank, "token": int(tok), "numpy float64": float(ref)}
        for label, cands in subjects.items():
            found = {int(t): (i + 1, float(x)) for i, (t, x) in enumerate(cands)}.get(int(tok))
            row[label] = None if found is None else found[1]
            row[f"{label} rank"] = None if found is None else found[0]
        rows.append(row)
    return rows


def summary_row(label, metric, cands, ref_full, tokens, ref_tokens, timed=None) -> dict:
    ids = np.array([int(t) for t, _ in cands])
    err = np.abs(np.array([x for _, x in cands]) - ref_full[ids])
    ref_ids = [int(t) for t, _ in ref_top(ref_full, len(ids))]
    same = identical_prefix(tokens, ref_tokens)
    return {
        "subject": label,
        "metric": metric,
        "max_abs_error": float(err.max()),
        "mean_abs_error": float(err.mean()),
        "same_top_set": set(ids.tolist()) == set(ref_ids),
        "same_order": ids.tolist() == ref_ids,
        f"first_{WRITEUP_IDENTICAL}_identical": same >= min(WRITEUP_IDENTICAL, len(ref_tokens)),
        "identical_steps": same,
        "steps": len(ref_tokens),
        "tokens": [int(t) for t in tokens],
        **(timing(timed) if timed else {}),
    }


def ref_top(full, k):
    from vecgpt.sampling import top_k

    c = top_k(full, k)
    return list(zip(c.ids.tolist(), c.logits.tolist()))


def plot(ref_cands, subjects, path: Path, title: str) -> Path:
    ref = dict((int(t), x) for t, x in ref_cands)
    curves = []
    for label, cands in subjects.items():
        e = [abs(x - ref[int(t)]) if int(t) in ref else np.nan for t, x in cands]
        curves.append((label, np.arange(1, len(e) + 1), e))
    return log_error_plot(curves, path, "rank of the candidate", "|score - numpy float64 score|", title)


def run(args) -> int:
    from vecgpt.api import check_request
    from vecgpt.errors import VecgptError

    from common.record import new_run

    model, model64 = load_model(args.model), load_model(args.model, np.float64)
    ids = codec(model).encode(args.prompt)
    if not ids or args.n < 1:
        raise VecgptError("the prompt needs tokens and -n must be at least 1")
    check_request(model.hparams, ids, args.n, args.top_k)
    out = new_run(NAME, args.out)
    ref_full = reference(model64).logits(ids)[-1]
    ref_gen, t64 = timed_run(reference(model64), ids, args)
    gen32, t32 = timed_run(NumpyReader(model, np.float32), ids, args)
    subjects = {"numpy float32": [tuple(c[:2]) for c in gen32.steps[0]["candidates"]]}
    summaries = [
        summary_row("numpy float64", "-", ref_top(ref_full, args.top_k), ref_full, ref_gen.tokens, ref_gen.tokens, t64),
        summary_row("numpy float32", "-", subjects["numpy float32"], ref_full, gen32.tokens, ref_gen.tokens, t32),
    ]
    vs = variants(args.configs, args.store_root, not args.no_swap)
    for v in vs:
        subjects[v.label], tokens, seconds = store_run(v, model, ids, args)
        summaries.append(
            summary_row(v.label, v.config.metric, subjects[v.label], ref_full, tokens, ref_gen.tokens, seconds)
        )
    write(out, args, model, vs, ids, (ref_top(ref_full, args.top_k), ref_gen), subjects, summaries)
    return 0


def timed_run(reader, ids, args):
    """A free greedy run of n tokens, each read timed: (the generation, the reads' seconds)."""
    from vecgpt.api import generate

    timed = Timed(reader)
    return generate(timed, ids, args.n, top_k=args.top_k, stop=False), timed.seconds


def store_run(v, model, ids, args) -> tuple[list, list[int], list[float]]:
    """A free greedy run through one store variant: the candidates after the prompt, the tokens, each read's
    seconds."""
    engine = open_engine(v, model, progress=not args.quiet)
    print(f"{v.label} [{v.config_path}{', ' + v.note if v.note else ''}]", file=sys.stderr)
    session = engine.open()
    try:
        gen, seconds = timed_run(session, ids, args)
    finally:
        session.close()
        engine.store.close()
    return [tuple(c[:2]) for c in gen.steps[0]["candidates"]], gen.tokens, seconds


def write(out, args, model, vs, ids, ref, subjects, summaries) -> None:
    """numpy_comparison.json, .md and .png in out; the tables on stdout."""
    from common.record import markdown_table, provenance, publish

    (ref_cands, ref_gen), n, k = ref, args.n, args.top_k
    base = next(s["ms_per_token"] for s in summaries if s["subject"] == "numpy float32")
    text = codec(model).decode(ref_gen.tokens)
    scores, what = side_by_side(ref_cands, subjects), model_label(model, args.model)
    score_rows = [
        {
            "rank": r["rank"],
            "token": r["token"],
            "text": repr(codec(model).decode([r["token"]])),
            "numpy float64": f"{r['numpy float64']:.6f}",
            **{label: ("-" if r[label] is None else f"{r[label]:.6f}") for label in subjects},
        }
        for r in scores
    ]
    rows = [
        {
            "subject": s["subject"],
            "max abs err (40 scores)": f"{s['max_abs_error']:.2e}",
            "same top-40 set / order": f"{s['same_top_set']} / {s['same_order']}",
            f"first {WRITEUP_IDENTICAL} identical": s[f"first_{WRITEUP_IDENTICAL}_identical"],
            f"identical greedy steps (of {n})": s["identical_steps"],
            "ms a token (prompt read ms)": f"{s['ms_per_token']:.2f} ({s['prompt_read_ms']:.1f})",
            "x numpy float32": f"{s['ms_per_token'] / base:.2f}",
        }
        for s in summaries
    ]
    data = {
        "experiment": NAME,
        "provenance": provenance(seed=args.seed, model=model, model_name=args.model),
        "settings": {"prompt": args.prompt, "prompt_ids": ids, "n": n, "top_k": k, "free_running": True},
        "variants": [{**describe_variant(v), **v.stats} for v in vs],
        "numpy_float64": {"candidates": ref_cands, "tokens": ref_gen.tokens, "text": text},
        "scores": scores,
        "summary": summaries,
        "table": rows,
    }
    header = f"Prompt {args.prompt!r} ({len(ids)} tokens); model {what}\n\n"
    md = (
        header + markdown_table(rows) + f"\n\nnumpy float64 greedy: {text!r}\n\nThe {k} scores after the "
        f"prompt, keyed by numpy float64's ranking ('-': outside that subject's top {k}):\n\n"
        + markdown_table(score_rows)
    )
    publish(
        out,
        "numpy_comparison",
        data,
        md,
        lambda path: plot(ref_cands, subjects, path, f"scores after the prompt vs numpy float64\n{what}"),
    )


if __name__ == "__main__":
    import common

    sys.exit(common.main(sys.modules[__name__]))
