"""What a text's operations cost on each store, against reading the same positions from scratch.

    python benchmarks/texts.py [--stores STORE ...] [--latency-ms 25]

On the shipped model (4 layers, context 256), greedy: a 200-token text ("ROMEO:" and 198 drawn), then
  - branch at position 190 with its second candidate and draw 10 tokens (positions 190..199 read),
  - retry the last token with another seed, step back 5 positions and draw them again,
  - resume the text in a new connection (its keys, values and candidates fetched once),
each against reading its positions from scratch (the first 200 positions' cost, per position), on every store with
a config (configs/<store>.toml) unless --stores names some. Prints a table, writes benchmarks/results/texts.json
and texts.png. turbopuffer runs against the local server with a fixed delay a request and reports dollars from the
published prices.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from provenance import machine  # noqa: E402

from vecgpt import tokenizer, weights  # noqa: E402
from vecgpt.backends.base import available, get_store  # noqa: E402
from vecgpt.config import load_config, open_store  # noqa: E402
from vecgpt.engine import Engine  # noqa: E402
from vecgpt.loading import push  # noqa: E402
from vecgpt.text import CANDIDATES, Text  # noqa: E402

from common.subjects import place  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
STORES = [s for s in available() if (ROOT / "configs" / f"{s}.toml").is_file()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stores", nargs="+", choices=STORES, default=STORES, help="configs/<store>.toml each")
    p.add_argument("--latency-ms", type=float, default=25.0, help="turbopuffer: the local server's delay a request")
    p.add_argument("--length", type=int, default=200)
    p.add_argument("--at", type=int, default=190, help="where the branch starts")
    return p.parse_args(argv)


def timed(text: Text, store, fn) -> dict:
    """fn's result cost: the text's meter for the operation, seconds, and dollars where the store counts usage."""
    before = dict(getattr(store, "usage", {}))
    start = time.perf_counter()
    fn()
    cost = {**text.cost, "seconds": round(time.perf_counter() - start, 4)}
    if hasattr(store, "usage"):
        from vecgpt.backends import turbopuffer as tpb

        used = {k: store.usage[k] - before.get(k, 0) for k in store.usage}
        cost["dollars"] = tpb.dollars(used)
    return cost


def per_position(cost: dict, n: int) -> dict:
    return {k: cost[k] / n for k in ("requests", "round_trips", "seconds", "dollars") if k in cost}


def measure_store(store, options_of, model, args) -> dict:
    key = push(store, model, "l2", progress=False)["fingerprint"]
    engine = Engine(store, model=key)
    text = Text.start(engine, tokenizer.encode("ROMEO:"))
    row = {"scratch": timed(text, store, lambda: text.generate(args.length - text.prompt_len, stop=False))}
    scratch = per_position(row["scratch"], row["scratch"]["positions_read"])
    second = text.candidates(args.at)[1][0]
    children = []
    row["branch"] = timed(text, store, lambda: children.append(text.branch(args.at, second)))
    child = children[0]
    row["branch_generate"] = timed(child, store, lambda: child.generate(args.length - args.at, stop=False))
    row["retry"] = timed(text, store, lambda: text.retry())
    row["step_back"] = timed(text, store, lambda: text.step_back(len(text.tokens) - 5))
    row["step_back_generate"] = timed(text, store, lambda: text.generate(5, stop=False))
    row["bytes_per_token"] = text_bytes(store, text)
    other = options_of()
    resumed = []
    start = time.perf_counter()
    resumed.append(Text.resume(Engine(other, model=engine.key), text.id))
    row["resume"] = {**resumed[0].session.meter.summary(), "seconds": round(time.perf_counter() - start, 4)}
    row["resume"] = {k: row["resume"][k] for k in ("total", "round_trips", "by_kind", "seconds")}
    row["resume_equal"] = resumed[0].tokens == text.tokens
    other.close()
    row["scratch_per_position"] = scratch
    child.close()
    text.close()
    return row


def text_bytes(store, text: Text) -> float:
    stats = store.stats()
    held = sum(stats.get(text.session.name + end, {}).get("bytes", 0) for end in ("", CANDIDATES))
    return held / len(text.tokens)


def embedded(name: str, model, args, root: str) -> dict:
    config = load_config(ROOT / "configs" / f"{name}.toml")
    place(config, f"texts_{name}", root)
    store = open_store(config)
    try:
        return measure_store(store, lambda: open_store(config), model, args)
    finally:
        store.close()


def turbopuffer(model, args) -> dict:
    import round_trips

    os.environ.setdefault("TURBOPUFFER_API_KEY", "local")
    os.environ.pop("TURBOPUFFER_REGION", None)
    proc, url = round_trips.start_server(args.latency_ms)
    options = {"base_url": url, "prefix": "texts-", "max_retries": 3}
    try:
        store = get_store("turbopuffer", **options)
        try:
            return measure_store(store, lambda: get_store("turbopuffer", **options), model, args)
        finally:
            store.close()
    finally:
        proc.terminate()
        proc.wait(10)


def print_table(rows: dict) -> None:
    print(
        f"{'store':12} {'operation':20} {'positions':>9} {'requests':>8} {'rounds':>6} {'seconds':>8} {'scratch s':>9}"
    )
    for name, row in rows.items():
        unit = row["scratch_per_position"]
        for op in ("scratch", "branch", "branch_generate", "retry", "step_back", "step_back_generate"):
            c = row[op]
            n = c["positions_read"]
            print(
                f"{name:12} {op:20} {n:>9} {c['requests']:>8} {c['round_trips']:>6} {c['seconds']:>8.3f} "
                f"{n * unit['seconds']:>9.3f}"
            )
        r = row["resume"]
        print(f"{name:12} {'resume':20} {0:>9} {r['total']:>8} {r['round_trips']:>6} {r['seconds']:>8.3f}")
        print(f"{name:12} bytes a token {row['bytes_per_token']:,.0f}; resumed text equal: {row['resume_equal']}")


def plot(rows: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    ops = ["branch + 10 tokens", "the same 10 from scratch", "retry", "step back 5 + redraw"]
    values = [
        [
            rows[n]["branch"]["seconds"] + rows[n]["branch_generate"]["seconds"],
            10 * rows[n]["scratch_per_position"]["seconds"] * (rows[n]["branch_generate"]["positions_read"] / 10),
            rows[n]["retry"]["seconds"],
            rows[n]["step_back"]["seconds"] + rows[n]["step_back_generate"]["seconds"],
        ]
        for n in names
    ]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(ops)
    for i, op in enumerate(ops):
        ax.bar([x + i * width for x in range(len(names))], [v[i] for v in values], width, label=op)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], names)
    ax.set_yscale("log")
    ax.set_ylabel("seconds")
    ax.set_title("a text's operations on the shipped model (200 tokens, branch at 190)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    args = parse_args(argv)
    stated = machine(None)
    model = weights.load("shakespeare")
    rows, root = {}, tempfile.mkdtemp(prefix="vecgpt-texts-")
    try:
        for name in args.stores:
            print(f"texts: {name}", file=sys.stderr, flush=True)
            rows[name] = turbopuffer(model, args) if name == "turbopuffer" else embedded(name, model, args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    out = {"command": "python benchmarks/texts.py " + " ".join(sys.argv[1:]), "machine": stated, "stores": rows}
    (OUT / "texts.json").write_text(json.dumps(out, indent=1))
    plot(rows, OUT / "texts.png")
    print(f"wrote {OUT / 'texts.json'} and {OUT / 'texts.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
