"""Writes off the critical path: seconds per generated token with a slow write commit against none.

    python benchmarks/write_latency.py [-n 8] [--latency-ms 25] [--write-latency-ms 200] [--layout three] [--repeat 2]

Runs benchmarks/round_trips.py's measurement on the local turbopuffer server, with every write returning only
after --write-latency-ms more (turbopuffer's commit to object storage, documented as up to about 200 ms) and
with 0, --repeat times each (0, slow, then slow, 0, ...: ABBA), and prints the median seconds per generated token
of each (over every run's tokens) and their ratio
(target: at most 1.05), the waits for writes a token had, and what the ten-token prompt pays (its key search
waits for each layer's rows to land). The layout defaults to configs/turbopuffer.toml's.
Writes benchmarks/results/write_latency.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from round_trips import measure, model_dir  # noqa: E402

from vecgpt import weights  # noqa: E402
from vecgpt.config import LAYOUTS, load_config  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "turbopuffer.toml"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=8, help="generated tokens")
    parser.add_argument("--latency-ms", type=float, default=25.0)
    parser.add_argument("--write-latency-ms", type=float, default=200.0)
    parser.add_argument("--model", default=None)
    parser.add_argument("--layout", choices=LAYOUTS, default=None, help="default: configs/turbopuffer.toml's")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; in ABBA order from the second pair")
    parser.add_argument("--out", default="benchmarks/results/write_latency.json")
    args = parser.parse_args()
    args.layout = args.layout or load_config(CONFIG).layout
    model = weights.load(model_dir(args.model))
    runs: dict[float, list[dict]] = {0.0: [], args.write_latency_ms: []}
    order = [0.0, args.write_latency_ms] * args.repeat
    for i in range(1, args.repeat, 2):  # ABBA: a drift of the machine over the runs weighs on both alike
        order[2 * i], order[2 * i + 1] = order[2 * i + 1], order[2 * i]
    for write_ms in order:
        runs[write_ms].append(one_run(model, args, write_ms))
    runs = {ms: pooled(each) for ms, each in runs.items()}
    slow, fast = runs[args.write_latency_ms], runs[0.0]
    ratio = slow["seconds_per_token"] / fast["seconds_per_token"]
    print(
        f"\nturbopuffer, local server at {args.latency_ms:.0f} ms a request, layout {args.layout}, {args.n} tokens:\n"
        + "\n".join(line(ms, runs[ms]) for ms in runs)
        + f"\n  generated token: ratio {ratio:.3f} (target <= 1.05); ten-token prompt: "
        f"{slow['prompt_seconds'] / fast['prompt_seconds']:.2f}x ({slow['prompt_seconds'] - fast['prompt_seconds']:+.2f} s)"
    )
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {
                "latency_ms": args.latency_ms,
                "layout": args.layout,
                "runs": {str(k): v for k, v in runs.items()},
                "ratio": ratio,
            },
            f,
            indent=1,
        )


def one_run(model, args, write_ms: float) -> dict:
    """A fresh local server at that commit delay, the model loaded, a prompt and args.n tokens: their figures."""
    run = argparse.Namespace(
        n=args.n,
        latency_ms=args.latency_ms,
        write_latency_ms=write_ms,
        replicas=2,
        key_replicas=2,
        key_partition="head",
        layout=args.layout,
    )
    r = measure(model, run)
    return {
        "seconds_each": r["per_token"]["seconds_each"],
        "round_trips_per_token": r["per_token"]["round_trips"],
        "prompt_seconds": r["prompt"]["seconds"],
        "waits_per_token": r["per_token"]["by_kind"].get("wait", 0.0),
        "wait_seconds_per_token": r["per_token"]["seconds_by_kind"].get("wait", 0.0),
        "prompt_waits": r["prompt"]["by_kind"].get("wait", 0),
        "prompt_wait_seconds": r["prompt"]["seconds_by_kind"].get("wait", 0.0),
    }


def pooled(each: list[dict]) -> dict:
    """The runs of one delay together: the median token over all of them, the mean of the rest, and each run."""
    tokens = [s for r in each for s in r["seconds_each"]]
    means = {k: float(np.mean([r[k] for r in each])) for k in each[0] if k != "seconds_each"}
    return {**means, "seconds_per_token": float(np.median(tokens)), "runs": each}


def line(write_ms: float, run: dict) -> str:
    return (
        f"  write commit {write_ms:.0f} ms: {run['seconds_per_token']:.3f} s a token (median), "
        f"{run['round_trips_per_token']:.0f} round trips, {run['waits_per_token']:.2f} waits "
        f"({run['wait_seconds_per_token']:.3f} s); prompt {run['prompt_seconds']:.2f} s, "
        f"{run['prompt_waits']:.0f} waits ({run['prompt_wait_seconds']:.2f} s)"
    )


if __name__ == "__main__":
    main()
