"""Where a decode step of B texts in company goes on FAISS: cProfile of every text's thread, CPU time, the prompt's
read left out (each thread's profiler starts when its first read ends).

    python experiments/06_throughput/profile_step.py --texts 16 [-n 9] [--blas] [--model random-small] [--top 12]

Prints the step's wall time and the part in the rounds' store calls (as run.py's table), then per decode step the
CPU time of the texts' threads: all of it, in Company._run (the merged store calls, on whichever text's thread sends
the round; FAISS's worker threads, which scan the other half of each matrix, are not profiled), in FAISS's kernels on
those threads, and outside the store calls (each text's own Python and numpy), then the top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import run as throughput  # noqa: E402

from common.subjects import RANDOM_SMALL, load_model  # noqa: E402


def profiled_company(store, profiles: list):
    """run.py's timed company, each text's thread profiled from the end of its first read."""
    company, local = throughput.timed_company(store), threading.local()
    base = type(company)

    class Profiled(base):
        @contextmanager
        def read(self, member):
            with base.read(self, member):
                yield
            if not hasattr(local, "profile"):
                local.profile = cProfile.Profile(time.thread_time)
                profiles.append(local.profile)
                local.profile.enable()

    company.__class__ = Profiled
    return company


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
    engine, profiles = open_engine(config, model, progress=False), []
    prompts = throughput.make_prompts(model.hparams, args.texts, 10, 0)
    throughput.measure(engine, config, prompts[:1], 2)  # warm
    company, began = profiled_company(engine.store, profiles), time.perf_counter()
    outs = Batch(engine, config, company, args.texts).run(prompts, args.n, 0.0, config.top_k, 0, False)
    for profile in profiles:
        profile.disable()
    row = throughput.figures(outs, time.perf_counter() - began, company, None)
    report(label, args, row, profiles)
    engine.store.close()


def report(label: str, args, row: dict, profiles: list) -> None:
    stats = pstats.Stats(profiles[0], stream=sys.stdout)
    for profile in profiles[1:]:
        stats.add(profile)
    steps = args.n - 1

    def ms(fragments, column):  # per step, summed over the functions whose "file:name" holds a fragment
        found = [v[column] for k, v in stats.stats.items() if any(f in f"{k[0]}:{k[2]}" for f in fragments)]
        return 1e3 * sum(found) / steps

    every, store = 1e3 * sum(v[2] for v in stats.stats.values()) / steps, ms(["company.py:_run"], 3)
    kernels = ms(["fvec_inner_products", "range_search", "fvec_L2sqr"], 2)
    print(
        f"{label}, {args.texts} texts: {row['tokens_per_s']:.1f} tokens a second; {row['ms_per_token']:.0f} ms a step"
    )
    print(f"  (median), {row['store_ms_per_token']:.0f} of it in the rounds' store calls")
    print(
        f"CPU ms a decode step, the texts' threads: {every:.0f}; in the store calls {store:.0f} (FAISS kernels {kernels:.0f})"
    )
    print(f"  outside them {every - store:.0f} = {(every - store) / args.texts:.1f} a text (its own Python and numpy)")
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
