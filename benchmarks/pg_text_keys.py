"""What a text's keys cost in pgvector at GPT-2 small's shape (12 layers x 12 heads, 64 dims, the value as
a 64-float payload): the time of one decode step's key write (144 rows, one upsert) into a logged table
(what the store makes), the same table UNLOGGED, and logged with synchronous_commit = off; the bytes a
position adds on disk (pg_total_relation_size); the time to fetch every row of a 1,024-position text.

    PYTHONPATH=. python benchmarks/pg_text_keys.py [--positions 1024]

Starts a throwaway local server (pgserver) with the store's default settings; prints a table.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from vecgpt.backends.pgvector import PgStore, local_server

L, H, HD, CTX = 12, 12, 64, 1024


def step_rows(rng, position):
    """One decode step's keys: a row per layer and head, ids as the engine numbers them."""
    layer, head = np.divmod(np.arange(L * H), H)
    ids = (layer * H + head) * CTX + position
    attrs = {"layer": layer, "head": head, "position": np.full(L * H, position)}
    return ids, rng.standard_normal((L * H, HD)).astype(np.float32), attrs, rng.standard_normal((L * H, HD))


def write_steps(store, name, positions, rng) -> np.ndarray:
    """Milliseconds per step's upsert."""
    times = []
    for position in range(positions):
        ids, keys, attrs, values = step_rows(rng, position)
        start = time.perf_counter()
        store.upsert(name, ids, keys, attrs, payload=values)
        times.append(time.perf_counter() - start)
    return np.array(times) * 1e3


def run(store, kind, positions, rng):
    name = f"text-{kind.replace(' ', '').replace('=', '')}"
    store.create(name, HD, "l2", ("layer", "head", "position"), payload=HD)
    table = store._table(store._col(name))
    if kind == "unlogged":
        store.conn.execute(f"ALTER TABLE {table.as_string(store.conn)} SET UNLOGGED")
    store.conn.execute(f"SET synchronous_commit = {'off' if 'off' in kind else 'on'}")
    ms = write_steps(store, name, positions, rng)[10:]  # the first few prepare the statement
    size = store.stats()[name]["bytes"]
    ids = np.arange(L * H * CTX).reshape(L * H, CTX)[:, :positions].ravel()
    start = time.perf_counter()
    store.fetch(name, rng.permutation(ids), payload=True)
    fetch_s = time.perf_counter() - start
    print(
        f"| {kind} | {np.median(ms):.2f} | {np.percentile(ms, 90):.2f} | {size / positions:,.0f} | "
        f"{len(ids):,} rows: {fetch_s:.2f} s |"
    )
    store.drop(name)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--positions", type=int, default=CTX)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    store = PgStore(local_server(tempfile.mkdtemp(prefix="vecgpt-pg-bench-"), cleanup="delete"), "bench")
    print("| text table | step write median ms | p90 ms | bytes per position | fetch with payload |")
    print("|---|---|---|---|---|")
    for kind in ("logged", "unlogged", "logged, synchronous_commit=off"):
        run(store, kind, args.positions, rng)
    store.close()


if __name__ == "__main__":
    main()
