"""What a text's positions cost on turbopuffer at GPT-2 small's shape, through the adapter and the local server.

    python benchmarks/text_cost.py [-p 32] [--resume 1024]

Per position: 144 key rows (12 layers x 12 heads) of 64 floats, each with its value (64 payload floats), in
the default layout (a namespace per head, 2 copies; the payload, as base64 of float32, in the first copy only). Writes `-p` positions
one upsert each (as a decode step does), reads the logical bytes back from metadata, prices them at the
published prices; then clones the text both ways; then (`--resume N`) fetches N positions' keys with their
values at once, as a resume does (12 * 12 * N ids). Writes benchmarks/results/text_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np  # noqa: E402

from vecgpt.backends import turbopuffer as tpb  # noqa: E402
from vecgpt.backends.base import tally  # noqa: E402
from vecgpt.backends.turbopuffer.cost import PRICES, b64_length, dollars  # noqa: E402
from vecgpt.backends.turbopuffer.server import Running  # noqa: E402

LAYERS, HEADS, DIM = 12, 12, 64
ATTRS = ("layer", "head", "position")


def keys(positions: range, rng) -> tuple:
    rows = LAYERS * HEADS * len(positions)
    grid = np.array([(p, layer, h) for p in positions for layer in range(LAYERS) for h in range(HEADS)])
    ids = (grid[:, 0] * LAYERS + grid[:, 1]) * HEADS + grid[:, 2]
    attrs = {"layer": grid[:, 1], "head": grid[:, 2], "position": grid[:, 0]}
    vectors = rng.standard_normal((rows, DIM)).astype(np.float32)
    return ids, vectors, attrs, rng.standard_normal((rows, DIM)).astype(np.float32)


def write(store, name: str, positions: range, rng, per_position: bool) -> None:
    steps = [range(p, p + 1) for p in positions] if per_position else [positions]
    for step in steps:
        ids, vectors, attrs, payload = keys(step, rng)
        store.upsert(name, ids, vectors, attrs, payload=payload)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-p", type=int, default=32, help="positions written one upsert each")
    parser.add_argument("--resume", type=int, default=0, help="positions fetched at once (1024: 147,456 ids)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds a request may take ([store] timeout)")
    parser.add_argument("--out", default="benchmarks/results/text_cost.json")
    args = parser.parse_args()
    os.environ["TURBOPUFFER_API_KEY"] = "local"
    os.environ.pop("TURBOPUFFER_REGION", None)
    server, rng, out = Running(), np.random.default_rng(0), {}
    try:
        store = tpb.connect(base_url=server.url, prefix="bench-", max_retries=0, timeout=args.timeout)
        store.create("text-a", DIM, "l2", ATTRS, payload=DIM)
        write(store, "text-a", range(args.p), rng, per_position=True)
        logical = sum(t["bytes"] for t in store.leftover_texts()) / args.p
        usage = store.usage
        payload_bytes = LAYERS * HEADS * b64_length(DIM)  # base64 of float32, first copy only
        indexed = logical - payload_bytes
        out["per_position"] = {
            "logical_bytes": logical,
            "indexed_bytes": indexed,
            "payload_bytes": payload_bytes,
            "storage_dollars_month": indexed / 1e9 * PRICES["storage_gb_month"]
            + payload_bytes / 1e9 * PRICES["storage_gb_month"] * PRICES["unindexed_storage"],
            "decode_write_requests": usage["write_requests"] / args.p,
            "decode_write_dollars": dollars(usage) / args.p,
            "written_bytes_dollars": logical / 1e9 * PRICES["write_gb"],
        }
        for how in ("copy", "branch"):
            store.clone_with = how
            start = time.perf_counter()
            store.clone("text-a", f"text-{how}")
            out[f"clone_{how}"] = {**store.last_clone, "positions": args.p, "seconds": time.perf_counter() - start}
        if args.resume:
            store.create("text-r", DIM, "l2", ATTRS, payload=DIM)
            for start in range(0, args.resume, 64):
                write(store, "text-r", range(start, min(start + 64, args.resume)), rng, per_position=False)
            ids = np.arange(LAYERS * HEADS * args.resume)
            with tally() as counts:
                t = time.perf_counter()
                v, p = store.fetch("text-r", ids, payload=True)
                seconds = time.perf_counter() - t
            out["resume_fetch"] = {
                "ids": len(ids),
                **counts,
                "seconds": seconds,
                "shape": [list(v.shape), list(p.shape)],
            }
        store.close()
    finally:
        server.stop()
    print(json.dumps(out, indent=1))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
