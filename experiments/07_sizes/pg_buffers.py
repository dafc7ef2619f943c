"""Does pgvector's time a token depend on its tables fitting its shared buffers? GPT-2 small's tables (about 670 MB in
layout five) fit the local server's 1 GB (vecgpt.backends.pgvector.server.LOCAL_SETTINGS); medium's (2.6 GB) do
not. This runs the small model on a local server of its own with each --buffers setting and prints the store's
seconds a token by kind and the buffer hits and reads PostgreSQL counted over the tokens.

    python experiments/07_sizes/pg_buffers.py [--buffers 1GB 128MB] [-n 5] [--model PATH] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def run(buffers: str, args) -> dict:
    from vecgpt import weights
    from vecgpt.backends.pgvector import server
    from vecgpt.config import load_config, open_store
    from vecgpt.engine import Engine
    from vecgpt.loading import drop, push, store_fingerprint

    folder = Path(args.data_dir) / f"pg-{buffers}"
    dsn = server.local_server(folder, settings={**server.LOCAL_SETTINGS, "shared_buffers": buffers})
    config = load_config(Path(__file__).resolve().parents[2] / "configs" / "pgvector.toml", layout="five")
    config.store = {"dsn": dsn, "schema": "vecgpt_buffers"}
    model = weights.load(args.model or str(weights.random_gpt2_small()))
    store = open_store(config)
    key = store_fingerprint(model, config.metric, "five")
    try:
        push(store, model, config.metric, progress=False, layout="five")
        text = Engine(store, model=key).open()
        cands = text.read([15496, 995])
        before, times = counts(store), []
        for _ in range(args.n):
            text.meter.start_token()
            t = time.perf_counter()
            cands = text.read([int(cands.ids[0])])
            times.append(time.perf_counter() - t)
        after = counts(store)
        kinds = text.meter.summary()["per_token"][1:]
        text.close()
        if not args.keep:
            drop(store, key)
    finally:
        store.close()
    by_kind = {k: sum(t["seconds_by_kind"].get(k, 0) for t in kinds) / len(kinds) for k in ("matrix", "token_search")}
    return {
        "buffers": buffers,
        "ms_per_token": 1e3 * sorted(times)[len(times) // 2],
        "store_ms_by_kind": {k: round(1e3 * v, 1) for k, v in by_kind.items()},
        "blocks_hit_per_token": (after[0] - before[0]) / args.n,
        "blocks_read_per_token": (after[1] - before[1]) / args.n,
    }


def counts(store) -> tuple[int, int]:
    """Shared-buffer hits and blocks read from outside them (the OS) in this database, so far."""
    import psycopg

    with psycopg.connect(store.dsn) as conn:
        row = conn.execute(
            "select blks_hit, blks_read from pg_stat_database where datname = current_database()"
        ).fetchone()
    return int(row[0]), int(row[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--buffers", nargs="+", default=["1GB", "128MB"])
    p.add_argument("-n", type=int, default=5)
    p.add_argument("--model", default=None, help="default: random weights at GPT-2 small's shape")
    p.add_argument("--data-dir", default=f"/var/tmp/vecgpt-sizes-{os.getuid()}")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    for buffers in args.buffers:
        print(run(buffers, args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
