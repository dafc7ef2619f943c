"""What a benchmark ran on: threads pinned before numpy loads, and the machine, versions and commit it states
(the experiments' record, plus the CPU model and the BLAS numpy uses)."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from common.record import commit, versions  # noqa: E402 (the experiments' helpers)


def pin_threads(argv: list[str], default: int = 2) -> int:
    """Read --threads from argv and pin the BLAS/OpenMP pools to it; must run before numpy is imported."""
    threads = int(argv[argv.index("--threads") + 1]) if "--threads" in argv[:-1] else default
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    return threads


def busy_share(seconds: float = 0.5) -> float | None:
    """The share of the machine's CPU time in use over the next `seconds`, every process's (/proc/stat: None where
    there is no such file)."""

    def sample():
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(values), values[3] + values[4]  # all, idle + iowait

    try:
        total, idle = sample()
        time.sleep(seconds)
        total2, idle2 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (idle2 - idle) / max(total2 - total, 1)


def settle(limit: float = 20.0, busy: float = 0.1) -> float:
    """Wait, up to `limit` seconds, for the machine to be quiet (under `busy` of its CPU in use for half a second):
    work left from a row before (a database's checkpoint, a server's shutdown) is not charged to the next. Returns
    the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        share = busy_share()
        if share is None or share < busy:
            break
    return time.perf_counter() - start


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


def shape(hp) -> str:
    """A model's shape in words, as the benchmarks' records and plots state it."""
    return f"{hp.n_layer} layers, {hp.n_head} heads, {hp.n_embd} wide, {hp.n_vocab:,} tokens"


def machine(threads: int) -> dict:
    """The machine stated in full (CPU model, cores, threads, BLAS), library versions, commit and date."""
    import numpy as np

    import vecgpt

    return {
        "cpu": cpu_model(),
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "threads": threads,
        "system": f"{platform.system()} {platform.release()}",
        "blas": blas(),
        "versions": {
            "python": platform.python_version(),
            "vecgpt": vecgpt.__version__,
            **versions(),
            "numpy": np.__version__,
        },
        "commit": commit() or "unknown",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
