"""README's speed table in one command: every store against numpy float32 in the same run.

    python benchmarks/speed_table.py [--stores CONFIG ...] [-n 16] [--repeat 1]
                                     [--threads 2] [--latency-ms 25] [--model DIR] [--out benchmarks/results/speed]
                                     [--layout four|three|five ...] [--settle 20]

--stores names configs/<name>.toml, a row each (default: every config there, by name). Random weights at GPT-2
small shape unless --model. Each store is emptied first in a place of its own
(a temporary folder, schema vecgpt_speed_<store>, or a private local turbopuffer server), so the load
time is a real load and a user's default stores are not touched. After a ten-token prompt, n greedy
tokens are timed per store (median), and numpy's n tokens just before each store's: a row's ratio is against
that, numpy's row the median of its timings. --repeat k runs the whole set k times and gives each figure as
the median of the k runs (ratios taken within each run, so a busy stretch slows numpy and the store alike).
Before each row it waits, up to --settle seconds (20), for the machine to be quiet (under a tenth of its CPU in use for
half a second): what a row before left running (PostgreSQL's checkpoint, a server's shutdown) is not charged to the next.
turbopuffer runs through the official client against the local server with a fixed simulated latency
per request. --layout loads the model in each layout given into the embedded stores, a row each (default: each
config's layout; turbopuffer keeps its config's); the table states each row's layout. Writes speed.json (rows plus machine, CPU, threads, BLAS, versions, commit, date),
speed.md (every column), readme.md (README's table) and speed.png; progress goes to stderr. --render writes the
tables and plot again from speed.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import machine, pin_threads, settle, shape  # noqa: E402

pin_threads(sys.argv)

import numpy as np  # noqa: E402
import per_token  # noqa: E402
import round_trips  # noqa: E402

from vecgpt import tokenizer  # noqa: E402
from vecgpt.config import LAYOUTS, load_config  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
STORES = sorted(p.stem for p in CONFIGS.glob("*.toml"))  # every shipped config, a row each


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", nargs="+", default=STORES, choices=STORES, help="configs/<store>.toml each")
    parser.add_argument("--model", default=None, help="model folder (default: random GPT-2 small shape)")
    parser.add_argument("-n", type=int, default=16, help="generated tokens timed per store")
    parser.add_argument("--threads", type=int, default=2, help="BLAS/OpenMP threads (pinned before numpy loads)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the whole set; each figure is their median")
    parser.add_argument(
        "--latency-ms", type=float, default=25.0, help="turbopuffer: the local server's delay a request"
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        nargs="+",
        default=[None],
        help="the model's layouts in the embedded stores, a row each (default: each config's)",
    )
    parser.add_argument("--settle", type=float, default=20.0, help="most seconds to wait for a quiet machine a row")
    parser.add_argument("--out", default="benchmarks/results/speed", help="folder for speed.json, .md and .png")
    parser.add_argument(
        "--render", action="store_true", help="measure nothing: write the tables and plot of --out's speed.json"
    )
    return parser.parse_args(argv)


def progress(msg: str) -> None:
    print(f"speed_table: {msg}", file=sys.stderr, flush=True)


def embedded_row(name: str, model, ids, args, root: str, layout: str | None) -> dict:
    config = load_config(CONFIGS / f"{name}.toml")
    per_token.place(config, f"speed_{name.replace('-', '_')}", root)
    progress(f"{name}: loading into {config.store} in layout {layout or config.layout}, timing {args.n} tokens")
    row = per_token.store_row(model, ids, config, args.n, fresh=True, keep=False, layout=layout)
    return {**row, "config": f"configs/{name}.toml"}


def turbopuffer_row(model, args) -> dict:
    progress(f"turbopuffer: local server at {args.latency_ms:g} ms a request, loading and timing {args.n} tokens")
    layout = load_config(CONFIGS / "turbopuffer.toml").layout
    tp_args = argparse.Namespace(
        n=args.n,
        latency_ms=args.latency_ms,
        replicas=2,
        key_replicas=2,
        key_partition="head",
        layouts=False,
        layout=layout,
    )
    r = round_trips.measure(
        model, tp_args, prefix="speed-", max_retries=3
    )  # a dropped connection is retried, not fatal
    t = r["per_token"]
    return {
        "store": f"turbopuffer (l2, local server, {args.latency_ms:g} ms a request)",
        "layout": layout,
        "config": "configs/turbopuffer.toml",
        "prompt_s": r["prompt"]["seconds"],
        "per_token_s": t["seconds"],
        "client_cpu_per_token_s": t["client_cpu_seconds"],  # the server runs in a process of its own
        "load_s": r["load"]["seconds"],
        "requests_per_token": t["requests"],
        "round_trips_per_token": t["round_trips"],
        "subqueries_per_token": t["subqueries"],
        "by_kind_per_token": t["by_kind"],
        "dollars_per_token": t["dollars"],
        "prompt_round_trips": r["prompt"]["round_trips"],
        "prompt_dollars": r["prompt"]["dollars"],
        "stored_documents": r["stored_model"]["documents"],
        "stored_bytes": r["stored_model"]["bytes"],
        "stored_dollars_per_month": r["stored_model"]["dollars_per_month"],
        "load_dollars": r["load"]["dollars"],
        "turbopuffer": {k: r[k] for k in ("latency_ms", "replicas", "key_replicas", "key_partition")},
    }


def measure_once(model, ids, args) -> list[dict]:
    """numpy's row, then a row per store and layout, each with numpy timed again just before it: its ratio is
    against that (the machine this runs on drifts by a third from one minute to the next)."""
    progress(f"numpy reference (float32): {len(ids)}-token prompt, {args.n} tokens, again before each store")
    rows, numpy_s = [per_token.reference_row(model, ids, args.n)], []
    hf = per_token.transformers_row(model.source, ids, args.n, args.threads)
    if hf is not None:  # the row each store's "x transformers" is against
        rows.append({**hf, "ratio": hf["per_token_s"] / rows[0]["per_token_s"]})
    root = tempfile.mkdtemp(prefix="vecgpt-speed-")
    try:
        for name in args.stores:
            for layout in [None] if name == "turbopuffer" else args.layout:
                waited = settle(args.settle)
                if waited > 2:
                    progress(f"waited {waited:.1f} s for the machine to be quiet")
                numpy_s.append(per_token.reference_row(model, ids, args.n)["per_token_s"])
                rows.append(
                    turbopuffer_row(model, args)
                    if name == "turbopuffer"
                    else embedded_row(name, model, ids, args, root, layout)
                )
                rows[-1].update(numpy_per_token_s=numpy_s[-1], ratio=rows[-1]["per_token_s"] / numpy_s[-1])
                if hf is not None:
                    rows[-1]["vs_transformers"] = rows[-1]["per_token_s"] / hf["per_token_s"]
                rows[-1]["settled_s"] = waited
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows[0].update(per_token_s=float(np.median([rows[0]["per_token_s"], *numpy_s])), numpy_runs=numpy_s)
    return rows


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """Each row of the first run with its timings replaced by their median over runs (each run's kept)."""
    rows = []
    for i, row in enumerate(runs[0]):
        row = dict(row)
        for key in ("per_token_s", "prompt_s", "load_s", "ratio", "numpy_per_token_s", "vs_transformers"):
            if key in row:
                row[f"{key}_runs"] = [run[i][key] for run in runs]
                row[key] = float(np.median(row[f"{key}_runs"]))
        rows.append(row)
    return rows


def measure(args) -> dict:
    stated = machine(args.threads)  # before the run: the commit measured, the date it began
    model = per_token.load_model(args.model)
    ids = tokenizer.encode(round_trips.PROMPT)
    runs = []
    for k in range(args.repeat):
        progress(f"run {k + 1} of {args.repeat}")
        runs.append(measure_once(model, ids, args))
    return {
        "command": "python benchmarks/speed_table.py " + " ".join(sys.argv[1:]),
        "model": model.source,
        "shape": shape(model.hparams),
        "prompt_tokens": len(ids),
        "n": args.n,
        "repeat": args.repeat,
        "machine": stated,
        "rows": median_rows(runs),
    }


def runs_note(result) -> str:
    return (
        f", then the median of {result['repeat']} runs (ratios taken within each run)" if result["repeat"] > 1 else ""
    )


def cell_ratio(r: float) -> str:
    return f"{r:.2f}" if r < 10 else f"{r:.1f}"


def markdown(result) -> str:
    m = result["machine"]
    lines = [
        f"Per generated token after a {result['prompt_tokens']}-token prompt, median of {result['n']} tokens{runs_note(result)}; "
        "× numpy: against numpy's tokens timed just before the row's; × transformers: against Hugging Face "
        "transformers' (torch, KV cache, the same threads) timed once a run; "
        f"{result['shape']}; {m['cpu']}, {m['cores']} cores, {m['threads']} threads, {m['blas']}; "
        f"commit {m['commit'][:12]}, {m['date']}.",
        "",
        "| store | layout | ms/token | × numpy | × transformers | requests/token | round trips/token | load | documents "
        "| stored | $/token |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        cells = [r["store"], r.get("layout", ""), f"{r['per_token_s'] * 1e3:,.1f}", cell_ratio(r["ratio"])]
        cells.append(cell_ratio(r["vs_transformers"]) if "vs_transformers" in r else "")
        if "load_s" in r:
            cells += [f"{r['requests_per_token']:.0f}", f"{r['round_trips_per_token']:.0f}", f"{r['load_s']:.1f} s"]
            cells += [f"{r['stored_documents']:,}", f"{r['stored_bytes'] / 1e6:,.0f} MB"]
            cells.append(f"${r['dollars_per_token']:.5f}" if "dollars_per_token" in r else "")
        else:
            cells += [""] * 6
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def compact(result) -> str:
    """README's table: a row a store, in its config's layout and encoding."""
    m = result["machine"]
    lines = [
        f"{result['shape']}; {m['cpu']}, {m['cores']} cores, {m['threads']} threads; commit {m['commit'][:7]}, "
        f"{m['date'][:10]}; `{result['command']}`",
        "",
        "| store | layout | ms a token | × numpy | × transformers | round trips a token | $ a token |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        cells = [r["store"], r.get("layout", ""), f"{r['per_token_s'] * 1e3:,.1f}", cell_ratio(r["ratio"])]
        cells.append(cell_ratio(r["vs_transformers"]) if "vs_transformers" in r else "")
        cells.append(f"{r['round_trips_per_token']:.0f}" if "round_trips_per_token" in r else "")
        cells.append(f"${r['dollars_per_token']:.5f}" if "dollars_per_token" in r else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, m = result["rows"], result["machine"]
    fig, ax = plt.subplots(figsize=(11, 0.5 * len(rows) + 1.6))
    ms = [r["per_token_s"] * 1e3 for r in rows]
    labels = [f"{r['store']}, layout {r['layout']}" if "layout" in r else r["store"] for r in rows]
    ax.barh(labels, ms, color=["grey"] + ["tab:blue"] * (len(rows) - 1))
    for y, (v, r) in enumerate(zip(ms, rows)):
        ax.text(v, y, f" {v:,.1f} ms ({cell_ratio(r['ratio'])}× numpy)", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("ms per generated token (log scale)")
    about = f"{m['cpu']}, {m['cores']} cores, {m['threads']} threads; median of {result['n']}{runs_note(result)}"
    about += "; × numpy: against numpy timed just before the row"
    ax.set_title(result["shape"] + "\n" + textwrap.fill(about, 85), fontsize=9)
    ax.set_xlim(right=max(ms) * 20)  # room for the longest bar's label
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    args = parse_args()
    out = Path(args.out)
    result = json.loads((out / "speed.json").read_text()) if args.render else measure(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "speed.json").write_text(json.dumps(result, indent=1, default=float))
    table = markdown(result)
    (out / "speed.md").write_text(table)
    (out / "readme.md").write_text(compact(result))
    plot(result, out / "speed.png")
    progress(f"wrote {out / 'speed.json'}, {out / 'speed.md'}, {out / 'speed.png'}")
    print(table)


if __name__ == "__main__":
    main()
