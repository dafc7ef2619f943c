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
benchmarks/faiss_scans.py says why. The forms, and how each library holds the tables: benchmarks/library_forms.py.
Random weights unless --model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import machine, pin_threads, shape  # noqa: E402

THREADS = pin_threads(sys.argv)

import library_forms  # noqa: E402
import numpy as np  # noqa: E402
import per_token  # noqa: E402

from vecgpt import encoding, loading, tokenizer  # noqa: E402

STORES = ["faiss", "pgvector", "lancedb"]
PARTS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
TOP_K = 40
PROMPT = "The history of the vector database begins"


def documents(weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """vecgpt's l2 documents of a [in, out] weight, rows in memory order (encode_rows' are column-major)."""
    return np.ascontiguousarray(encoding.encode_rows(weight, bias, "l2")[0])


def matrix(model, name: str) -> np.ndarray:
    m = loading.get(model.params, name, model.hparams.n_head)
    return documents(m["weight"], m.get("bias"))


def scans(model) -> tuple[list, np.ndarray]:
    """The token's scans as (documents [rows, dim] float32, k: None for every row), and the tiny query's rows."""
    hp = model.hparams
    out = [(matrix(model, f"h.{i}.{part}"), None) for i in range(hp.n_layer) for part in PARTS]
    wte = documents(model.params["wte"]["weight"].T)  # [vocab, d]: a token's row is its document
    return out + [(wte, TOP_K)], matrix(model, "h.0.attn.c_proj.1")


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


def library_rows(store: str, tables, tiny, args) -> list[dict]:
    """Every form of one library: ms for a token's scans, and ms per tiny query (one table appended last)."""
    rng = np.random.default_rng(0)
    queries = [rng.standard_normal(rows.shape[1], np.float32) for rows, _ in tables + [(tiny, None)]]
    found = []
    for form, search in library_forms.FORMS[store](tables + [(tiny, None)], args.threads).items():
        token, calls = timed(search, list(enumerate(queries[:-1])), args.n)
        tiny_ms = timed(search, [(len(tables), queries[-1])] * 20, args.n)[0] / 20
        found.append({"library": store, "form": form, "ms_token_scans": token, "ms_tiny_query": tiny_ms})
        found[-1]["ms_by_matrix"] = by_matrix(calls)
        print(f"store_floors: {store}, {form}: {token:.1f} ms, tiny {tiny_ms:.3f} ms", file=sys.stderr, flush=True)
    return found


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

    rows, ms = result["rows"], [r["ms_token_scans"] for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(12, 0.4 * len(rows) + 1.6))
    ax.barh([f"{r['library']}: {r['form']}" for r in rows], ms, color=["grey"] + ["tab:blue"] * (len(rows) - 1))
    for y, (v, r) in enumerate(zip(ms, rows)):
        ax.text(v, y, f" {v:.1f} ms ({r['x_numpy_token']:.2f}x numpy's token)", va="center", fontsize=8)
    ax.axvline(result["numpy_reference_ms_token"], color="grey", linestyle="--", label="numpy's whole token")
    ax.set_xscale("log")
    ax.set_xlim(min(ms) / 2, max(ms) * 8)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("ms for a token's scans (log scale)")
    m = result["machine"]
    ax.set_title(f"{result['shape']}; {m['cpu']}, {m['threads']} threads; median of {result['n']}", fontsize=9)
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
