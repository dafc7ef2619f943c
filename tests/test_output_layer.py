"""Issue 7: the output layer as an ANN search (experiments/05_output_layer/, vecgpt experiment output-layer)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from vecgpt import tokenizer
from vecgpt.api import generate
from vecgpt.cli.experiments import experiments
from vecgpt.reference import Reference
from vecgpt.sampling import top_k

output_layer = experiments()["output-layer"]  # puts experiments/05_output_layer on sys.path, for output_index
from output_index import AnnReader, Head, Unavailable, expand, final_hidden, make  # noqa: E402

needs_hnswlib = pytest.mark.skipif(importlib.util.find_spec("hnswlib") is None, reason="needs hnswlib")


@pytest.fixture(scope="module")
def vectors():
    rng = np.random.default_rng(0)
    return rng.standard_normal((2000, 32)).astype(np.float32), rng.standard_normal((20, 32)).astype(np.float32)


def exact_ids(W, Q, k):
    return [set(top_k(W @ q, k).ids) for q in Q]


KINDS = [
    ("hnswlib", {"M": 16, "ef_construction": 100, "ef": 400}),
    ("hnswlib", {"M": 16, "ef_construction": 100, "ef": 400, "transform": "padded"}),
    ("faiss-hnsw", {"M": 16, "ef_construction": 100, "ef": 400}),
    ("faiss-hnsw", {"M": 16, "ef_construction": 100, "ef": 400, "transform": "padded"}),
    ("faiss-ivf", {"nlist": 16, "nprobe": 16}),
    ("faiss-ivfpq", {"nlist": 16, "nprobe": 16, "m": 8}),
]


@pytest.mark.parametrize(
    "kind,params", KINDS, ids=lambda p: p if isinstance(p, str) else "-".join(map(str, p.values()))
)
def test_index_kinds_find_the_exact_top(kind, params, vectors):
    pytest.importorskip("hnswlib" if kind == "hnswlib" else "faiss")
    W, Q = vectors
    index = make(kind, threads=1, **params).build(W)
    ids, scores = index.search(Q, 10)
    assert ids.shape == scores.shape == (len(Q), 10)
    found = np.mean([len(set(i) & e) / 10 for i, e in zip(ids, exact_ids(W, Q, 10))])
    assert found >= (0.5 if kind == "faiss-ivfpq" else 0.95)  # PQ ranks by compressed codes
    if index.exact_scores:  # reported scores are the inner products, up to float32 rounding
        np.testing.assert_allclose(scores, np.einsum("mkd,md->mk", W[ids].astype(np.float64), Q), atol=1e-3)
    assert index.memory_bytes() > 0 and index.build_seconds >= 0
    e_ids, e_scores = index.exact_search(Q[:2], 5)
    assert [set(r) for r in e_ids] == exact_ids(W, Q[:2], 5)


@needs_hnswlib
def test_head_adds_frequent_tokens_and_rescores_exactly(vectors):
    W, Q = vectors
    index = make("hnswlib", threads=1, M=8, ef_construction=20, ef=10).build(W)
    head = Head(index, W, k=5, always=[3, 7, 1999, 5000])  # 5000 is outside this vocabulary and is dropped
    c = head.candidates(Q[0])
    assert {3, 7, 1999} <= set(c.ids) and 5000 not in set(c.ids) and len(c.ids) <= 8
    np.testing.assert_allclose(c.logits, W[c.ids].astype(np.float64) @ Q[0].astype(np.float64), rtol=0, atol=1e-12)
    assert np.all(np.diff(c.logits) <= 0)


def test_grid_expansion_separates_build_and_search_parameters():
    builds = expand({"kind": "hnswlib", "M": [16, 32], "ef_construction": 100, "ef": [50, 100, 200]})
    assert [b for b, _ in builds] == [{"M": 16, "ef_construction": 100}, {"M": 32, "ef_construction": 100}]
    assert builds[0][1] == [{"ef": 50}, {"ef": 100}, {"ef": 200}]
    with pytest.raises(ValueError):
        make("hnswlib", nprobe=3)


def test_sampling_with_index_candidates(tiny_model):
    """Temperature / top-k sampling runs unchanged on the head's candidates; an exhaustive index matches exact."""
    pytest.importorskip("faiss")
    W = np.ascontiguousarray(tiny_model.params["wte"]["weight"][:2000])
    ids = tokenizer.encode("ROMEO:")

    class Exact:  # the reference body with the exact output layer over the same 2,000 tokens
        def __init__(self):
            self.ref = Reference(tiny_model)

        def read(self, t, k=40):
            return top_k(W @ final_hidden(self.ref, t)[-1], k)

    full = make("faiss-ivf", threads=1, nlist=8, nprobe=8).build(W)  # every list probed: exact
    for temperature, k in ((0.0, 40), (0.8, 10), (1.5, 40)):
        ann = generate(AnnReader(Reference(tiny_model), Head(full, W, k=50)), ids, 12, temperature, k, seed=3)
        exact = generate(Exact(), ids, 12, temperature, k, seed=3)
        assert ann.tokens == exact.tokens
    # a poor index: every drawn token is one of the candidates the head returned at that step
    poor = make("faiss-ivf", threads=1, nlist=32, nprobe=1).build(W)
    gen = generate(
        AnnReader(Reference(tiny_model), Head(poor, W, k=20, always=[tokenizer.ENDOFTEXT])),
        ids,
        12,
        1.0,
        40,
        seed=1,
        stop=False,
    )
    assert len(gen.tokens) == 12
    for tok, step in zip(gen.tokens, gen.steps):
        assert tok in [c[0] for c in step["candidates"]] and tok < 2000


GRID = """
[experiment]
vocab = 2000
frequent = 8
windows = 2
window = 24
prompts = ["ROMEO:", "The king"]
steps = 6
latency_queries = 10
whole_steps = 2

[[index]]
kind = "hnswlib"
M = 8
ef_construction = 40
ef = [10, 80]

[[index]]
kind = "faiss-ivf"
nlist = 16
nprobe = [1, 16]

[[index]]
kind = "turbopuffer"
"""


def test_experiment_runs_a_small_grid(tiny_model_dir, tmp_path):
    pytest.importorskip("faiss")
    pytest.importorskip("hnswlib")
    grid, corpus = tmp_path / "grid.toml", tmp_path / "corpus.txt"
    grid.write_text(GRID)
    corpus.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 40)
    out = tmp_path / "out"
    assert (
        output_layer.main(
            ["--config", str(grid), "--model", str(tiny_model_dir), "--corpus", str(corpus), "--out", str(out)]
        )
        == 0
    )
    result = json.loads((out / "results.json").read_text())
    rows = result["rows"]
    assert [r["label"].split()[0] for r in rows] == ["hnswlib", "hnswlib", "faiss-ivf", "faiss-ivf"]
    for r in rows:
        assert 0 <= r["recall@10"] <= 1 and 0 <= r["top1_agreement"] <= 1 and r["head_ms"] > 0
        assert r["ppl_floor"] >= 1 and r["ppl_full"] >= 1 and 0 <= r["target_miss"] <= 1
    assert rows[3]["recall@40"] == 1.0 and rows[3]["top1_agreement"] == 1.0  # nprobe = nlist is exhaustive
    assert rows[3]["identical_steps"] == [6, 6]
    assert any(s["what"].startswith("turbopuffer") for s in result["skipped"]) or any(
        r["kind"] == "turbopuffer" for r in rows
    )
    assert (out / "output_layer.png").stat().st_size > 0
    assert "Published figures" in (out / "results.md").read_text()
    assert output_layer.pareto([(1, 0.5), (2, 0.4), (0.5, 0.9), (1, 0.4)]) == [0, 1, 2]


def test_pgvector_exact_searches_never_use_the_ann_index(tmp_path):
    """The ANN index sits on its own table: the store's exact search on `wte` plans a sequential scan."""
    pytest.importorskip("psycopg")
    pytest.importorskip("pgvector")
    from vecgpt.backends.base import get_store

    import conftest

    try:
        options = conftest.store_options("pgvector", tmp_path)
    except Exception as e:  # noqa: BLE001 - no server here
        pytest.skip(f"no PostgreSQL with pgvector ({type(e).__name__})")
    rng = np.random.default_rng(0)
    W, q = rng.standard_normal((500, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    store = get_store("pgvector", **options)
    try:
        store.create("wte", 17, "ip", attrs=("row",))
        store.upsert("wte", np.arange(500), np.hstack([W, np.zeros((500, 1), np.float32)]), {"row": np.arange(500)})
        try:
            index = make(
                "pgvector",
                threads=1,
                method="hnsw",
                m=8,
                ef_construction=32,
                ef_search=40,
                dsn=options["dsn"],
                schema=options["schema"],
            ).build(W)
        except Unavailable as e:
            pytest.skip(str(e))
        try:
            plan = index.explain(q, 10)
            assert "wte_ann_hnsw_idx" in plan and "Index Scan" in plan
            assert "Index Scan" not in index.explain(q, 10, exact=True)
            # the store's own exact search, exactly as it sends it
            qv = np.append(q, 1).astype(np.float32)[None]
            part, params = store._search_sql(0, store._col("wte"), qv, 40, None, "wte")  # noqa: SLF001
            text = part.as_string(store.conn) if hasattr(part, "as_string") else part
            with store.conn.cursor(binary=True) as cur:
                rows = cur.execute("EXPLAIN " + text, params).fetchall()
            store_plan = "\n".join(r[0] for r in rows)
            assert "Seq Scan" in store_plan and "hnsw" not in store_plan and "Index Scan" not in store_plan
            ids, _ = index.search(q, 10)
            assert len(set(ids[0]) & set(top_k(W @ q, 10).ids)) >= 8
            assert store.collections() == ["wte"]  # the ANN table is not one of the store's collections
        finally:
            index.close()
    finally:
        store.close()


def test_turbopuffer_ann_on_the_local_server_is_labelled_exact(tmp_path):
    pytest.importorskip("turbopuffer")
    import conftest

    try:
        options = conftest.store_options("turbopuffer", tmp_path)
    except Exception as e:  # noqa: BLE001 - no local server here (starlette/uvicorn missing)
        pytest.skip(f"no local turbopuffer server ({type(e).__name__})")
    rng = np.random.default_rng(0)
    W, Q = rng.standard_normal((300, 16)).astype(np.float32), rng.standard_normal((3, 16)).astype(np.float32)
    index = make("turbopuffer", threads=1, base_url=options["base_url"], prefix=options["prefix"]).build(W)
    try:
        assert index.label == "turbopuffer ANN (exact: local server)"
        ids, scores = index.search(Q, 10)
        assert [set(r) for r in ids] == exact_ids(W, Q, 10)  # the local server's ANN is an exhaustive scan
        np.testing.assert_allclose(scores, np.einsum("mkd,md->mk", W[ids].astype(np.float64), Q), atol=1e-3)
    finally:
        index.close()
