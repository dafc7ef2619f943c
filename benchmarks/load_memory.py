"""Peak memory of `vecgpt load` on each store against the model's float32 bytes.

    python benchmarks/load_memory.py --size gpt2-medium --stores faiss memory [--scale 4] [--metric l2]

Writes (once) a random checkpoint of the size's shape under ~/.cache/vecgpt/models, then for each store runs
`vecgpt load` in a process of its own into a fresh location (a folder, a pgvector schema, a turbopuffer prefix)
and reads the child's peak resident memory (ru_maxrss from wait4). For pgvector it also samples, every 0.2 s,
the anonymous resident memory (RssAnon: not the shared buffers, which every backend maps) of every process
named postgres, and prints the peak above what they held before the load. The local turbopuffer server's own
memory is measured by tpuf_local_memory.py. Prints a row per store and writes
benchmarks/results/load_memory_<size>[-scale<n>].json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from provenance import machine, pin_threads

THREADS = pin_threads(sys.argv)  # the children inherit it

ROOT = Path(__file__).resolve().parents[1]


def checkpoint(size: str, scale: int) -> Path:
    from vecgpt import weights

    path = weights.default_models_dir() / f"{size}-random{'' if scale == 1 else f'-scale{scale}'}-s0"
    if not (path / "model.safetensors").is_file():  # in a process of its own: a child forked from a process
        # that held the weights would report that process's peak as its own (Linux keeps ru_maxrss across exec)
        argv = [sys.executable, "-m", "vecgpt.cli", "make-model", str(path), "--size", size, "--scale", str(scale)]
        subprocess.run(argv, cwd=ROOT, check=True)
    return path


def postgres_anon_kb() -> int:
    total = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:  # gone since the listing
            continue
        if text.startswith("Name:\tpostgres"):
            total += next((int(line.split()[1]) for line in text.splitlines() if line.startswith("RssAnon:")), 0)
    return total


class Sampler(threading.Thread):
    """The peak of postgres_anon_kb() while running."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.base, self.stop = 0, postgres_anon_kb(), threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, postgres_anon_kb())
            time.sleep(0.2)


def load(store: str, model: Path, metric: str, where: str) -> dict:
    argv = [sys.executable, "-m", "vecgpt.cli", "load", "--backend", store, "--metric", metric]
    argv += ["--config", str(ROOT / "configs" / f"{store}.toml"), "--store", where, "--model", str(model)]
    sampler = Sampler() if store == "pgvector" else None
    sampler and sampler.start()
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    err = proc.stderr.read()
    if sampler:
        sampler.stop.set()
        sampler.join()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{store}: vecgpt load failed: {err.strip().splitlines()[-1:]}")
    out = {"store": store, "seconds": round(seconds, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}
    if sampler:
        out["postgres_anon_peak_mb"] = round((sampler.peak - sampler.base) / 1024, 1)
    return out


def drop(store: str, model: Path, metric: str, where: str) -> None:
    """The model loaded, removed again (a folder store's whole folder): the next store's load gets the disk."""
    if store in ("pgvector", "turbopuffer"):
        argv = [sys.executable, "-m", "vecgpt.cli", "drop", "--backend", store, "--metric", metric]
        argv += ["--config", str(ROOT / "configs" / f"{store}.toml"), "--store", where, "--model", str(model)]
        subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    else:
        shutil.rmtree(where, ignore_errors=True)


def location(store: str, scratch: Path) -> str:
    if store == "pgvector":
        return f"load_memory_{os.getpid()}"
    if store == "turbopuffer":
        return f"load-memory-{os.getpid()}-"
    return str(scratch / store)


def main() -> None:
    from vecgpt import weights
    from vecgpt.loading import plan

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="gpt2-medium", choices=list(weights.SIZES))
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--stores", nargs="+", default=["faiss", "memory"])
    p.add_argument("--metric", default="l2", choices=["l2", "ip"])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    model = checkpoint(args.size, args.scale)
    hp = weights.size_shape(args.size, args.scale)
    model_bytes = weights.parameter_count(hp) * 4
    rows = []
    with tempfile.TemporaryDirectory(prefix="vecgpt-load-memory-", dir=weights.default_models_dir().parent) as d:
        for store in args.stores:
            row = load(store, model, args.metric, location(store, Path(d)))
            drop(store, model, args.metric, location(store, Path(d)))
            vectors = sum(n * dim * 4 for _, n, dim in plan(hp, args.metric, "five"))
            row.update(model_mb=round(model_bytes / 1e6, 1), vectors_mb=round(vectors / 1e6, 1))
            row["x_model"] = round(row["peak_rss_mb"] * 1024 * 1024 / model_bytes, 2)
            rows.append(row)
            server = f", postgres +{row['postgres_anon_peak_mb']:,.0f} MB" if "postgres_anon_peak_mb" in row else ""
            print(
                f"{store:12} peak {row['peak_rss_mb']:>9,.1f} MB  model {row['model_mb']:,.1f} MB  "
                f"x{row['x_model']:.2f}  {row['seconds']:.1f} s{server}",
                flush=True,
            )
    out = (
        ROOT
        / "benchmarks"
        / "results"
        / f"load_memory_{args.size}{'' if args.scale == 1 else f'-scale{args.scale}'}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"size": args.size, "scale": args.scale, "metric": args.metric, "rows": rows, "machine": machine(THREADS)}
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
