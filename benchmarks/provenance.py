"""What a benchmark ran on: threads pinned before numpy loads, and the machine, versions and commit it states."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("vecgpt", "numpy", "faiss-cpu", "lancedb", "pyarrow", "psycopg", "pgvector", "turbopuffer", "matplotlib")


def pin_threads(argv: list[str], default: int = 2) -> int:
    """Read --threads from argv and pin the BLAS/OpenMP pools to it; must run before numpy is imported."""
    threads = int(argv[argv.index("--threads") + 1]) if "--threads" in argv[:-1] else default
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    return threads


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas() -> str:
    import numpy as np

    try:
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{info.get('name')} {info.get('version')}"
    except Exception:  # noqa: BLE001 - numpy before 1.26 has no dict form; the name is a nicety
        return "unknown"


def commit() -> str:
    def git(*cmd):
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD")
    return (
        f"{head}{' (uncommitted changes)' if git('status', '--porcelain', '--untracked-files=no') else ''}" or "unknown"
    )


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine(threads: int) -> dict:
    return {
        "cpu": cpu_model(),
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "threads": threads,
        "system": f"{platform.system()} {platform.release()}",
        "blas": blas(),
        "versions": versions(),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
