"""Experiment 3: what a store holds after a load, by kind, and how long the load takes.

Each store is emptied of its model and loaded afresh (timed from the first write to the
manifest, which flushes local stores to disk). Then the store's own `stats()` gives documents
and bytes per collection, summed here by kind (a matrix name without its layer: attn.c_attn,
mlp.c_fc, ..., wte, wpe, ln), beside what `loading.plan` says a load writes (float32 vectors).
The puffergpt write-up reports 134,299 documents and 501 MB for GPT-2 small.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common/

from common.plots import pyplot, save_plot
from common.subjects import add_common_arguments, describe_variant, load_model, model_label, variants

NAME = "storage"
HELP = "documents and bytes each store holds after a load, by kind, and the load time"
WRITEUP = {"documents": 134_299, "megabytes": 501}
KINDS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "wte", "wpe", "ln")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, NAME)


def kind_of(collection: str) -> str:
    """h.3.attn.c_attn -> attn.c_attn; wte, wpe, ln as they are; anything else 'other'."""
    from vecgpt.loading import matrix_of

    m = re.fullmatch(r"h\.\d+\.(.+?)(\.\d+)?", matrix_of(collection))  # a head's part of attn.c_proj: attn.c_proj
    name = m.group(1) if m else matrix_of(collection)
    return name if name in KINDS else "other"


def by_kind(stats: dict) -> dict:
    """{collection: {documents, bytes}} -> {kind: {documents, bytes, collections}}, texts left out."""
    out = defaultdict(lambda: {"documents": 0, "bytes": 0, "collections": 0})
    for name, s in stats.items():
        if name.startswith("text-"):
            continue
        k = out[kind_of(name)]
        k["documents"] += int(s["documents"])
        k["bytes"] += int(s["bytes"])
        k["collections"] += 1
    return {k: dict(out[k]) for k in (*KINDS, "other") if k in out}


def planned(model, metric: str) -> dict:
    """What a load writes, from loading.plan: {kind: {documents, bytes}} of float32 vectors."""
    from vecgpt.loading import plan

    return by_kind({name: {"documents": n, "bytes": n * d * 4} for name, n, d in plan(model, metric)})


ONE_FILE_BESIDE = ("-wal", "-shm", ".wal")  # what SQLite and DuckDB keep beside a store's file


def disk_bytes(store) -> int | None:
    """Bytes under the store's folder, or of its file and its write-ahead log beside it (SQLite, DuckDB)."""
    path = getattr(store, "path", None) or getattr(store, "file", None)  # SQLite's store names its file `file`
    if not path:
        return None
    path = Path(path)
    if path.is_file():
        files = [path, *(path.with_name(path.name + end) for end in ONE_FILE_BESIDE)]
        return sum(f.stat().st_size for f in files if f.is_file())
    if not path.is_dir():
        return None
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def fresh_load(store, model, metric: str, progress: bool) -> float:
    """Drop `model` from the store if it holds it (other models stay), load it again; seconds taken."""
    from vecgpt.loading import drop, push, store_fingerprint

    drop(store, store_fingerprint(model, metric))
    t = time.perf_counter()
    push(store, model, metric, progress=progress, layout="four")  # the layout whose documents it counts
    return time.perf_counter() - t


def plot(results, path: Path, title: str) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(results) + 1.8))
    labels = [r["subject"] for r in results]
    left = [0.0] * len(results)
    kinds = [k for k in (*KINDS, "other") if any(k in r["by_kind"] for r in results)]
    for kind in kinds:
        mb = [r["by_kind"].get(kind, {}).get("bytes", 0) / 1e6 for r in results]
        ax.barh(labels, mb, left=left, label=kind)
        left = [a + b for a, b in zip(left, mb)]
    for i, r in enumerate(results):
        ax.text(left[i], i, f" {r['load_s']:.1f} s load", va="center", fontsize=8)
    ax.set_xlabel("MB held (store's own count)")
    ax.set_xlim(0, max(left) * 1.3 if max(left) else 1)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="lower right")
    ax.invert_yaxis()
    return save_plot(fig, path)


def run(args) -> int:
    from common.record import new_run

    model = load_model(args.model)
    out = new_run(NAME, args.out)
    vs = variants(args.configs, args.store_root, not args.no_swap)
    results = [measure(v, model, args) for v in vs]
    write(out, args, model, vs, results)
    return 0


def measure(v, model, args) -> dict:
    """Load the model afresh into one store variant: time, documents and bytes by kind, disk use."""
    from vecgpt.config import open_store
    from vecgpt.loading import collection, store_fingerprint

    print(f"{v.label} [{v.config_path}{', ' + v.note if v.note else ''}]", file=sys.stderr)
    store = open_store(v.config)
    try:
        load_s = fresh_load(store, model, v.config.metric, not args.quiet)
        mine = collection(store_fingerprint(model, v.config.metric), "")
        stats = {name: s for name, s in store.stats().items() if name.startswith(mine)}
        disk = disk_bytes(store)
    finally:
        store.close()
    kinds = by_kind(stats)
    return {
        "subject": v.label,
        "config": v.config_path,
        "metric": v.config.metric,
        "load_s": load_s,
        "documents": sum(k["documents"] for k in kinds.values()),
        "bytes": sum(k["bytes"] for k in kinds.values()),
        "disk_bytes": disk,
        "by_kind": kinds,
        "collections": stats,
        "planned": planned(model, v.config.metric),
    }


def write(out, args, model, vs, results) -> None:
    """storage.json, .md and .png in out; the tables on stdout."""
    from common.record import markdown_table, provenance, publish

    rows = [
        {
            "subject": r["subject"],
            "documents": f"{r['documents']:,}",
            "MB held": f"{r['bytes'] / 1e6:,.1f}",
            "MB on disk": "-" if r["disk_bytes"] is None else f"{r['disk_bytes'] / 1e6:,.1f}",
            "planned documents / MB (float32)": f"{sum(k['documents'] for k in r['planned'].values()):,} / "
            f"{sum(k['bytes'] for k in r['planned'].values()) / 1e6:,.1f}",
            "load s": f"{r['load_s']:.1f}",
            "documents / s": f"{r['documents'] / r['load_s']:,.0f}" if r["load_s"] else "-",
        }
        for r in results
    ]
    kind_rows = [
        {
            "kind": kind,
            "collections": r0["by_kind"][kind]["collections"],
            "documents": f"{r0['by_kind'][kind]['documents']:,}",
            **{f"{r['subject']} MB": f"{r['by_kind'].get(kind, {}).get('bytes', 0) / 1e6:,.2f}" for r in results},
        }
        for r0 in results[:1]
        for kind in r0["by_kind"]
    ]
    what = model_label(model, args.model)
    data = {
        "experiment": NAME,
        "provenance": provenance(seed=args.seed, model=model, model_name=args.model),
        "writeup_gpt2_small": WRITEUP,
        "variants": [describe_variant(v) for v in vs],
        "results": results,
        "table": rows,
        "by_kind_table": kind_rows,
    }
    md = (
        f"Storage after a fresh load; model {what}. The write-up (GPT-2 small): "
        f"{WRITEUP['documents']:,} documents, {WRITEUP['megabytes']} MB.\n\n"
        + markdown_table(rows)
        + "\n\nBy kind:\n\n"
        + (markdown_table(kind_rows) if kind_rows else "(nothing stored)")
    )
    publish(out, "storage", data, md, lambda path: plot(results, path, f"bytes held by kind\n{what}"))


if __name__ == "__main__":
    import common

    sys.exit(common.main(sys.modules[__name__]))
