"""A layer's key filter in an in-process store as a text grows: which rows each head's key search scans.

    python benchmarks/key_filter.py [--contexts 28 200 800] [--tokens 40] [--out benchmarks/results/key_filter.json]

A text collection as the engine writes it at GPT-2 small shape (12 layers x 12 heads, 64 floats a key): a prompt
of each length, then --tokens decode steps, each writing its 144 rows and then filtering every layer's heads
(layer == l, head == h, position < end) as the key search does. Two ways, in turn on the same rows:
`Collection.group_slots` (the store's, for the grouped key search: a layer's rows remembered between calls by
head, only new rows tested) and one pass over every row per head (`Where.mask`, what a filter costs without it). Each is timed warm and after
64 MB are read (a token's scans leave the caches cold). Medians, microseconds a layer. Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import machine, pin_threads  # noqa: E402

THREADS = pin_threads(sys.argv)

import numpy as np  # noqa: E402

from vecgpt.backends import _text_log as text_log  # noqa: E402
from vecgpt.backends._in_process import Collection  # noqa: E402
from vecgpt.backends.base import Where  # noqa: E402
from vecgpt.backends.memory import NumpyTable  # noqa: E402

LAYERS, HEADS, HD, N_CTX = 12, 12, 64, 1024


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[28, 200, 800])
    parser.add_argument("--tokens", type=int, default=40, help="decode steps timed at each length")
    parser.add_argument("--out", default="benchmarks/results/key_filter.json")
    return parser.parse_args(argv)


def key_rows(positions, rng) -> text_log.Rows:  # every layer's and head's key at these positions
    layer, pos, head = (a.ravel() for a in np.meshgrid(np.arange(LAYERS), positions, np.arange(HEADS), indexing="ij"))
    keys = rng.standard_normal((len(pos), HD)).astype(np.float32)
    return text_log.Rows(
        (layer * HEADS + head) * N_CTX + pos, keys, {"layer": layer, "head": head, "position": pos}, keys
    )


def at_length(length: int, tokens: int, rng) -> dict:
    col = Collection(NumpyTable(HD, "ip"), ["layer", "head", "position"], HD)
    col.upsert(key_rows(np.arange(length), rng))
    flush, times = np.ones(16 << 20, np.float32), {}
    ways = {
        "remembered": lambda layer, end: col.group_slots(
            Where(eq={"layer": layer}, lt={"position": end}), "head", HEADS
        ),
        "every row": lambda layer, end: [
            np.flatnonzero(Where(eq={"layer": layer, "head": h}, lt={"position": end}).mask(col.attrs, col.table.n))
            for h in range(HEADS)
        ],
    }
    for step in range(tokens):
        end = length + step - 3  # the key search's end: the WINDOW latest are scored from memory
        col.upsert(key_rows(np.array([length + step]), rng))
        for layer in range(LAYERS):
            for name, way in ways.items():
                for cold in (False, True):
                    if cold:
                        flush.sum()
                    start = time.perf_counter()
                    found = way(layer, end)
                    times.setdefault((name, cold), []).append(time.perf_counter() - start)
                    assert all(len(rows) == end for rows in found)
    row = {"context": length, "rows": col.table.n}
    for (name, cold), ts in times.items():
        row[f"{name}{' cold' if cold else ''} us"] = 1e6 * float(np.median(ts[LAYERS:]))  # the first step warms up
    return row


def main():
    args = parse_args()
    rng, rows = np.random.default_rng(0), []
    for length in args.contexts:
        rows.append(at_length(length, args.tokens, rng))
        r = rows[-1]
        print(
            f"context {length:5d} ({r['rows']:,} rows): a layer's filter {r['remembered us']:6.0f} us "
            f"({r['remembered cold us']:.0f} cold), one pass over every row a head {r['every row us']:6.0f} us "
            f"({r['every row cold us']:.0f} cold)",
            flush=True,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**machine(THREADS), "tokens": args.tokens, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
