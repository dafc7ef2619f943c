"""Writes off the critical path: seconds per generated token with a slow write commit against none.

    python benchmarks/write_latency.py [-n 8] [--latency-ms 25] [--write-latency-ms 200] [--layout three]

Runs benchmarks/round_trips.py's measurement twice on the local turbopuffer server, with every write
returning only after --write-latency-ms more (turbopuffer's commit to object storage, documented as up to
about 200 ms) and with 0, and prints the median seconds per generated token of each and their ratio
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
    parser.add_argument("--out", default="benchmarks/results/write_latency.json")
    args = parser.parse_args()
    args.layout = args.layout or load_config(CONFIG).layout
    model = weights.load(model_dir(args.model))
    runs = {}
    for write_ms in (0.0, args.write_latency_ms):
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
        runs[write_ms] = {
            "seconds_per_token": r["per_token"]["seconds"],
            "seconds_each": r["per_token"]["seconds_each"],
            "round_trips_per_token": r["per_token"]["round_trips"],
            "prompt_seconds": r["prompt"]["seconds"],
            "waits_per_token": r["per_token"]["by_kind"].get("wait", 0.0),
            "wait_seconds_per_token": r["per_token"]["seconds_by_kind"].get("wait", 0.0),
            "prompt_waits": r["prompt"]["by_kind"].get("wait", 0),
            "prompt_wait_seconds": r["prompt"]["seconds_by_kind"].get("wait", 0.0),
        }
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


def line(write_ms: float, run: dict) -> str:
    return (
        f"  write commit {write_ms:.0f} ms: {run['seconds_per_token']:.3f} s a token (median), "
        f"{run['round_trips_per_token']:.0f} round trips, {run['waits_per_token']:.2f} waits "
        f"({run['wait_seconds_per_token']:.3f} s); prompt {run['prompt_seconds']:.2f} s, "
        f"{run['prompt_waits']} waits ({run['prompt_wait_seconds']:.2f} s)"
    )


if __name__ == "__main__":
    main()
