"""vecgpt's load against each store's own bulk path, on the same documents.

    python benchmarks/ingest.py [--stores faiss memory pgvector lancedb turbopuffer milvus sqlite duckdb]
                                [--model DIR] [--scale S] [--layers N] [--layout five] [--write-latency-ms 0]

For each store, in a place of its own (a temporary folder, a throwaway local PostgreSQL, a private local
turbopuffer server): vecgpt's load (`vecgpt.loading.push`: each matrix encoded and upserted in batches of 4,096
documents, the manifest last), then the same documents, encoded beforehand, written by the store's own bulk path:

    memory       each matrix as float64 with its norms faiss     IndexFlat.add of each matrix, written to disk
    pgvector     psycopg's binary COPY (pgvector's binary format, a row at a time) into a table made in the same
                 transaction, one transaction a matrix
    lancedb      one create_table of each matrix's pyarrow table (one Arrow append)
    turbopuffer  the official client, every namespace written at once (--bulk-threads), each in requests of
                 --bulk-request-mb; beside it, the service's documented 32 MB/s a namespace
    milvus       MilvusClient.insert in the largest requests allowed (64 MB), then a flush. bulk_insert needs a
                 server with object storage: Milvus Lite has none
    sqlite       every row of a matrix in one vec0 INSERT, in one transaction (WAL, chunks of 128 as the store's)
    duckdb       one INSERT ... SELECT from each matrix's Arrow table, then a checkpoint

The model is random weights at GPT-2 small shape (--model: any checkpoint; --scale S: GPT-2 small scaled down by S,
weights.size_shape). --layers N keeps the first N layers (default 2, with wte, wpe and the layer norms: the
output states it); --layers 0 keeps them all. Writes benchmarks/results/ingest.json and prints a table; the ratio
is vecgpt's seconds over the bulk path's (the goal: at most 2), and again less the seconds the documents' encoding
takes (timed apart, once: vecgpt's load encodes as it goes, the bulk paths are given them encoded). turbopuffer is
also loaded without its load_lock (a collection at a time, each upsert waited for). --repeat k: each in turn k
times, medians; --update keeps the other stores' rows of --out. Progress goes to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import busy_share, machine, pin_threads, settle, shape  # noqa: E402

THREADS = pin_threads(sys.argv)

import argparse  # noqa: E402
import base64  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import numpy as np  # noqa: E402

from vecgpt import encoding, weights  # noqa: E402
from vecgpt.backends.base import get_store  # noqa: E402
from vecgpt.config import load_config  # noqa: E402
from vecgpt.loading import get, ln_table, matrices, push  # noqa: E402

STORES = ("memory", "faiss", "pgvector", "lancedb", "turbopuffer", "milvus", "sqlite", "duckdb")
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TPUF_MB_S, TPUF_DOCS_S = 32.0, 10_000  # the service's documented write rate a namespace


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stores", nargs="+", default=list(STORES), choices=STORES)
    p.add_argument("--model", default=None, help="a checkpoint folder (default: random GPT-2 small)")
    p.add_argument("--scale", type=int, default=1, help="GPT-2 small's shape scaled down by this (random weights)")
    p.add_argument("--layers", type=int, default=2, help="the first N layers (0: every layer)")
    p.add_argument("--layout", default="five", choices=("four", "three", "five"))
    p.add_argument("--write-latency-ms", type=float, default=0.0, help="the local turbopuffer's commit delay")
    p.add_argument("--bulk-threads", type=int, default=8, help="turbopuffer: namespaces written at once")
    p.add_argument("--bulk-request-mb", type=float, default=64.0, help="turbopuffer: a bulk request's size")
    p.add_argument("--repeat", type=int, default=1, help="runs of each, in turn; the median reported")
    p.add_argument("--threads", type=int, default=THREADS)
    p.add_argument("--out", default="benchmarks/results/ingest.json")
    p.add_argument("--update", action="store_true", help="keep the other stores' rows of --out (same model)")
    return p.parse_args(argv)


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_model(args) -> weights.Model:
    if args.model:
        model = weights.load(args.model)
    elif args.scale > 1:
        folder = weights.default_models_dir() / f"gpt2-small-random-scale{args.scale}-s0"
        if not (folder / "model.safetensors").is_file():
            weights.make_model(folder, weights.size_shape("gpt2", args.scale), seed=0)
        model = weights.load(str(folder))
    else:
        model = weights.load(str(weights.random_gpt2_small()))
    hp = model.hparams
    if 0 < args.layers < hp.n_layer:  # the first layers, with the whole token and position tables
        hp = dataclasses.replace(hp, n_layer=args.layers)
        model = weights.Model(hp, {**model.params, "h": model.params["h"][: args.layers]}, model.source)
    return model


def documents(model: weights.Model, metric: str, layout: str) -> list[tuple[str, np.ndarray]]:
    """(collection, documents) of everything a load writes, encoded as loading.push encodes them."""
    out = []
    for name in matrices(model.hparams, layout):
        p = get(model.params, name, model.hparams.n_head)
        weight, bias = p["weight"].T if name == "wte" else p["weight"], p.get("bias")
        m2 = encoding.largest_norm2(weight, bias)
        out.append((name, encoding.encode_block(weight, bias, metric, m2, slice(0, weight.shape[1]))))
    out.append(("wpe", np.ascontiguousarray(model.params["wpe"]["weight"], np.float32)))
    return out + [("ln", np.ascontiguousarray(ln_table(model), np.float32))]


# --- the bulk paths: each writes [(name, docs)] into a fresh place of its own -------------------------------------


def bulk_memory(docs, place, metric, args):
    """The memory store's index: each matrix's rows in float64 with their squared norms, saved as float32."""
    for i, (_, d) in enumerate(docs):
        rows = d.astype(np.float64)
        np.einsum("ij,ij->i", rows, rows)
        np.save(Path(place) / f"{i}.npy", rows.astype(np.float32))


def bulk_faiss(docs, place, metric, args):
    import faiss

    for i, (_, d) in enumerate(docs):
        index = (faiss.IndexFlatIP if metric == "ip" else faiss.IndexFlatL2)(d.shape[1])
        index.add(d)
        faiss.write_index(index, str(Path(place) / f"{i}.faiss"))


def bulk_pgvector(docs, place, metric, args):
    import psycopg
    from pgvector.psycopg import register_vector
    from psycopg import sql

    from vecgpt.backends.pgvector.wide import PLAIN_MAX_DIM

    with psycopg.connect(place["dsn"]) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        register_vector(conn)
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(place["schema"])))
        conn.commit()
        for i, (_, d) in enumerate(docs):
            table = sql.Identifier(place["schema"], f"m{i}")
            storage = sql.SQL("PLAIN" if d.shape[1] <= PLAIN_MAX_DIM else "EXTERNAL")
            with conn.transaction():  # made in the same transaction: with wal_level minimal, no WAL
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE {} (id bigint PRIMARY KEY, row bigint NOT NULL, embedding vector({}) NOT NULL)"
                    ).format(table, sql.Literal(d.shape[1]))
                )
                conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN embedding SET STORAGE {}").format(table, storage))
                with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN WITH (FORMAT BINARY)").format(table)) as copy:
                    copy.set_types(["bigint", "bigint", "vector"])
                    for j, v in enumerate(d):
                        copy.write_row((j, j, v))


def bulk_lancedb(docs, place, metric, args):
    import lancedb
    import pyarrow as pa

    from vecgpt.backends.lancedb.table import fixed

    db = lancedb.connect(place)
    for i, (_, d) in enumerate(docs):
        ids = pa.array(np.arange(len(d)))
        db.create_table(f"m{i}", pa.Table.from_arrays([ids, fixed(d), ids], names=["id", "vector", "row"]))


def bulk_turbopuffer(docs, place, metric, args):
    import turbopuffer

    client = turbopuffer.Turbopuffer(base_url=place["url"], max_retries=3, timeout=600)
    per_row = 4 * -(-4 * docs[0][1].shape[1] // 3) + 40

    def write(i, d):
        ns, batch = client.namespace(f"{place['prefix']}m{i}"), max(1, int(args.bulk_request_mb * 1e6) // per_row)
        for start in range(0, len(d), batch):
            ids = list(range(start, min(start + batch, len(d))))
            vectors = [base64.b64encode(v.tobytes()).decode("ascii") for v in d[start : ids[-1] + 1]]
            ns.write(upsert_columns={"id": ids, "vector": vectors, "row": ids}, distance_metric="euclidean_squared")

    with ThreadPoolExecutor(args.bulk_threads) as pool:
        for f in [pool.submit(write, i, d) for i, (_, d) in enumerate(docs)]:
            f.result()


def bulk_milvus(docs, place, metric, args):
    from pymilvus import MilvusClient

    from vecgpt.backends.milvus.requests import Limits, row_batches
    from vecgpt.backends.milvus.schema import Info, flat_index, schema

    client = MilvusClient(str(Path(place) / "bulk.db"))
    for i, (_, d) in enumerate(docs):
        info = Info(d.shape[1], metric, ("row",), 0)
        name = f"bulk_m{i}"
        client.create_collection(name, schema=schema(client, info), index_params=flat_index(client, metric))
        for part in row_batches(len(d), info.row_bytes, Limits()):
            ids = range(part.start, part.stop)
            client.insert(name, [{"id": j, "vector": v, "row": j} for j, v in zip(ids, d[part])])
    for i in range(len(docs)):
        client.flush(f"bulk_m{i}")
    client.close()


def bulk_sqlite(docs, place, metric, args):
    import apsw
    import sqlite_vec

    conn = apsw.Connection(str(Path(place) / "bulk.db"))
    conn.enable_load_extension(True)
    conn.load_extension(sqlite_vec.loadable_path())
    conn.execute("PRAGMA journal_mode=WAL")  # as the store's file (vecgpt.backends.sqlite.db)
    conn.execute("PRAGMA synchronous=NORMAL")
    for i, (_, d) in enumerate(docs):
        with conn:  # one transaction
            conn.execute(
                f"CREATE VIRTUAL TABLE m{i} USING vec0(id integer primary key, "
                f"vector float[{d.shape[1]}] distance_metric=l2, row integer, chunk_size=128)"
            )
            conn.executemany(
                f"INSERT INTO m{i} (id, vector, row) VALUES (?, ?, ?)", ((j, v.tobytes(), j) for j, v in enumerate(d))
            )
    conn.close()


def bulk_duckdb(docs, place, metric, args):
    import duckdb
    import pyarrow as pa

    from vecgpt.backends.lancedb.table import fixed

    con = duckdb.connect(str(Path(place) / "bulk.duckdb"))
    for i, (_, d) in enumerate(docs):
        ids = pa.array(np.arange(len(d)))
        rows = pa.Table.from_arrays([ids, ids, fixed(d)], names=["id", "row", "v"])  # noqa: F841 (named in SQL)
        con.execute(f"CREATE TABLE m{i} (id BIGINT PRIMARY KEY, row BIGINT, v FLOAT[{d.shape[1]}])")
        con.execute(f"INSERT INTO m{i} SELECT * FROM rows")
    con.execute("CHECKPOINT")
    con.close()


# --- places: each store's vecgpt options and bulk place, made fresh and removed after -----------------------------


class Places:
    """Temporary folders, one throwaway PostgreSQL, one local turbopuffer server: made on first use, removed at
    close."""

    def __init__(self, args):
        self.root, self.args = tempfile.mkdtemp(prefix="vecgpt-ingest-"), args
        self.dsn = self.tpuf = None

    def folder(self, name: str) -> str:
        path = Path(self.root) / name
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def pg_dsn(self) -> str:
        if self.dsn is None:
            from vecgpt.backends.pgvector import local_server

            self.dsn = local_server(self.folder("pg") + "/data", cleanup="delete")  # the store's own settings
        return self.dsn

    def tpuf_url(self) -> str:
        if self.tpuf is None:
            from round_trips import start_server

            os.environ.setdefault("TURBOPUFFER_API_KEY", "local-ingest-key")
            os.environ.pop("TURBOPUFFER_REGION", None)
            self.tpuf = start_server(0.0, self.args.write_latency_ms)
        return self.tpuf[1]

    def options(self, name: str, run: int = 0, tag: str = "") -> tuple[dict, object]:
        """(vecgpt's [store] options, the bulk path's place), fresh for each run (and tag)."""
        tag = f"{tag}{run}"
        if name == "pgvector":
            return {"dsn": self.pg_dsn(), "schema": f"vecgpt_ingest{tag}"}, {
                "dsn": self.pg_dsn(),
                "schema": f"bulk{tag}",
            }
        if name == "turbopuffer":
            url = self.tpuf_url()
            options = {"base_url": url, "prefix": f"ingest{tag}-", "replicas": 1, "max_retries": 3, "timeout": 600}
            return options, {"url": url, "prefix": f"bulk{tag}-"}
        return {"path": str(Path(self.folder(f"{name}{tag}")) / "vecgpt")}, self.folder(f"{name}{tag}-bulk")

    def close(self) -> None:
        if self.tpuf is not None:
            self.tpuf[0].terminate()
            self.tpuf[0].wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)


def vecgpt_load(name: str, model, metric: str, layout: str, options: dict, serial: bool = False) -> dict:
    """vecgpt's load, timed whole and in its last step (the manifest: a store's seal, commit, index). serial: without
    the store's load_lock (turbopuffer: a collection at a time, each upsert waited for)."""
    store = get_store(name, **options)
    if serial:
        store.load_lock = contextlib.nullcontext
    sealed = []
    write_manifest = store.write_manifest

    def timed(key, manifest):
        t = time.perf_counter()
        write_manifest(key, manifest)
        sealed.append(time.perf_counter() - t)

    store.write_manifest = timed
    t = time.perf_counter()
    push(store, model, metric, progress=False, layout=layout)
    seconds = time.perf_counter() - t
    store.close()
    return {"seconds": seconds, "seal_seconds": sum(sealed)}


def measure_store(name: str, model, docs, metric: str, places: Places, args) -> dict:
    """vecgpt's load and the bulk path in turn, args.repeat times each, each in a fresh place; the medians."""
    n = sum(len(d) for _, d in docs)
    mb = sum(d.nbytes for _, d in docs) / 1e6
    runs = {"vecgpt": [], "seal": [], "bulk": [], "serial": [], "busy": []}
    for run in range(args.repeat):
        options, place = places.options(name, run)
        settle()
        runs["busy"].append(busy_share())
        progress(f"{name}: vecgpt's load of {n:,} documents ({mb:,.0f} MB), run {run + 1} of {args.repeat}")
        ours = vecgpt_load(name, model, metric, args.layout, options)
        runs["vecgpt"].append(ours["seconds"])
        runs["seal"].append(ours["seal_seconds"])
        if name == "turbopuffer":
            settle()
            progress(f"{name}: vecgpt's load a collection at a time")
            options, _ = places.options(name, run, "serial")
            runs["serial"].append(vecgpt_load(name, model, metric, args.layout, options, serial=True)["seconds"])
        settle()
        progress(f"{name}: the bulk path")
        t = time.perf_counter()
        globals()[f"bulk_{name}"](docs, place, metric, args)
        runs["bulk"].append(time.perf_counter() - t)
    ours_s, bulk_s = float(np.median(runs["vecgpt"])), float(np.median(runs["bulk"]))
    row = {
        "store": name,
        "metric": metric,
        "documents": n,
        "mb": mb,
        "vecgpt_s": ours_s,
        "vecgpt_seal_s": float(np.median(runs["seal"])),
        "bulk_s": bulk_s,
        "vecgpt_docs_per_s": n / ours_s,
        "bulk_docs_per_s": n / bulk_s,
        "vecgpt_mb_per_s": mb / ours_s,
        "bulk_mb_per_s": mb / bulk_s,
        "ratio": ours_s / bulk_s,
        "runs": runs,
    }
    if (
        name == "turbopuffer"
    ):  # the service's ceiling: every namespace at its documented rate, args.bulk_threads at once
        row["vecgpt_serial_s"] = float(np.median(runs["serial"]))
        row["serial_ratio"] = row["vecgpt_serial_s"] / bulk_s
        row["service_floor_s"] = service_floor(docs, args.bulk_threads)
        row["service_serial_s"] = service_floor(docs, 1)
        row["write_latency_ms"] = args.write_latency_ms
    progress(f"{name}: vecgpt {ours_s:.1f} s, bulk {bulk_s:.1f} s, ratio {row['ratio']:.2f}")
    return row


def service_floor(docs, parallel: int) -> float:
    """Seconds the service's documented write rate a namespace (32 MB/s of float32 vectors, 10,000 documents a
    second) allows, a namespace a matrix, `parallel` at once, the largest first. Commit latency not counted."""
    lanes = [0.0] * parallel
    for _, d in sorted(docs, key=lambda x: -x[1].nbytes):
        lanes[lanes.index(min(lanes))] += max(d.nbytes / 1e6 / TPUF_MB_S, len(d) / TPUF_DOCS_S)
    return max(lanes)


def table(result: dict) -> str:
    head = "| store | documents | MB | vecgpt s | docs/s | MB/s | bulk s | docs/s | MB/s | ratio | less encoding |"
    lines = [head, "|" + "---|" * 11]
    for r in result["rows"]:
        lines.append(
            f"| {r['store']} ({r['metric']}) | {r['documents']:,} | {r['mb']:,.0f} | {r['vecgpt_s']:.1f} | "
            f"{r['vecgpt_docs_per_s']:,.0f} | {r['vecgpt_mb_per_s']:.1f} | {r['bulk_s']:.1f} | "
            f"{r['bulk_docs_per_s']:,.0f} | {r['bulk_mb_per_s']:.1f} | {r['ratio']:.2f} | "
            f"{(r['vecgpt_s'] - r['encode_s']) / r['bulk_s']:.2f} |"
        )
    for r in result["rows"]:
        if "vecgpt_serial_s" in r:
            lines.append(
                f"\n{r['store']}: a collection at a time (no load_lock) {r['vecgpt_serial_s']:.1f} s, ratio "
                f"{r['serial_ratio']:.2f}; the local server's write latency {r['write_latency_ms']:g} ms. At the "
                f"service's documented {TPUF_MB_S:g} MB/s a namespace: {r['service_serial_s']:.1f} s a namespace at a "
                f"time, {r['service_floor_s']:.1f} s with {result['bulk_threads']} at once"
            )
    return "\n".join(lines)


def main():
    args = parse_args()
    model = load_model(args)
    hp = model.hparams
    what = f"{shape(hp)}: every matrix of layout {args.layout}, wpe and the layer norms"
    if args.layers:
        what += f" (the first {hp.n_layer} layers of the checkpoint, and its whole wte)"
    progress(what)
    places, rows, encoded = Places(args), [], {}
    try:
        for name in args.stores:
            metric = load_config(CONFIGS / f"{name}.toml").metric or "l2"
            if metric not in encoded:
                t = time.perf_counter()
                encoded[metric] = (documents(model, metric, args.layout), time.perf_counter() - t)
            docs, encode_s = encoded[metric]
            rows.append({**measure_store(name, model, docs, metric, places, args), "encode_s": encode_s})
    finally:
        places.close()
    if args.update and Path(args.out).is_file():
        held = json.loads(Path(args.out).read_text())
        if held["what"] != what:
            raise SystemExit(f"--update: {args.out} holds another model or subset ({held['what']})")
        rows = [r for r in held["rows"] if r["store"] not in args.stores] + rows
        rows.sort(key=lambda r: STORES.index(r["store"]))
    result = {
        "what": what,
        "layout": args.layout,
        "bulk_threads": args.bulk_threads,
        "repeat": args.repeat,
        "model": model.source,
        "rows": rows,
        **machine(args.threads),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(what)
    print(table(result))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
