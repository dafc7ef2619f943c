"""Experiment 7: every GPT-2 size on every store, and how loading, storage, memory, speed and dollars grow.

For each size (weights.SIZES; random weights of its shape written once by `vecgpt make-model`, or at --scale S the
shape weights.size_shape scales down) and each store, two processes of their own (size_child.py): one loads the
checkpoint into the emptied store (seconds, MB/s of float32 vectors, bytes held and on disk, peak memory), then a
fresh one runs `vecgpt generate`'s steps on it (opening the store, finding the model, opening a text, the prompt's
first read with the store's files evicted from the page cache, then -n greedy tokens: ms a token, requests and round
trips from the meter, turbopuffer's dollars). numpy float32 (vecgpt.reference) and transformers run the same
prompt and tokens in processes of their own. Per size, what a token costs on turbopuffer in each layout comes from
the plan and the backend's estimate_cost alone. Each store's exponent is fitted by least squares on logs: ms a
token and load seconds against parameters. `--llama` runs the Llama shapes instead (llama_sizes.py): a token's
documents, bytes, rounds, requests, ms and turbopuffer dollars at each hub shape beside GPT-2's sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # as experiment 06
    os.environ.setdefault(_var, sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv[:-1] else "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common/
sys.path.insert(0, str(Path(__file__).resolve().parent))  # this experiment's modules


from vecgpt.backends.base import available  # noqa: E402
from vecgpt.weights import SIZES  # noqa: E402

from common.subjects import CONFIGS, place  # noqa: E402
from common.tpuf_server import start_server  # noqa: E402

NAME = "sizes"
HELP = "every GPT-2 size on every store: load, bytes, memory, ms and dollars a token, fitted exponents"
STORES = tuple(s for s in available() if (CONFIGS / f"{s}.toml").is_file())
REFERENCES = ("numpy", "transformers")
CHILD = Path(__file__).resolve().parent / "size_child.py"
PROMPT = [15496, 995]  # "Hello world": a two-token prompt (ids taken modulo a scaled vocabulary)
DISK = {
    "faiss": 1.05,
    "memory": 1.05,
    "pgvector": 1.4,
    "turbopuffer": 0.0,
}  # x the model's bytes (03_storage); else 2.2
DISK_SPARE = 1.5e9  # bytes left free for the machine's other users
FOLDER_KEYS = ("path", "data_dir")  # [store] options naming a folder or file a store keeps its data in


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    p.add_argument("--stores", nargs="+", choices=[*REFERENCES, *STORES], default=[*REFERENCES, *STORES])
    p.add_argument("--scale", type=int, default=1, help="each size's shape scaled down (weights.size_shape)")
    p.add_argument("-n", type=int, default=5, help="greedy tokens timed after the two-token prompt")
    p.add_argument("--tokens", nargs="*", default=[], metavar="STORE=N", help="fewer tokens on a slow store")
    p.add_argument("--max-size", nargs="*", default=[], metavar="STORE=SIZE", help="no larger size on a store")
    p.add_argument("--models", default=None, help="checkpoint cache (default ~/.cache/vecgpt/models)")
    p.add_argument("--store-root", default=None, help="the stores' folders (default ~/.cache/vecgpt/sizes)")
    p.add_argument("--keep", action="store_true", help="keep each store's model (default: dropped after, for disk)")
    p.add_argument("--warm", action="store_true", help="do not evict the store's files before the first read")
    p.add_argument("--latency-ms", type=float, default=0.0, help="the local turbopuffer server's delay a request")
    p.add_argument("--tpuf-layout", default="five", help="turbopuffer's layout (its config: three)")
    p.add_argument("--tpuf-replicas", type=int, default=1, help="turbopuffer's copies of each matrix")
    p.add_argument("--memory-factor", type=float, default=2.5, help="skip a run needing more x the model's bytes")
    p.add_argument("--child-timeout", type=float, default=3600.0, help="seconds a measuring process may take")
    p.add_argument("--no-whole-read", action="store_true", help="skip timing a read and hash of the whole checkpoint")
    p.add_argument("--profile", action="store_true", help="cProfile the tokens: top functions in the JSON")
    p.add_argument("--threads", type=int, default=2, help="BLAS and OpenMP threads (set before numpy loads)")
    p.add_argument("--seed", type=int, default=0, help="the random checkpoints' seed")
    p.add_argument("--llama", action="store_true", help="the Llama shapes beside GPT-2's (llama_sizes.py)")
    p.add_argument(
        "--llama-shapes", nargs="*", default=None, help="--llama: only these shapes (e.g. SmolLM2-135M gpt2)"
    )
    p.add_argument(
        "--llama-layers", type=int, nargs="+", default=[2, 4, 6, 8], help="--llama: layers of the cut checkpoints"
    )
    p.add_argument("--llama-full", nargs="*", default=None, help="--llama: shapes also measured whole")
    p.add_argument("--render", nargs="+", default=None, metavar="JSON", help="no runs: tables and plot of results")
    p.add_argument("--out", default=None, help=f"results folder (default: a new ./results/{NAME}/<timestamp>)")
    p.add_argument("--quiet", action="store_true", help="no load progress bars")


def run(args) -> int:
    import size_report as report

    from vecgpt.errors import VecgptError
    from vecgpt.weights import parameter_count, size_shape

    from common.record import new_run

    if args.llama:  # its own runs, or with --render its own JSON
        import llama_sizes

        return llama_sizes.run(args)
    if args.render:
        return render(args)
    check(args)
    out, rows = new_run(NAME, args.out), []
    costs = [c for size in SIZES for c in size_costs(size, size_shape(size, args.scale))]  # every size: no load
    for size in args.sizes:
        try:
            hp, path = checkpoint(size, args)
        except VecgptError as e:  # no room for the checkpoint: the size's rows say so, the other sizes still run
            say(f"{size}: {e}")
            count = parameter_count(size_shape(size, args.scale))
            rows += [{"size": size, "store": name, "parameters": count, "skipped": str(e)} for name in args.stores]
            continue
        for name in args.stores:
            if not allowed(name, size, args):
                continue
            rows.append(measure(name, size, hp, path, args))
            report.partial(out, args, rows, costs)
    report.write(out, args, rows, costs, report.settings_of(args))
    return 0


def render(args) -> int:
    """The tables and plot of earlier runs' sizes.json together (each run's settings kept under "runs")."""
    import size_report as report

    from vecgpt.weights import size_shape

    from common.record import new_run

    runs = [json.loads(Path(p).read_text()) for p in args.render]
    rows = report.merge(runs)
    settings = {**runs[0]["settings"], "runs": {p: r["settings"] for p, r in zip(args.render, runs)}}
    scale = settings.get("scale", 1)
    costs = [c for size in SIZES for c in size_costs(size, size_shape(size, scale))]
    report.write(new_run(NAME, args.out), args, rows, costs, settings)
    return 0


def check(args) -> None:
    from vecgpt.errors import VecgptError

    if args.n < 1 or args.scale < 1:
        raise VecgptError("-n and --scale must be 1 or more")
    for given, choices in ((pairs(args.tokens), None), (pairs(args.max_size), SIZES)):
        for store, value in given.items():
            if store not in (*REFERENCES, *STORES) or (choices and value not in choices):
                raise VecgptError(
                    f"{store}={value}: name a store of {', '.join(STORES)} and a size of {', '.join(SIZES)}"
                )


def pairs(given: list[str]) -> dict[str, str]:
    from vecgpt.errors import VecgptError

    out = {}
    for item in given:
        store, sep, value = item.partition("=")
        if not sep or not value:
            raise VecgptError(f"{item!r}: give STORE=VALUE, e.g. milvus=2")
        out[store] = value
    return out


def allowed(name: str, size: str, args) -> bool:
    limit = pairs(args.max_size).get(name)
    return limit is None or list(SIZES).index(size) <= list(SIZES).index(limit)


# ------------------------------------------------------------ checkpoints


def checkpoint(size: str, args):
    """The size's shape and its random checkpoint, written once by `vecgpt make-model` into the cache."""
    from vecgpt import weights

    hp = weights.size_shape(size, args.scale)
    models = Path(args.models).expanduser() if args.models else weights.default_models_dir()
    name = "gpt2-small" if size == "gpt2" else size
    path = models / (f"{name}-random-s{args.seed}" if args.scale == 1 else f"{name}-x{args.scale}-random-s{args.seed}")
    if not (path / "model.safetensors").is_file():
        command = [sys.executable, "-m", "vecgpt", "make-model", str(path), "--size", size, "--seed", str(args.seed)]
        command += ["--scale", str(args.scale)] if args.scale > 1 else []
        say(f"{size}: writing a random checkpoint to {path}")
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            from vecgpt.errors import VecgptError

            raise VecgptError(f"make-model for {size} failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return hp, path


def size_costs(size: str, hp) -> list[dict]:
    from size_fit import layout_costs

    from vecgpt.weights import parameter_count

    return [{"size": size, "parameters": parameter_count(hp), **c} for c in layout_costs(hp)]


# ------------------------------------------------------------ one size on one store


def measure(name: str, size: str, hp, path: Path, args) -> dict:
    """A row: the references in one process each, a store in two (load, then generate), with what stopped it."""
    from vecgpt.weights import parameter_count

    n = int(pairs(args.tokens).get(name, args.n))
    from common.record import commit

    row = {"size": size, "store": name, "parameters": parameter_count(hp), "model_mb": parameter_count(hp) * 4 / 1e6}
    row["commit"] = commit()  # others commit to the tree while a long run goes on
    spec = {"model": str(path), "prompt": [t % hp.n_vocab for t in PROMPT], "n": n, "quiet": args.quiet}
    spec.update(threads=args.threads, profile=args.profile, whole_read=not args.no_whole_read)
    spec["model_bytes"] = row["model_mb"] * 1e6
    short = room(name, row["model_mb"] * 1e6, args)
    if short:
        say(f"{size} on {name}: skipped ({short})")
        return {**row, "skipped": short}
    if name in REFERENCES:
        say(f"{size} on {name}: {n} tokens")
        return {**row, **child({**spec, "phase": name}, args)}
    return {**row, **store_run(name, size, spec, args)}


def available_bytes() -> int:
    from vecgpt.cli.attention import available_bytes

    return available_bytes()


def room(name: str, model_bytes: float, args) -> str | None:
    """Why a run cannot fit now (memory, disk), or None."""
    free = available_bytes()
    if name != "transformers" and free and args.memory_factor * model_bytes > free:
        return f"needs about {args.memory_factor:g} x {model_bytes / 1e9:.1f} GB of memory, {free / 1e9:.1f} GB free"
    root = store_root(args)
    root.mkdir(parents=True, exist_ok=True)
    disk, factor = shutil.disk_usage(root).free - DISK_SPARE, DISK.get(name, 2.2)
    if name not in REFERENCES and factor * model_bytes > disk:
        return f"needs about {factor:g} x {model_bytes / 1e9:.1f} GB of disk and 1.5 GB spare, {disk / 1e9 + 1.5:.1f} GB free"
    return None


def store_root(args) -> Path:
    from vecgpt.backends.base import cache_dir

    return Path(args.store_root).expanduser() if args.store_root else cache_dir("sizes")


def store_config(name: str, size: str, args) -> tuple[Path, dict, str]:
    """The store's config file, its [store] options placed for this size, and its layout."""
    from vecgpt.config import load_config

    layout = args.tpuf_layout if name == "turbopuffer" else None
    config = load_config(CONFIGS / f"{name}.toml", layout=layout)
    tag = f"{name}-{size}" + (f"-x{args.scale}" if args.scale > 1 else "")
    place(config, tag, str(store_root(args)))
    if name == "turbopuffer":
        config.store.update(replicas=args.tpuf_replicas, timeout=120.0)
    if name == "pgvector":  # a server of its own: its memory is this run's, its start part of opening the store
        config.store["data_dir"] = str(pg_dir(args))
    return CONFIGS / f"{name}.toml", config.store, config.layout


def pg_dir(args) -> Path:
    """As root, pgserver opens every parent of its data folder to its own user: keep it in /var/tmp then."""
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not args.store_root:
        return Path("/var/tmp") / f"vecgpt-sizes-{os.getuid()}" / "pgserver"
    return store_root(args) / "pgserver"


def store_run(name: str, size: str, spec: dict, args) -> dict:
    path, options, layout = store_config(name, size, args)
    spec = {**spec, "config": str(path), "store": options, "layout": layout}
    server = start_server(args.latency_ms) if name == "turbopuffer" else None
    try:
        if server is not None:
            spec["store"] = {**options, "base_url": server[1]}
        say(f"{size} on {name}: loading ({layout})")
        loaded = child({**spec, "phase": "load"}, args)
        if "error" in loaded:
            return {"layout": layout, "load_error": loaded["error"], **server_memory(server, spec)}
        held = on_disk(spec["store"])
        if not args.warm:
            evict([Path(spec["model"]) / "model.safetensors", *folders(spec["store"])])
        say(f"{size} on {name}: first read and {spec['n']} tokens")
        beside = available_bytes() > 4 * spec["model_bytes"]  # the store's memory, the model, numpy's copy of it
        made = child({**spec, "phase": "generate", "drop": not args.keep, "numpy_beside": beside}, args)
        row = {"layout": layout, "load": loaded, "generate": made, "disk_bytes": held, **server_memory(server, spec)}
        return row
    finally:
        if server is not None:
            server[0].terminate()
            server[0].wait(30)
        if not args.keep:
            for folder in folders(spec["store"]):
                if folder.name != "pgserver":
                    shutil.rmtree(folder, ignore_errors=True) if folder.is_dir() else folder.unlink(missing_ok=True)


def folders(options: dict) -> list[Path]:
    return [Path(options[k]).expanduser() for k in FOLDER_KEYS if options.get(k)]


def on_disk(options: dict) -> int | None:
    """Bytes in the store's folder or file (pgvector: None; its bytes are its tables')."""
    found = [p for p in folders(options) if p.name != "pgserver" and p.exists()]
    if not found:
        return None
    return sum(f.stat().st_size for p in found for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())


def evict(paths: list[Path]) -> None:
    """The files out of the page cache (posix_fadvise DONTNEED; clean pages go), so a first read reads the disk."""
    for top in paths:
        if not top.exists():
            continue
        for f in [top] if top.is_file() else [f for f in top.rglob("*") if f.is_file()]:
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            finally:
                os.close(fd)


def server_memory(server, spec: dict) -> dict:
    """The local turbopuffer server's peak resident memory (VmHWM) and now, in MB."""
    from size_child import status_mb

    if server is None:
        return {}
    return {"server_peak_mb": status_mb("VmHWM", server[0].pid), "server_rss_mb": status_mb("VmRSS", server[0].pid)}


def child(spec: dict, args) -> dict:
    """size_child.py on the spec in a process of its own; its result, or {"error": ...} where it failed or ran out of
    time (its stderr's last line)."""
    with tempfile.TemporaryDirectory(prefix="vecgpt-sizes-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        began = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, str(CHILD), str(spec_path), str(out_path)],
                stderr=subprocess.PIPE,
                text=True,
                timeout=args.child_timeout,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"ran past {args.child_timeout:g} s"}
        wall = time.perf_counter() - began
        if done.returncode or not out_path.is_file():
            tail = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
            return {"error": f"exit {done.returncode}: {tail[0][-300:]}", "wall_s": wall, "stderr": done.stderr[-3000:]}
        return {**json.loads(out_path.read_text()), "wall_s": wall}


def say(message: str) -> None:
    print(f"sizes: {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    import common

    sys.exit(common.main(sys.modules[__name__]))
