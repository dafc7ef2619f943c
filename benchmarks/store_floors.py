"""What each store's library costs, used directly and alone, for the exact scans of one generated token, against
numpy float32 in the same run (issue 15 item 4: can FAISS 1.3x, pgvector 6x, LanceDB 10x numpy be met at all?).

    python benchmarks/store_floors.py [--stores faiss pgvector lancedb] [--threads 2] [-n 7] [--model DIR]
                                      [--out benchmarks/results/store_floors.json]

A token's scans, the fewest any layout sends (49 at GPT-2 small): per layer c_attn, attn.c_proj (whole),
c_fc and mlp.c_proj, each one exact search returning every row, then the wte top-40. The documents are
vecgpt's l2 documents (loading.get + encoding.encode_rows: the matrix's columns with bias and pad), the
queries random vectors of their width. The tiny query is one head's c_proj (768 rows of 66 floats),
timed alone: layout four sends 144 of those a token besides. Each form runs its tokens in a row (the first
a warm-up, so tables are in the page cache or shared_buffers) and reports the median; not in turn, as
benchmarks/faiss_scans.py says why. Results are taken as the library hands them over (FAISS's arrays,
psycopg's rows or arrays, a pyarrow table), not converted further. Random weights unless --model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import machine, pin_threads, shape  # noqa: E402

THREADS = pin_threads(sys.argv)

import numpy as np  # noqa: E402
import per_token  # noqa: E402

from vecgpt import encoding, loading, tokenizer  # noqa: E402

STORES = ["faiss", "pgvector", "lancedb"]
PARTS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
TOP_K = 40
PROMPT = "The history of the vector database begins"


def documents(model, name: str) -> np.ndarray:
    m = loading.get(model.params, name, model.hparams.n_head)
    return np.ascontiguousarray(encoding.encode_rows(m["weight"], m.get("bias"), "l2")[0])  # rows in memory order


def scans(model) -> tuple[list, np.ndarray]:
    """The token's scans as (documents [rows, dim] float32, k: None for every row), and the tiny query's rows."""
    hp = model.hparams
    out = [(documents(model, f"h.{i}.{part}"), None) for i in range(hp.n_layer) for part in PARTS]
    wte = encoding.encode_rows(model.params["wte"]["weight"].T, None, "l2")[0]  # [vocab, d]: its rows are the documents
    return out + [(wte, TOP_K)], documents(model, "h.0.attn.c_proj.1")


def timed(search, calls: list, n: int) -> tuple[float, np.ndarray]:
    """n tokens after one warm-up, a token being search(i, q) for every (i, q) in order: the median ms of a
    token, and of each call."""
    ms = np.zeros((n + 1, len(calls)))
    for t in range(n + 1):
        for j, (i, q) in enumerate(calls):
            start = time.perf_counter()
            search(i, q)
            ms[t, j] = 1e3 * (time.perf_counter() - start)
    return float(np.median(ms[1:].sum(axis=1))), np.median(ms[1:], axis=0)


def by_matrix(ms: np.ndarray) -> dict:
    """A token's per-call medians summed by matrix over the layers (the wte search last)."""
    layers = ms[:-1].reshape(-1, len(PARTS)).sum(axis=0)
    return {**dict(zip(PARTS, layers.tolist())), "wte": float(ms[-1])}


def numpy_forms(tables, threads):
    outs = [np.empty(len(rows), np.float32) for rows, _ in tables]

    def sgemv(i, q):
        rows, k = tables[i]
        np.matmul(rows, q, out=outs[i])
        return outs[i] if k is None else np.argpartition(-outs[i], k)[:k]

    return {"sgemv (documents @ q)": sgemv}


def faiss_forms(tables, threads):
    import faiss
    import faiss_scans

    faiss.omp_set_num_threads(threads)
    indexes = {kind: [] for kind in ("IP", "L2")}
    for rows, _ in tables:
        for kind, index in indexes.items():
            index.append(getattr(faiss, f"IndexFlat{kind}")(rows.shape[1]))
            index[-1].add(rows)
    outs = [np.empty(len(rows), np.float32) for rows, _ in tables]

    def flat(kind):
        return lambda i, q: indexes[kind][i].search(q[None], tables[i][1] or len(tables[i][0]))

    def kernel(threads):
        def run(i, q):
            faiss_scans.scan(tables[i][0], q, outs[i], threads)
            k = tables[i][1]
            return outs[i] if k is None else np.argpartition(-outs[i], k)[:k]

        return run

    return {
        "IndexFlatIP.search, k = all rows": flat("IP"),
        "IndexFlatL2.search, k = all rows": flat("L2"),
        "fvec_inner_products_ny, 1 thread": kernel(1),
        f"fvec_inner_products_ny, rows split over {threads} threads": kernel(threads),
    }


def pg_table(conn, name: str, rows: np.ndarray) -> int:
    """A PLAIN table of the rows; one wider than a page holds as two rows a document (id 2j + p, half each)."""
    from vecgpt.backends.pgvector.statements import copy_stream
    from vecgpt.backends.pgvector.wide import PLAIN_MAX_DIM, parts_for, split

    parts = parts_for(rows.shape[1]) if rows.shape[1] > PLAIN_MAX_DIM else 1
    rows = split(rows, parts)
    conn.execute(f"CREATE TABLE {name} (id bigint, embedding vector({rows.shape[1]}))")
    conn.execute(f"ALTER TABLE {name} ALTER COLUMN embedding SET STORAGE PLAIN")
    with conn.cursor().copy(f"COPY {name} FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(copy_stream(np.arange(len(rows)), [], [rows]))
    conn.execute(f"VACUUM ANALYZE {name}")
    return parts


def pg_statement(name: str, parts: int, k: int | None, aggregated: bool, pages=(0, None)) -> str:
    """A scan's SQL, over the rows in pages [lo, hi) (a ctid range; hi None: to the end)."""
    cases = " ".join(f"WHEN {p} THEN %s" for p in range(parts))
    q = "%s" if parts == 1 else f"CASE id %% {parts} {cases} END"  # a wide document's part p: the query's part p
    dist, (lo, hi) = f"embedding <-> {q}", pages
    bounds = ([f"ctid >= '({lo},0)'::tid"] if lo else []) + ([f"ctid < '({hi},0)'::tid"] if hi else [])
    rows = f"{name} WHERE {' AND '.join(bounds)}" if bounds else name
    if k is not None:
        top = f"SELECT id, {dist} AS d FROM {rows} ORDER BY d LIMIT {k}"
        return f"SELECT array_agg(id), array_agg(d) FROM ({top}) s" if aggregated else top
    return f"SELECT array_agg(id), array_agg({dist}) FROM {rows}" if aggregated else f"SELECT id, {dist} FROM {rows}"


def pg_connect(dsn: str):
    import psycopg
    from pgvector.psycopg import register_vector

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    register_vector(conn)
    return conn


def page_ranges(pages: int, split: int) -> list[tuple[int, int | None]]:
    return [(pages * s // split, pages * (s + 1) // split if s < split - 1 else None) for s in range(split)]


def pgvector_forms(tables, threads):
    from vecgpt.backends.pgvector.server import local_server

    dsn = local_server(tempfile.mkdtemp(prefix="vecgpt-floors-pg-"), cleanup="delete")
    conns = [pg_connect(dsn) for _ in range(threads)]
    parts = [pg_table(conns[0], f"t{i}", rows) for i, (rows, _) in enumerate(tables)]
    pages = [
        conns[0].execute(f"SELECT relpages FROM pg_class WHERE relname = 't{i}'").fetchone()[0]
        for i in range(len(tables))
    ]
    helpers = ThreadPoolExecutor(max(1, threads - 1))

    def one(conn, statement, params):
        return conn.execute(statement, params, binary=True, prepare=True).fetchall()

    def form(aggregated: bool, split: int = 1):
        sqls = [
            [pg_statement(f"t{i}", p, k, aggregated, r) for r in page_ranges(pages[i], split)]
            for i, (p, (_, k)) in enumerate(zip(parts, tables))
        ]

        def run(i, q):
            halves = np.array_split(np.pad(q, (0, -len(q) % parts[i])), parts[i])
            others = [helpers.submit(one, c, statement, halves) for c, statement in zip(conns[1:], sqls[i][1:])]
            found = [one(conns[0], sqls[i][0], halves)] + [f.result() for f in others]
            return found[0] if split == 1 else merged(found, tables[i][1])

        return run

    forms = {
        "SELECT id, embedding <-> q (binary)": form(False),
        "SELECT array_agg(id), array_agg(distance)": form(True),
    }
    if threads > 1:  # a helper connection on a thread of its own scans the other pages, as vecgpt's store does
        forms[f"array_agg, pages split over {threads} connections"] = form(True, threads)
    return forms


def merged(found: list, k: int | None):
    """The split scans' (ids, distances) arrays as one; a top-k search's k nearest of them."""
    ids, dists = (np.concatenate([np.asarray(f[0][c]) for f in found]) for c in (0, 1))
    return (ids, dists) if k is None else ids[np.argsort(dists, kind="stable")[:k]]


def lancedb_forms(tables, threads):
    import lancedb
    import pyarrow as pa

    db = lancedb.connect(tempfile.mkdtemp(prefix="vecgpt-floors-lance-"))
    handles = []
    for i, (rows, _) in enumerate(tables):
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(rows.ravel()), rows.shape[1])
        whole = pa.table({"id": np.arange(len(rows)), "vector": vectors})
        # in batches of loading.BATCH rows, as vecgpt writes: wte written whole scanned 2.7x slower (docs/speed.md)
        handles.append(db.create_table(f"t{i}", pa.Table.from_batches(whole.to_batches(max_chunksize=loading.BATCH))))

    def form(batch: int):
        def run(i, q):
            query = handles[i].search(np.vstack([q] * batch) if batch > 1 else q).distance_type("dot")
            return query.limit(tables[i][1] or len(tables[i][0])).select(["id", "_distance"]).to_arrow()

        return run

    return {"search(q).limit(rows).to_arrow()": form(1), "search([q, q]) (2-query batch, both kept)": form(2)}


def library_rows(store: str, tables, tiny, args) -> list[dict]:
    """Every form of one library: ms for a token's scans, and ms per tiny query (one table appended last)."""
    rng = np.random.default_rng(0)
    queries = [rng.standard_normal(rows.shape[1], np.float32) for rows, _ in tables + [(tiny, None)]]
    found = []
    for form, search in FORMS[store](tables + [(tiny, None)], args.threads).items():
        token, calls = timed(search, list(enumerate(queries[:-1])), args.n)
        tiny_ms = timed(search, [(len(tables), queries[-1])] * 20, args.n)[0] / 20
        found.append({"library": store, "form": form, "ms_token_scans": token, "ms_tiny_query": tiny_ms})
        found[-1]["ms_by_matrix"] = by_matrix(calls)
        print(f"store_floors: {store}, {form}: {token:.1f} ms, tiny {tiny_ms:.3f} ms", file=sys.stderr, flush=True)
    return found


FORMS = {"numpy": numpy_forms, "faiss": faiss_forms, "pgvector": pgvector_forms, "lancedb": lancedb_forms}


def measure(model, stores: list[str], threads: int, n: int) -> dict:
    """The whole record: numpy's reference token and sgemv, then each library's forms, ratios to numpy's."""
    args = argparse.Namespace(threads=threads, n=n)
    stated = machine(threads)
    reference = per_token.reference_row(model, tokenizer.encode(PROMPT), n)["per_token_s"] * 1e3
    tables, tiny = scans(model)
    rows = [r for store in ["numpy", *stores] for r in library_rows(store, tables, tiny, args)]
    sgemv = rows[0]["ms_token_scans"]
    for r in rows:
        r["x_numpy_token"], r["x_numpy_sgemv"] = r["ms_token_scans"] / reference, r["ms_token_scans"] / sgemv
        r["best"] = r["ms_token_scans"] == min(s["ms_token_scans"] for s in rows if s["library"] == r["library"])
    return {
        "command": "python benchmarks/store_floors.py " + " ".join(sys.argv[1:]),
        "model": model.source,
        "shape": shape(model.hparams),
        "scans_per_token": len(tables),
        "tiny_query": list(tiny.shape),
        "n": n,
        "numpy_reference_ms_token": reference,
        "machine": stated,
        "rows": rows,
    }


def table(result) -> str:
    m = result["machine"]
    lines = [
        f"{result['shape']}: {result['scans_per_token']} scans a token, median of {result['n']} tokens; numpy's "
        f"whole reference token {result['numpy_reference_ms_token']:.1f} ms; {m['cpu']}, {m['threads']} threads",
        f"{'library':9s} {'form':48s} {'ms/token':>9s} {'x token':>8s} {'x sgemv':>8s} {'ms/tiny':>8s}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['library']:9s} {r['form'][:48]:48s} {r['ms_token_scans']:9.1f} {r['x_numpy_token']:8.2f} "
            f"{r['x_numpy_sgemv']:8.2f} {r['ms_tiny_query']:8.3f}" + (" *" if r["best"] else "")
        )
    lines.append("* the library's best form; its token by matrix (ms, all layers):")
    for r in (r for r in result["rows"] if r["best"]):
        lines.append(f"  {r['library']:9s} " + ", ".join(f"{k} {v:.1f}" for k, v in r["ms_by_matrix"].items()))
    return "\n".join(lines)


def plot(result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.6))
    ax.barh([f"{r['library']}: {r['form']}" for r in rows], [r["ms_token_scans"] for r in rows], color="tab:blue")
    for y, r in enumerate(rows):
        label = f" {r['ms_token_scans']:.1f} ms ({r['x_numpy_token']:.2f}x numpy's token)"
        ax.text(r["ms_token_scans"], y, label, va="center", fontsize=8)
    ax.axvline(result["numpy_reference_ms_token"], color="grey", linestyle="--", label="numpy's whole token")
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    ax.set_xlabel("ms for a token's scans (log scale)")
    ax.set_title(f"{result['shape']}; {result['machine']['cpu']}, {result['machine']['threads']} threads", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", nargs="+", default=STORES, choices=STORES)
    parser.add_argument("--threads", type=int, default=2, help="BLAS/OpenMP threads (pinned before numpy loads)")
    parser.add_argument("-n", type=int, default=7, help="tokens timed per form (after one warm-up)")
    parser.add_argument("--model", default=None, help="model folder (default: random GPT-2 small shape)")
    parser.add_argument("--out", default="benchmarks/results/store_floors.json")
    args = parser.parse_args()
    result = measure(per_token.load_model(args.model), args.stores, args.threads, args.n)
    print(table(result))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
