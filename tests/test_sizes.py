"""Every GPT-2 size's shape, scaled down (weights.size_shape: heads kept at 12, 16, 20 and 25, each 64/SCALE wide,
depths 1:2:3:4), on every store and layout: greedy tokens are float64 numpy's and the logits within the derived
tolerance. `vecgpt make-model --size/--scale` writes those shapes."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from vecgpt import encoding, tolerance, weights
from vecgpt.backends.turbopuffer.plumbing import MAX_TOP_K
from vecgpt.cli import main
from vecgpt.config import preferred_metric
from vecgpt.engine import Engine
from vecgpt.loading import plan, push, store_fingerprint
from vecgpt.reference import Reference
from vecgpt.sampling import Candidates

from conftest import BACKENDS, tiny_params

SCALE = 16  # heads 4 wide, a twelfth of the layers: XL is 4 layers of 25 heads, 100 wide
PROMPT = [464, 2068, 1762, 318, 2939]  # ids below the scaled vocabulary's 3,141
STEPS = 3
# (size, layout) per store: every size and layout on memory, the odd head counts (20, 25) on every store, each
# layout on several. Layout three writes a collection a head's product (13x five's at XL), the dearest to load: it
# runs on memory, FAISS, SQLite and turbopuffer (its config's layout), at one size each.
FOUR_SIZES = [(size, "five") for size in weights.SIZES] + [("gpt2-xl", "four"), ("gpt2-xl", "three")]
ODD = [("gpt2-xl", "five")]  # 25 heads; 20 (large) on memory and turbopuffer
CASES = {
    "memory": FOUR_SIZES,
    "faiss": [("gpt2-xl", layout) for layout in ("four", "three", "five")],
    "pgvector": [("gpt2-xl", "four")],
    "turbopuffer": [("gpt2-large", "three")],
    "sqlite": [("gpt2-xl", "three")],
    "duckdb": [("gpt2-xl", "four")],
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each size's scaled checkpoint, written to disk and read back as a store would load it (float32) and as the
    reference runs it (float64). Random weights made larger (conftest.tiny_params) so attention is not uniform."""
    out = {}
    for name in weights.SIZES:
        hp = weights.size_shape(name, SCALE)
        path = weights.save(tmp_path_factory.mktemp(name), hp, tiny_params(hp, seed=len(out)))
        out[name] = (weights.load(str(path)), weights.load(str(path), dtype=np.float64))
    return out


def cases():
    for backend in BACKENDS:
        for size, layout in CASES.get(backend, ODD):
            yield pytest.param(backend, size, layout, id=f"{backend}-{size}-{layout}")


@pytest.mark.parametrize("backend, size, layout", list(cases()))
def test_greedy_tokens_are_numpys_at_every_size(make_store, checkpoints, backend, size, layout):
    model, model64 = checkpoints[size]
    store = limited(make_store, backend)
    metric = preferred_metric(backend)
    push(store, model, metric, progress=False, layout=layout)
    ref = Reference(model64, np.float64)
    want = greedy(ref, PROMPT, STEPS)
    exact = tolerance.forced_logits(model64, PROMPT, want)
    tol = tolerance.logit_tolerance(
        model64, PROMPT, want, metric, tolerance.unit_roundoff(backend), exact, layout=layout
    )
    assert np.all(tolerance.greedy_margin(exact) > 2 * tol)  # the precondition: no near tie at any step
    with Engine(store, model=store_fingerprint(model, metric, layout)).open() as text:
        assert text.hp.n_head == model.hparams.n_head
        cands = [text.read(PROMPT)]
        for _ in range(STEPS - 1):
            cands.append(text.read([int(cands[-1].ids[0])]))
    assert [int(c.ids[0]) for c in cands] == want
    broken = [d for c, row, t in zip(cands, exact, tol) for d in tolerance.disagreements(c, row, 40, t)]
    errors = [tolerance.max_error(c, row) for c, row in zip(cands, exact)]
    print(f"{backend} {size} {layout} {metric}: tol {tol.min():.2e}..{tol.max():.2e}, max error {max(errors):.2e}")
    assert not broken, broken[:5]


def limited(make_store, backend: str):
    """The store with its request limits scaled down with the model, so a search splits where it would at full
    size: SQLite's 4,096 rows a KNN under c_attn's 4,800 and c_fc's 6,400 at XL, turbopuffer's 10,000 and Milvus's
    16,384 under the 50,257 tokens."""
    if backend == "turbopuffer":
        return make_store(backend, max_top_k=MAX_TOP_K // SCALE)
    store = make_store(backend)
    if backend == "sqlite":
        store.limit //= SCALE
    if backend == "milvus":
        store.limits = dataclasses.replace(store.limits, top_k=store.limits.top_k // SCALE)
    return store


def test_documents_as_wide_as_gpt2_xls_widest(make_store, backend):
    """Full XL's widest documents (its MLP c_proj's rows: 6,400 inputs, the bias and the pad) at their real width:
    every row comes back at its distance within the derived bound, and a top-k search in numpy's order."""
    metric = preferred_metric(backend)
    dim = max(d for _, _, d in plan(weights.SIZES["gpt2-xl"], metric, "five"))
    assert dim == encoding.doc_dim(4 * 1600, metric)
    store, rng, n = make_store(backend), np.random.default_rng(4), 50
    x, q = rng.standard_normal((n, dim)).astype(np.float32), rng.standard_normal((2, dim)).astype(np.float32)
    store.create("wide", dim, metric)
    store.upsert("wide", np.arange(n) + 3, x)
    x64, q64 = x.astype(np.float64), q.astype(np.float64)
    truth = ((q64[:, None] - x64[None]) ** 2).sum(-1) if metric == "l2" else -(q64 @ x64.T)
    norms = np.linalg.norm(q64, axis=1)[:, None], np.linalg.norm(x64, axis=1)[None]
    bound = encoding.distance_bound(*norms, dim, metric, tolerance.unit_roundoff(backend))
    hits = store.search("wide", q)
    for row in range(2):
        order = np.argsort(hits.ids[row])
        assert hits.ids[row][order].tolist() == list(range(3, n + 3))
        assert np.all(np.abs(hits.dists[row][order] - truth[row]) <= bound[row])
    top = store.search("wide", q, k=5)
    for row in range(2):
        found = Candidates(top.ids[row] - 3, -top.dists[row].astype(np.float64))
        assert not tolerance.disagreements(found, -truth[row], 5, bound[row].max())


def greedy(ref: Reference, prompt: list[int], n: int) -> list[int]:
    logits = ref.logits(prompt)[-1]
    out = [int(np.argmax(logits))]
    while len(out) < n:
        out.append(int(np.argmax(ref.logits([out[-1]])[-1])))
    return out


@pytest.mark.parametrize("size, scale", [("gpt2-xl", 16), ("gpt2-large", 32), ("gpt2", 64)])
def test_make_model_writes_the_scaled_shape(capsys, tmp_path, size, scale):
    out = tmp_path / "m"
    assert main(["make-model", str(out), "--size", size, "--scale", str(scale)]) == 0
    assert str(out) in capsys.readouterr().out
    config, full = json.loads((out / "config.json").read_text()), weights.SIZES[size]
    assert (config["n_head"], config["n_embd"] // config["n_head"]) == (full.n_head, 64 // scale)
    model = weights.load(str(out))
    assert model.hparams == weights.size_shape(size, scale)
    assert model.params["wte"]["weight"].shape == (model.hparams.n_vocab, full.n_embd // scale)
    assert model.params["h"][0]["attn"]["c_attn"]["weight"].shape == (full.n_embd // scale, 3 * full.n_embd // scale)


def test_make_model_size_overridden_by_a_given_field(capsys, tmp_path):
    assert main(["make-model", str(tmp_path / "m"), "--size", "gpt2-large", "--scale", "16", "--layers", "1"]) == 0
    capsys.readouterr()
    assert weights.load(str(tmp_path / "m")).hparams == weights.HParams(1, 20, 80, 64, 3141)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--size", "gpt2-xl", "--scale", "3"], "--scale must divide a head's 64 columns"),
        # narrow fields beside it: were 0 read as no --scale, a tiny model would be written, not GPT-2 small's 0.5 GB
        (["--size", "gpt2", "--scale", "0", "--embd", "12", "--vocab", "16"], "--scale must divide a head's 64"),
        (["--size", "gpt2-xl", "--scale", "-4"], "--scale must divide a head's 64 columns"),
        (["--size", "gpt2-xl", "--scale", "128"], "--scale must divide a head's 64 columns"),
        (["--scale", "16"], "--scale scales a --size"),
    ],
)
def test_a_bad_scale_is_one_line_and_writes_nothing(capsys, tmp_path, argv, needle):
    code = main(["make-model", str(tmp_path / "m"), *argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("vecgpt: error")]
    assert code != 0 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "m").exists()
