"""What every run records: provenance (code, libraries, machine, command line, time), a new run folder, tables."""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

BASE_PACKAGES = ("numpy", "tiktoken", "hnswlib")  # beside every store's client libraries (store_packages)
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def store_packages() -> list[str]:
    """The libraries of every store's extra in vecgpt's metadata (an extra named after a backend: `vecgpt[duckdb]`),
    so a new store's clients are recorded without a list to extend here."""
    from vecgpt.backends.base import available

    stores = set(available())
    try:
        requires = metadata.requires("vecgpt") or []
    except metadata.PackageNotFoundError:
        return []
    found = []
    for req in requires:
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0)
        if extra and extra.group(1) in stores and name not in found:
            found.append(name)
    return found


def versions() -> dict[str, str]:
    found = {}
    for name in (*BASE_PACKAGES, *store_packages()):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def provenance(seed: int | None = None, model=None, **extra) -> dict:
    """Where a result came from: code, libraries, machine, threads, command line, time, seed and model."""
    import vecgpt

    return {
        "vecgpt": vecgpt.__version__,
        "commit": commit(),
        "versions": versions(),
        "command": shlex.join(sys.argv),
        "cwd": os.getcwd(),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "system": platform.platform(),
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
        },
        "threads": {v: os.environ.get(v) for v in THREAD_VARS},
        "seed": seed,
        "model": None
        if model is None
        else {"source": model.source, "fingerprint": model.fingerprint, "hparams": model.hparams.__dict__},
        **extra,
    }


def new_run(name: str, out: str | None = None) -> Path:
    """The folder a run writes to: `out` as given, else a new ./results/<name>/<timestamp>."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        return Path(out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        path = Path("results") / name / (stamp if n == 1 else f"{stamp}-{n}")  # two runs in one second
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"results/{name}/{stamp}-*: no free run folder")


def publish(out: Path, stem: str, data: dict, md: str, draw) -> None:
    """stem.json, stem.md and stem.png (draw(path) makes it; not without matplotlib) in out; the tables on stdout."""
    from common import plots

    write_json(out / f"{stem}.json", data)
    (out / f"{stem}.md").write_text(md + "\n")
    drawn = plots.draw({f"{stem}.png": lambda: draw(out / f"{stem}.png")})
    print(md)
    print("", file=sys.stderr)
    say_written(out, [f"{stem}.json", f"{stem}.md", *drawn])


def say_written(out: Path, names: list[str]) -> None:
    """The files a run wrote, on stderr: only those written."""
    print(f"wrote {out}/{', '.join(names)}", file=sys.stderr)


def write_json(path: Path, data: dict) -> Path:
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(data, indent=1, default=_plain))
    tmp.replace(path)
    return path


def _plain(value):
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def markdown_table(rows: list[dict], columns: list[str] | None = None, floatfmt: str = ".3g") -> str:
    """A GitHub markdown table of dict rows; prints well in a terminal too."""
    columns = columns or list(rows[0]) if rows else []

    def cell(v):
        return format(v, floatfmt) if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
