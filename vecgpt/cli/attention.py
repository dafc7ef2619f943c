"""The attention subcommands: `vecgpt attention-memory` and `vecgpt softmax-walk` (numpy loads when they run)."""

from __future__ import annotations

import argparse
import math
import sys

FIT_FRACTION = 0.6  # run a size only if its predicted peak (plus inputs) is under this share of free memory


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux); 0 if unknown, so nothing is run."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory_arguments(p: argparse.ArgumentParser) -> None:
    from vecgpt import attention as att

    p.add_argument("--heads", type=_positive_int, default=12)
    p.add_argument("--context", type=_positive_int, nargs="+", default=[1024])
    p.add_argument("--head-dim", type=_positive_int, default=64)
    p.add_argument(
        "--query-block",
        type=_positive_int,
        default=None,
        help="queries per block (default: the whole context, i.e. prompt prefill; 1 = decode)",
    )
    p.add_argument("--tile", type=_positive_int, default=att.DEFAULT_TILE)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument(
        "--measure",
        action="store_true",
        help="run both forms (causal) under tracemalloc for sizes that fit in free memory",
    )


def walk_arguments(w: argparse.ArgumentParser) -> None:
    w.add_argument("scores", nargs="*", help="scores (use -- before a first score like -inf)")
    w.add_argument("--file", help="read scores from a file (whitespace or comma separated)")
    w.add_argument("--tile", type=_positive_int, default=1)


# ----------------------------------------------------------------------------- attention-memory


def memory_rows(heads, contexts, head_dim, query_block, tile, dtype):
    """One dict per context: memory_bytes plus n_query and whether it fits in free memory here."""
    import numpy as np

    from vecgpt import attention as att

    free = available_bytes()
    rows = []
    for n_ctx in contexts:
        n_q = min(query_block or n_ctx, n_ctx)
        mb = att.memory_bytes(heads, n_ctx, head_dim, n_q, tile, dtype)
        inputs = heads * (n_q + 2 * n_ctx) * head_dim * np.dtype(dtype).itemsize
        rows.append(dict(mb, n_ctx=n_ctx, n_query=n_q, fits=mb["peak_full"] + inputs < FIT_FRACTION * free))
    return rows


def run_attention_memory(args) -> int:
    rows = memory_rows(args.heads, args.context, args.head_dim, args.query_block, args.tile, args.dtype)
    print(
        f"one layer: {args.heads} heads, head dim {args.head_dim}, tile {args.tile}, {args.dtype}, "
        f"query block {'= context (prefill)' if args.query_block is None else args.query_block}"
    )
    head = f"{'context':>8} {'queries':>8} {'full table (bytes)':>30} {'streaming (bytes)':>28} {'ratio':>9} {'runs here':>9}"
    if args.measure:
        head += f" {'full peak meas/pred':>20} {'stream peak meas/pred':>22} {'full s':>8} {'stream s':>8}"
    print(head)
    for r in rows:
        line = (
            f"{r['n_ctx']:>8} {r['n_query']:>8} {r['full']:>17,} {_human(r['full']):>12}"
            f" {r['streaming']:>15,} {_human(r['streaming']):>12} {r['ratio']:>9.1f} {'yes' if r['fits'] else 'no':>9}"
        )
        if args.measure:
            line += _measured_columns(r, args) if r["fits"] else f" {'(too large to run here)':>20}"
        print(line, flush=True)
    print(
        "full = score table heads x queries x context; streaming = tile scores + running max + running total"
        " + output accumulator, per head and query."
    )
    if args.measure:
        print(
            "meas/pred: tracemalloc peak over the run / predicted peak (full: table + output;"
            " streaming: working set + the p@v product + 3 per-query vectors); inputs excluded;"
            " margin 1% + 96 KiB (numpy iterator buffers). Seconds are under tracemalloc."
        )
    return 0


def _measured_columns(r, args) -> str:
    from vecgpt import attention as att

    cols = ""
    secs = []
    for form in ("full", "streaming"):
        got = att.measure(form, args.heads, r["n_ctx"], args.head_dim, r["n_query"], args.tile, args.dtype)
        cols += f" {_human(got['peak']):>11} {got['peak'] / r['peak_' + form]:>8.4f}"
        cols += " " * (form == "streaming")
        secs.append(got["seconds"])
    return cols + f" {secs[0]:>8.2f} {secs[1]:>8.2f}"


# ----------------------------------------------------------------------------- softmax-walk


def parse_scores(tokens) -> list[float]:
    """Scores from words; ValueError (one line) for a word that is no number, +inf, NaN or all -inf."""
    scores = []
    for tok in tokens:
        try:
            x = float(tok)
        except ValueError:
            raise ValueError(f"not a number: {tok!r}") from None
        if math.isnan(x) or x == math.inf:
            raise ValueError(f"scores must be finite or -inf, got {tok!r}")
        scores.append(x)
    if not scores:
        raise ValueError("no scores given (pass them as arguments or with --file)")
    if max(scores) == -math.inf:
        raise ValueError("every score is -inf: softmax is undefined")
    return scores


def walk(scores: list[float], tile: int) -> dict:
    """`vecgpt softmax-walk`'s figures: the steps of the streaming fold, its weights and plain softmax's."""
    import numpy as np

    from vecgpt import attention as att

    steps, weights = att.softmax_walk(scores, tile)
    plain = att.softmax(np.asarray(scores, np.float64))
    return {
        "scores": scores,
        "tile": tile,
        "steps": steps,
        "weights": weights.tolist(),
        "plain": plain.tolist(),
        "max_abs_diff": float(np.abs(weights - plain).max()),
        "weights_sum": float(weights.sum()),
    }


def run_softmax_walk(args) -> int:
    try:
        tokens = list(args.scores)
        if args.file:
            with open(args.file) as f:
                tokens += f.read().replace(",", " ").split()
        scores = parse_scores(tokens)
    except (ValueError, OSError) as e:
        print(f"vecgpt softmax-walk: error: {e}", file=sys.stderr)
        return 2
    w = walk(scores, args.tile)
    print(
        f"{'step':>4} {'positions':>10} {'tile max':>12} {'running max':>12} {'rescale by':>12} {'running total':>14}"
    )
    for n, st in enumerate(w["steps"], 1):
        a, b = st["positions"]
        pos = f"{a}" if b - a == 1 else f"{a}-{b - 1}"
        rescale = "-" if st["rescale"] is None else f"{st['rescale']:.6g}"
        print(
            f"{n:>4} {pos:>10} {st['tile_max']:>12.6g} {st['running_max']:>12.6g} {rescale:>12} {st['running_total']:>14.8g}"
        )
    print(f"\n{'position':>8} {'score':>12} {'streaming weight':>18} {'plain softmax':>15}")
    for i, (s, wt, p) in enumerate(zip(scores, w["weights"], w["plain"])):
        print(f"{i:>8} {s:>12.6g} {wt:>18.10f} {p:>15.10f}")
    print(f"max |streaming - plain| = {w['max_abs_diff']:.3g}; weights sum to {w['weights_sum']:.15g}")
    return 0
