"""Where a decode step of B texts goes on FAISS: cProfile of the stepper's one thread, CPU time, the prompt's read
left out (the profiler starts when the first step ends).

    python experiments/06_throughput/profile_step.py --texts 16 [-n 9] [--blas] [--model random-small] [--top 12]

Prints the step's wall time and the part in the rounds' store calls (as run.py's table), then per decode step the
CPU time of the stepper's thread: all of it, in the rounds' store calls (vecgpt.rounds.run; FAISS's worker threads,
which scan the other half of each matrix, are not profiled), in FAISS's kernels on that thread, in each text's own
part of a step (Session: its key search's decoding and its attention) and in the rest (the block's layer norms,
encodings and decodings, GELU, sampling and the texts' records), then the top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import run as throughput  # noqa: E402

from common.subjects import RANDOM_SMALL, load_model  # noqa: E402


class Profiled(throughput.Timed):
    """run.py's timing, and a profile of the stepper's thread from the end of the first step."""

    def __init__(self, store):
        super().__init__(store)
        self.profile = cProfile.Profile(time.thread_time)
        self.on = False

    def __call__(self, jobs) -> None:
        super().__call__(jobs)
        if not self.on:
            self.on = True
            self.profile.enable()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--texts", type=int, default=16)
    p.add_argument("-n", type=int, default=9, help="tokens a text: the first, then n - 1 profiled decode steps")
    p.add_argument("--blas", action="store_true", help="FAISS with invariant=False")
    p.add_argument("--model", default=RANDOM_SMALL)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    from vecgpt.api import open_engine
    from vecgpt.batch import Batch

    model = load_model(args.model)
    label, config = throughput.variants("faiss", argparse.Namespace(store_root=None))[int(args.blas)]
    engine = open_engine(config, model, progress=False)
    prompts = throughput.make_prompts(model.hparams, args.texts, 10, 0)
    throughput.measure(engine, config, prompts[:1], 2)  # warm
    timed, began = Profiled(engine.store), time.perf_counter()
    batch = Batch(engine, config, args.texts, on_step=timed)
    outs = batch.run(prompts, args.n, 0.0, config.top_k, 0, False)
    timed.profile.disable()
    row = throughput.figures(outs, time.perf_counter() - began, timed, batch.stepper.steps, None)
    report(label, args, row, timed.profile)
    engine.store.close()


def report(label: str, args, row: dict, profile) -> None:
    stats = pstats.Stats(profile, stream=sys.stdout)
    steps = args.n - 1

    def ms(fragments, column):  # per step, summed over the functions whose "file:name" holds a fragment
        found = [v[column] for k, v in stats.stats.items() if any(f in f"{k[0]}:{k[2]}" for f in fragments)]
        return 1e3 * sum(found) / steps

    every, store = 1e3 * sum(v[2] for v in stats.stats.values()) / steps, ms(["rounds.py:run"], 3)
    kernels = ms(["fvec_inner_products", "range_search", "fvec_L2sqr", "sgemm", "matmul"], 2)
    own = ms(["engine.py:weighted_values", "engine.py:key_scores", "engine.py:key_search", "engine.py:queue_rows"], 3)
    print(
        f"{label}, {args.texts} texts: {row['tokens_per_s']:.1f} tokens a second; {row['ms_per_token']:.0f} ms a step"
    )
    print(f"  (median), {row['store_ms_per_token']:.0f} of it in the rounds' store calls")
    print(
        f"CPU ms a decode step, the stepper's thread: {every:.0f}; in the store calls {store:.0f} (kernels {kernels:.0f})"
    )
    print(f"  each text's own part {own:.0f} = {own / args.texts:.1f} a text; the rest {every - store - own:.0f}")
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
