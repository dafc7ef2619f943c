"""Round trips, seconds and dollars per token through turbopuffer's HTTP API, on the local server.

    python benchmarks/round_trips.py [-n 8] [--latency-ms 25] [--write-latency-ms 200] [--replicas 2]
                                     [--key-replicas 2] [--layouts] [--layout four|three|five|both|all]

Starts `vecgpt.backends.turbopuffer.server` in a subprocess with a fixed delay per request (the network; puffergpt sees
20-30 ms), loads a random GPT-2 small-shaped model (12 layers, 12 heads, 768 wide, 50,257 tokens) through
the official client, reads a ten-token prompt as one block, generates n tokens, and prints round trips
(sequential rounds, as `vecgpt.meter` counts them), requests, subqueries, seconds, and dollars at the
published prices. `--layouts` also times the two namespace layouts (per matrix vs per vector length).
`--layout` loads the model in that layout (`vecgpt load --layout`); `both` measures four and three in turn, on a fresh
server, and prints what layout "three" costs beside what it saves (docs/three-rounds.md); `all` measures the three
layouts in turn and prints, per kind of request, what a ten-token prompt and a generated token send and which sit
on the critical path, beside the write-up's 76 and 52 requests (benchmarks/results/requests_by_kind.md).
Writes benchmarks/results/round_trips.json (--layout both: three_rounds.json; all: requests_by_kind.json).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np  # noqa: E402

from vecgpt import tokenizer, weights  # noqa: E402
from vecgpt.backends import turbopuffer as tpb  # noqa: E402
from vecgpt.backends.base import get_store  # noqa: E402
from vecgpt.config import LAYOUTS  # noqa: E402
from vecgpt.engine import Engine  # noqa: E402
from vecgpt.loading import plan, push, store_fingerprint  # noqa: E402

PROMPT = "The history of the vector database begins in the nineteen"  # ten GPT-2 tokens


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=8, help="generated tokens")
    parser.add_argument("--latency-ms", type=float, default=25.0)
    parser.add_argument("--write-latency-ms", type=float, default=0.0, help="more before a write returns (commit)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--key-replicas", type=int, default=2)
    parser.add_argument(
        "--key-partition", default="head", help="'' keeps a text's keys in one namespace (and its copies)"
    )
    parser.add_argument("--layouts", action="store_true", help="also measure namespace per matrix vs per dimension")
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds a request may take (a big round on a busy machine)"
    )
    parser.add_argument("--layout", choices=[*LAYOUTS, "both", "all"], default="four", help="the model's layout")
    parser.add_argument("--out", default=None, help="JSON written (default by --layout, see above)")
    args = parser.parse_args(argv)
    default = {"both": "three_rounds", "all": "requests_by_kind"}.get(args.layout, "round_trips")
    args.out = args.out or f"benchmarks/results/{default}.json"
    return args


def model_dir(name: str | None = None) -> str:
    return name or str(weights.random_gpt2_small())


def start_server(latency_ms: float, write_latency_ms: float = 0.0):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vecgpt.backends.turbopuffer.server",
            "--port",
            str(port),
            "--latency-ms",
            str(latency_ms),
            "--write-latency-ms",
            str(write_latency_ms),
            "--api-key",
            os.environ["TURBOPUFFER_API_KEY"],
        ],
        stdout=subprocess.DEVNULL,
        # the server answers many requests at once, each on one thread: a BLAS call that spread over every core
        # from each request at once thrashed (12 searches of 10 x 770-wide rows: 3 s, one thread each: 0.2 s)
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the local server did not start")


def token_usage(store, fn):
    before = dict(store.usage)
    t = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t
    used = {k: store.usage[k] - before.get(k, 0) for k in store.usage}
    return out, seconds, used


def measure_layouts(url: str) -> dict:
    """Exact search for one vector over a 3,072-row matrix: its own namespace, or filtered out of one
    namespace holding every 769-wide matrix of GPT-2 small (124,009 rows, attribute `matrix`)."""
    import turbopuffer

    client = turbopuffer.Turbopuffer(base_url=url, max_retries=0)
    rng = np.random.default_rng(0)
    sizes = [2304, 768, 3072] * 12 + [50257]  # c_attn, attn.c_proj, c_fc per layer; wte
    total = sum(sizes)
    matrix = np.concatenate([np.full(n, i) for i, n in enumerate(sizes)])
    own, shared = client.namespace("layout-matrix"), client.namespace("layout-dim769")
    for start in range(0, total, 4000):
        sl = slice(start, min(start + 4000, total))
        v = rng.standard_normal((sl.stop - sl.start, 769)).astype(np.float32)
        shared.write(
            upsert_columns={"id": list(range(sl.start, sl.stop)), "vector": tpb.b64(v), "matrix": matrix[sl].tolist()},
            distance_metric="euclidean_squared",
        )
    v = rng.standard_normal((3072, 769)).astype(np.float32)
    own.write(
        upsert_columns={"id": list(range(3072)), "vector": tpb.b64(v), "row": list(range(3072))},
        distance_metric="euclidean_squared",
    )
    q = rng.standard_normal(769).astype(np.float32).tolist()
    out = {}
    for name, ns, filt in (
        ("namespace per matrix", own, ["row", "Gte", 0]),
        ("namespace per dimension + filter", shared, ["matrix", "Eq", 2]),
    ):
        times = []
        for _ in range(30):
            t = time.perf_counter()
            r = ns.with_raw_response.query(rank_by=["vector", "kNN", q], top_k=10000, filters=filt)
            rows = json.loads(r.read())["rows"]
            times.append(time.perf_counter() - t)
        out[name] = {
            "rows": len(rows),
            "median_ms": 1e3 * float(np.median(times)),
            "namespace_rows": 3072 if ns is own else total,
        }
    own.delete_all(), shared.delete_all()
    return out


def main():
    args = parse_args()
    model = weights.load(model_dir(args.model))
    if args.layout not in ("both", "all"):
        report(measure(model, args), args.out)
        return
    layouts = ("four", "three") if args.layout == "both" else ("four", "three", "five")
    runs = {layout: measure(model, argparse.Namespace(**{**vars(args), "layout": layout})) for layout in layouts}
    for r in runs.values():
        report(r, None)
    if args.layout == "both":
        compare_layouts(runs, args.out)
    else:
        by_kind_table(runs, args.out)


def measure(model, args, prefix: str = "bench-", max_retries: int = 0) -> dict:
    """Start the local server at args.latency_ms, load the model through the official client, read a text."""
    os.environ.setdefault("TURBOPUFFER_API_KEY", "local")
    os.environ.pop("TURBOPUFFER_REGION", None)
    proc, url = start_server(args.latency_ms, getattr(args, "write_latency_ms", 0.0))
    keys = ("latency_ms", "write_latency_ms", "replicas", "key_replicas", "key_partition")
    result = {k: getattr(args, k, 0.0) for k in keys}
    result["model"], layout = model.source, getattr(args, "layout", "four")
    result["layout"] = layout
    try:
        store = get_store(
            "turbopuffer",
            base_url=url,
            prefix=prefix,
            replicas=args.replicas,
            key_replicas=args.key_replicas,
            key_partition=args.key_partition,
            max_retries=max_retries,
            timeout=getattr(args, "timeout", 5.0),
        )
        _, load_s, load_used = token_usage(store, lambda: push(store, model, "l2", progress=True, layout=layout))
        print(
            f"load: {load_s:.1f} s, {load_used.get('write_requests', 0):.0f} write requests, "
            f"${tpb.dollars(load_used):.4f} in writes",
            file=sys.stderr,
        )
        result.update(measure_text(store, model, args, layout))
        result["load"] = {
            "seconds": load_s,
            "write_requests": load_used.get("write_requests", 0),
            "dollars": tpb.dollars(load_used),
        }
        if getattr(args, "layouts", False):
            result["layouts"] = measure_layouts(url)
        store.close()
    finally:
        proc.terminate()
        proc.wait(10)
    return result


def measure_text(store, model, args, layout: str = "four") -> dict:
    """A ten-token prompt, then args.n greedy tokens: round trips, requests, seconds and dollars."""
    ids = tokenizer.encode(PROMPT)
    assert len(ids) == 10, len(ids)
    text = Engine(store, model=store_fingerprint(model, "l2", layout)).open()
    cands, prompt_s, prompt_used = token_usage(store, lambda: text.read(ids))
    decode, cpu = [], []
    for _ in range(args.n):
        text.meter.start_token()
        before = time.process_time()  # this process's CPU, every thread: the client's, as the server runs apart
        cands, s, used = token_usage(store, lambda c=cands: text.read([int(c.ids[0])]))
        decode.append((s, used))
        cpu.append(time.process_time() - before)
    # A step's writes land beside the next step's searches and are billed in its window; the last step's land
    # here, after its read: counted in its tally, so the mean bills every step's writes once.
    _, _, landed = token_usage(store, text.drain)
    decode[-1] = (decode[-1][0], {k: decode[-1][1].get(k, 0) + landed.get(k, 0) for k in {*decode[-1][1], *landed}})
    summary = text.meter.summary()
    held = store.stats()
    text.close()
    first, toks = summary["per_token"][0], summary["per_token"][1:]
    return {
        "prompt_tokens": len(ids),
        "prompt": {
            "round_trips": first["round_trips"],
            "seconds": prompt_s,
            "requests": first["total"],
            "subqueries": first["subqueries"],
            "by_kind": first["by_kind"],
            "round_trips_by_kind": first["round_trips_by_kind"],
            "seconds_by_kind": first["seconds_by_kind"],
            "scores": first["scores"],
            "dollars": tpb.dollars(prompt_used),
        },
        "per_token": {**per_token(toks, decode), "client_cpu_seconds": float(np.median(cpu))},
        "stored_model": stored_model(model, args.replicas, layout),
        "text_bytes_per_position": held[text.name]["bytes"] / text.position,
        "text_memory_bytes_per_position": text.projected[:, :1].nbytes + text.key_norms[:, :, :1].nbytes,
        "floor_seconds_per_token": result_floor(toks, args.latency_ms),
    }


def per_token(toks, decode) -> dict:
    dollars = [tpb.dollars(u) for _, u in decode]
    return {
        "round_trips": float(np.mean([t["round_trips"] for t in toks])),
        "seconds": float(np.median([s for s, _ in decode])),
        "requests": float(np.mean([t["total"] for t in toks])),
        "subqueries": float(np.mean([t["subqueries"] for t in toks])),
        "by_kind": mean_by_kind(toks, "by_kind"),
        "round_trips_by_kind": mean_by_kind(toks, "round_trips_by_kind"),
        "seconds_by_kind": mean_by_kind(toks, "seconds_by_kind"),
        "scores": toks[-1]["scores"],
        "usage": decode[-1][1],
        "dollars_each": dollars,
        "seconds_each": [s for s, _ in decode],
        "dollars": float(np.mean(dollars)),
    }


def mean_by_kind(toks, field: str) -> dict:
    kinds = {k for t in toks for k in t[field]}
    return {k: float(np.mean([t[field].get(k, 0) for t in toks])) for k in sorted(kinds)}


def stored_model(model, replicas: int, layout: str = "four") -> dict:
    rows = plan(model, "l2", layout)
    stored_bytes = sum(n * (8 + 4 * d + 8) for _, n, d in rows) * replicas
    return {
        "documents": sum(n for _, n, _ in rows) * replicas,
        "bytes": stored_bytes,
        "dollars_per_month": stored_bytes / 1e9 * tpb.PRICES["storage_gb_month"],
    }


def result_floor(toks, latency_ms):
    return float(np.mean([t["round_trips"] for t in toks])) * latency_ms / 1e3


def report(r, out):
    p, t = r["prompt"], r["per_token"]
    print(
        f"\nturbopuffer over HTTP, local server at {r['latency_ms']:.0f} ms a request; GPT-2 small shape, random weights; "
        f"replicas={r['replicas']} key_replicas={r['key_replicas']} key_partition={r['key_partition']!r}"
    )
    print(
        f"  prompt of {r['prompt_tokens']} tokens: {p['round_trips']} round trips, {p['seconds']:.2f} s, "
        f"{p['requests']} requests ({p['subqueries']} subqueries), ${p['dollars']:.5f}"
    )
    print(
        f"  per generated token: {t['round_trips']:.0f} round trips, {t['seconds']:.2f} s "
        f"(floor {r['floor_seconds_per_token']:.2f} s at {r['latency_ms']:.0f} ms each), {t['requests']:.0f} requests "
        f"({t['subqueries']:.0f} subqueries), ${t['dollars']:.6f}; the client's CPU {t['client_cpu_seconds']:.2f} s"
    )
    print(f"    requests by kind: {t['by_kind']}")
    print(f"    seconds by kind: {t['seconds_by_kind']}")
    print(f"    billed: {t['usage']}")
    print(
        f"  load: {r['load']['seconds']:.0f} s, {r['load']['write_requests']:.0f} write requests, "
        f"${r['load']['dollars']:.3f}; stored model: {r['stored_model']['documents']:,} docs, "
        f"{r['stored_model']['bytes'] / 1e9:.3f} GB, ${r['stored_model']['dollars_per_month']:.3f} a month"
    )
    for name, m in r.get("layouts", {}).items():
        print(
            f"  layout {name}: {m['median_ms']:.1f} ms median for a {m['rows']}-row exact search "
            f"(namespace of {m['namespace_rows']:,} rows)"
        )
    if out is not None:
        write_json(r, out)


def write_json(r, out: str) -> None:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(r, f, indent=1, default=float)


def layout_row(r) -> dict:
    """What one layout costs: per generated token, the stored model, a text's rows."""
    t, s = r["per_token"], r["stored_model"]
    return {
        "rounds/token": t["round_trips"],
        "requests/token": t["requests"],
        "subqueries/token": t["subqueries"],
        "s/token": t["seconds"],
        "$/token": t["dollars"],
        "documents loaded": s["documents"],
        "GB loaded": s["bytes"] / 1e9,
        "$ load": r["load"]["dollars"],
        "$/month stored": s["dollars_per_month"],
        "text KB/position (store)": r["text_bytes_per_position"] / 1e3,
        "text KB/position (memory)": r["text_memory_bytes_per_position"] / 1e3,
    }


def compare_layouts(both: dict, out: str) -> None:
    """A table: each measure under layout four and three, and three / four."""
    rows = {layout: layout_row(r) for layout, r in both.items()}
    print(f"\n{'':28}{'four':>14}{'three':>14}{'three/four':>12}")
    for name, four in rows["four"].items():
        three = rows["three"][name]
        print(f"{name:28}{four:>14.6g}{three:>14.6g}{three / four if four else float('nan'):>12.3f}")
    write_json({"table": rows, "runs": both}, out)


# the write-up vecgpt grew from: requests a generated token and the first token (the prompt), one after another
WRITE_UP = {"prompt": 52, "token": 76}
# what each kind of request is, and whether the engine waits for it (the critical path)
KIND_ROWS = (
    ("matrix", "weight searches", "yes"),
    ("key_write", "key writes", "prompt only (a decode step's go from the writer thread)"),
    ("key_search", "key searches", "yes"),
    ("token_search", "token search", "yes"),
    ("lookup", "lookups (embeddings)", "yes, or in the token search's round"),
    ("open", "opening (layer norms)", "yes"),
    ("wait", "waits for a write to land", "yes (no request: seconds waited)"),
)


def by_kind_table(runs: dict, out: str) -> None:
    """Requests (round trips) per kind for a ten-token prompt and a generated token, each layout and the write-up."""
    head = "| kind | on the critical path | " + " | ".join(f"{lay}: prompt | {lay}: token" for lay in runs)
    lines = [head + " | write-up: prompt | write-up: token |", "|---" * (4 + 2 * len(runs)) + "|"]
    for kind, name, critical in KIND_ROWS:
        cells = [cell(r[part], kind) for r in runs.values() for part in ("prompt", "per_token")]
        lines.append(f"| {name} | {critical} | " + " | ".join(cells) + " |  |  |")
    totals = [
        f"**{r[p]['requests']:.0f} ({r[p]['round_trips']:.0f})**"
        for r in runs.values()
        for p in ("prompt", "per_token")
    ]
    lines.append(
        "| all requests (round trips) | | "
        + " | ".join(totals)
        + f" | {WRITE_UP['prompt']} ({WRITE_UP['prompt']}) | {WRITE_UP['token']} ({WRITE_UP['token']}) |"
    )
    seconds = [f"{r['prompt']['seconds']:.2f} s" for r in runs.values()]
    table = "\n".join(lines)
    print("\n" + table + "\n\nprompt seconds: " + ", ".join(seconds))
    write_json({"table": table, "write_up": WRITE_UP, "runs": runs}, out)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(table + "\n")


def cell(part: dict, kind: str) -> str:
    """'requests (round trips)', or for waits 'count, seconds'."""
    if kind == "wait":
        n = part["by_kind"].get("wait", 0)
        return f"{n:.0f}, {part['seconds_by_kind'].get('wait', 0.0):.2f} s" if n else "0"
    n, rounds = part["by_kind"].get(kind, 0), part["round_trips_by_kind"].get(kind, 0)
    return f"{n:.0f} ({rounds:.0f})" if n else "0"


if __name__ == "__main__":
    main()
