"""Layout "five" (vecgpt.five_rounds): the textbook order, five rounds a layer, results within the derived bound of
float64 numpy (and a wrong stored document caught by it), texts that resume and branch bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from layouts import PROMPT, cli_runs, forced_comparison, loaded, resumes_and_branches, rounds_on_turbopuffer

from vecgpt import tokenizer
from vecgpt.engine import Engine, Session
from vecgpt.five_rounds import FiveRounds
from vecgpt.loading import collection, matrices, push


@pytest.mark.parametrize(
    "backend, metric",
    [
        ("memory", "l2"),
        ("memory", "ip"),
        ("faiss", "l2"),
        ("faiss", "ip"),
        ("lancedb", "l2"),
        ("pgvector", "l2"),
        ("turbopuffer", "l2"),
    ],
)
def test_generation_agrees_with_float64_numpy(make_store, tiny_model, model64, backend, metric):
    """Every step within the bound derived in the plain order (reference.mha: heads side by side, then c_proj)."""
    r = forced_comparison(loaded(make_store, backend, tiny_model, metric, "five"), model64, backend, metric, FiveRounds)
    assert not r["violations"], r["violations"][:5]


def test_a_wrong_document_is_caught(make_store, tiny_model, model64):
    """One element of one stored row of layer 0's c_proj off by 1e-3 of the largest row norm M: the logits move by
    about 12 times the derived tol (6.5e-5 against 5.6e-6; the store's own error is 2e-7), and the rule says so."""
    engine = loaded(make_store, "memory", tiny_model, "l2", "five")
    name = collection(engine.key, "h.0.attn.c_proj")
    row = np.array([3])
    doc = engine.store.fetch(name, row)
    doc[0, 0] += 1e-3 * np.sqrt(engine.m2["h.0.attn.c_proj"])
    engine.store.upsert(name, row, doc, {"row": row})
    r = forced_comparison(engine, model64, "memory", "l2", FiveRounds, steps=4)
    print(f"planted: max error {r['max_error'].max():.2e}, tol up to {r['tol'].max():.2e}")
    assert r["violations"] and r["max_error"].max() > 5 * r["tol"].max()


def test_five_rounds_a_layer_on_the_local_turbopuffer(make_store, tiny_model):
    L = tiny_model.hparams.n_layer
    # the prompt block: open, lookup, per layer c_attn, the key search of its own keys once written, c_proj, c_fc,
    # mlp.c_proj; the token search; decode: the same rounds a layer; token search
    summary = rounds_on_turbopuffer(make_store, tiny_model, "five", 1 + 1 + 5 * L + 1, 5 * L + 1, matrix=4)
    assert summary["per_token"][-1]["by_kind"]["matrix"] == 4 * L  # no search per head: c_proj is one search


def test_a_text_keeps_raw_values(make_store, tiny_model):
    """A text row's payload and a text's kept values are hd wide, not d; the model has c_proj whole."""
    hp = tiny_model.hparams
    hd = hp.n_embd // hp.n_head
    engine = loaded(make_store, "memory", tiny_model, "l2", "five")
    with engine.open() as text:
        text.read(tokenizer.encode(PROMPT))
        assert text.row_widths() == (hd + 1, hd)  # an l2 key's row has its pad column (vecgpt.key_bounds)
        assert text.projected.shape == (hp.n_layer, hp.n_head, hp.n_ctx, hd)
        _, values = engine.store.fetch(text.name, text.key_ids(1, np.arange(hp.n_head), 2), payload=True)
        assert np.array_equal(values, text.projected[1, :, 2])
    names = matrices(hp, "five")
    assert "h.0.attn.c_proj" in names and not any(n.startswith("h.0.attn.c_proj.") for n in names)
    plain = push(engine.store, tiny_model, "l2", progress=False)
    assert plain["documents"] > engine.manifest["documents"]  # c_proj's d rows once, not once a head
    assert type(Engine(engine.store, model=plain["fingerprint"]).open()) is Session


def test_a_text_resumes_and_branches_bit_for_bit(make_store, tiny_model, model64):
    resumes_and_branches(loaded(make_store, "memory", tiny_model, "l2", "five"), model64)


def test_the_cli_loads_and_generates_in_layout_five(capsys, tmp_path, tiny_model_dir, model64):
    runs = cli_runs(capsys, tmp_path, tiny_model_dir, model64, "five")
    assert runs["five"]["requests"]["total"] < runs["four"]["requests"]["total"]  # one c_proj search, not H
