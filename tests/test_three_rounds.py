"""Layout "three" (vecgpt.three_rounds): three rounds a layer, results within the derived bound of float64 numpy,
texts that resume and branch bit for bit, and a store holding the same model in both layouts."""

from __future__ import annotations

import pytest
from layouts import cli_runs, forced_comparison, loaded, resumes_and_branches, rounds_on_turbopuffer

from vecgpt.cli import main
from vecgpt.engine import Engine
from vecgpt.loading import push, store_fingerprint
from vecgpt.three_rounds import ThreeRounds


@pytest.mark.parametrize(
    "backend, metric", [("memory", "l2"), ("memory", "ip"), ("faiss", "l2"), ("faiss", "ip"), ("turbopuffer", "l2")]
)
def test_generation_agrees_with_float64_numpy(make_store, tiny_model, model64, backend, metric):
    """Every step within the bound derived in the three-rounds order (reference.three_round_heads)."""
    engine = loaded(make_store, backend, tiny_model, metric)
    r = forced_comparison(engine, model64, backend, metric, ThreeRounds)
    assert not r["violations"], r["violations"][:5]


def test_three_rounds_a_layer_on_the_local_turbopuffer(make_store, tiny_model):
    L = tiny_model.hparams.n_layer
    # the prompt block: open, lookup, per layer (c_attn + projected values), documents, the key search of its own
    # keys once written, c_fc, c_proj; token search;
    # decode: per layer (c_attn + projected values + key search), (c_fc + documents), c_proj; token search
    rounds_on_turbopuffer(make_store, tiny_model, "three", prompt=1 + 1 + 5 * L + 1, decode=3 * L + 1, matrix=2)


def test_a_text_resumes_and_branches_bit_for_bit(make_store, tiny_model, model64):
    """Resumed bit for bit (documents' norms recomputed from the rows); a branch checks against numpy."""
    resumes_and_branches(loaded(make_store, "memory", tiny_model), model64)


def test_a_store_holds_both_layouts(make_store, tiny_model):
    """Two keys, two manifests; the plain layout stays the default and is untouched by the other."""
    store = make_store("memory")
    plain, other = push(store, tiny_model, "l2", progress=False), push(store, tiny_model, "l2", False, "three")
    assert (plain["layout"], other["layout"]) == ("four", "three") and plain["fingerprint"] != other["fingerprint"]
    assert other["fingerprint"] == store_fingerprint(tiny_model, "l2", "three")
    assert type(Engine(store, model=plain["fingerprint"]).open()) is not ThreeRounds
    assert other["documents"] > plain["documents"]  # W_vo (d rows a head) and W_q's rows (d + 1 a head)


def test_the_cli_loads_and_generates_in_layout_three(capsys, tmp_path, tiny_model_dir, model64):
    """`vecgpt load --layout three`, then `generate --layout three` runs that model, in fewer rounds; a bad layout
    is argparse's one line, exit 2."""
    runs = cli_runs(capsys, tmp_path, tiny_model_dir, model64, "three")
    assert runs["three"]["requests"]["round_trips"] < runs["four"]["requests"]["round_trips"]
    store = ["--backend", "faiss", "--store", str(tmp_path / "faiss"), "--model", str(tiny_model_dir)]
    with pytest.raises(SystemExit) as bad:
        main(["load", *store, "--layout", "two"])
    err = capsys.readouterr().err
    assert bad.value.code == 2 and "invalid choice: 'two'" in err and "Traceback" not in err
