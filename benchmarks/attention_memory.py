"""Time and peak memory of full-table vs streaming attention against context length.

One causal prefill (query block = context) per context length, all heads at once.
Forms: full table (numpy), streaming (numpy) at each --tiles, and the fused numba loop
(if numba is installed).  Time: best of --repeat runs without tracing.  Peak: one run under
tracemalloc, bytes allocated beyond the inputs (numba's own buffers are not traced: the fused
form's figure is its output plus, per thread, one tile of scores).

    OPENBLAS_NUM_THREADS is set to --blas-threads (default 1) before numpy loads: on this
    shared 2-core VM threaded OpenBLAS makes the small per-tile products ~50x slower.

Writes benchmarks/results/attention_memory.json and attention_memory.png; prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--tiles", type=int, nargs="+", default=[8, 64, 256])
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--blas-threads", type=int, default=1)
    p.add_argument("--numba-threads", type=int, default=1)
    p.add_argument("--no-numba", action="store_true")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(args.blas_threads)
    os.environ["NUMBA_NUM_THREADS"] = str(args.numba_threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import numpy as np

    from vecgpt import attention as att

    forms = [("full", None)] + [("streaming", t) for t in args.tiles]
    if att.HAVE_NUMBA and not args.no_numba:
        att.measure("fused", 1, 16, 8, 16, 8, "float64", trace=False)  # compile once, outside timing
        att.measure("fused", 1, 16, 8, 16, 8, "float32", trace=False)
        forms += [("fused", t) for t in args.tiles[:2]]
    rows = []
    print(f"{'context':>8} {'form':>10} {'tile':>5} {'seconds':>9} {'peak (traced)':>14} {'predicted peak':>15}")
    for n in args.contexts:
        for form, tile in forms:
            shape = (args.heads, n, args.head_dim, n, tile or att.DEFAULT_TILE, args.dtype)
            secs = min(att.measure(form, *shape, trace=False)["seconds"] for _ in range(args.repeat))
            peak = att.measure(form, *shape)["peak"]
            mb = att.memory_bytes(*shape)
            pred = {"full": mb["peak_full"], "streaming": mb["peak_streaming"], "fused": mb["output"]}[form]
            rows.append(
                dict(
                    context=n,
                    form=form,
                    tile=tile,
                    seconds=secs,
                    peak=peak,
                    predicted_peak=pred,
                    full_table=mb["full"],
                    streaming_working_set=mb["streaming"],
                )
            )
            print(f"{n:>8} {form:>10} {tile or '-':>5} {secs:>9.4f} {peak:>14,} {pred:>15,}", flush=True)
    meta = dict(
        vars(args),
        machine=platform.machine(),
        cpus=os.cpu_count(),
        python=platform.python_version(),
        numpy=np.__version__,
        numba=att.numba.__version__ if att.HAVE_NUMBA else None,
        causal=True,
        query_block="context (prefill)",
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention_memory.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    plot(rows, out / "attention_memory.png", args)
    print(f"wrote {out / 'attention_memory.json'} and {out / 'attention_memory.png'}")
    return 0


def plot(rows, path, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key in dict.fromkeys((r["form"], r["tile"]) for r in rows):
        sel = [r for r in rows if (r["form"], r["tile"]) == key]
        label = key[0] if key[1] is None else f"{key[0]} (tile {key[1]})"
        ctx = [r["context"] for r in sel]
        ax_t.plot(ctx, [r["seconds"] for r in sel], "o-", label=label)
        ax_m.plot(ctx, [r["peak"] for r in sel], "o-", label=label)
    for ax, title in ((ax_t, "time (s)"), (ax_m, "peak bytes beyond inputs (tracemalloc)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (causal prefill)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"attention, {args.heads} head(s), head dim {args.head_dim}, {args.dtype}, BLAS threads {args.blas_threads}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
