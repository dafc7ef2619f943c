"""Layout "three" (vecgpt.three_rounds): three rounds a layer, results within the derived bound of float64 numpy,
texts that resume and branch bit for bit, and a store holding the same model in both layouts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vecgpt import tokenizer, tolerance, weights
from vecgpt.api import generate
from vecgpt.cli import main
from vecgpt.engine import Engine
from vecgpt.loading import push, store_fingerprint
from vecgpt.reference import Reference
from vecgpt.text import Text
from vecgpt.three_rounds import ThreeRounds

PROMPT = "The quick brown fox jumps over"


@pytest.fixture(scope="module")
def model64(tiny_model_dir):
    return weights.load(str(tiny_model_dir), dtype=np.float64)


def three(make_store, backend: str, model, metric: str = "l2") -> Engine:
    store = make_store(backend)
    if metric not in store.metrics:
        pytest.skip(f"{backend} does not rank by {metric}")
    push(store, model, metric, progress=False, layout="three")
    return Engine(store, model=store_fingerprint(model, metric, "three"))


@pytest.mark.parametrize(
    "backend, metric", [("memory", "l2"), ("memory", "ip"), ("faiss", "l2"), ("faiss", "ip"), ("turbopuffer", "l2")]
)
def test_generation_agrees_with_float64_numpy(make_store, tiny_model, model64, backend, metric):
    """Teacher-forced on numpy's greedy tokens (20 steps: the key search covers positions beyond the WINDOW):
    every step within the bound derived in the three-rounds order (reference.three_round_heads)."""
    engine = three(make_store, backend, tiny_model, metric)
    ids = tokenizer.encode(PROMPT)
    greedy = generate(Reference(model64, np.float64), ids, 20, stop=False).tokens
    with engine.open() as text:
        assert isinstance(text, ThreeRounds)
        r = tolerance.forced_comparison(text, model64, ids, greedy, metric, tolerance.unit_roundoff(backend))
    print(f"{backend}-{metric}: tol {r['tol'].min():.2e}..{r['tol'].max():.2e}, max error {r['max_error'].max():.2e}")
    assert not r["violations"], r["violations"][:5]


def test_three_rounds_a_layer_on_the_local_turbopuffer(make_store, tiny_model):
    engine = three(make_store, "turbopuffer", tiny_model)
    L, H = tiny_model.hparams.n_layer, tiny_model.hparams.n_head
    with engine.open() as text:
        generate(text, tokenizer.encode("To be or not to be, that is"), 8, stop=False)
        summary = text.meter.summary()
    # the prompt block: open, lookup, per layer (c_attn + projected values), (c_fc + documents), c_proj; token search
    assert summary["per_token"][0]["round_trips"] == 1 + 1 + 3 * L + 1
    # decode: a lookup, per layer (c_attn + projected values + key search), (c_fc + documents), c_proj; token search
    assert [t["round_trips"] for t in summary["per_token"][1:]] == [1 + 3 * L + 1] * 7
    last = summary["per_token"][-1]
    assert last["round_trips_by_kind"] == {"lookup": 1, "key_search": L, "matrix": 2 * L, "token_search": 1}
    assert last["by_kind"]["key_search"] == L * H  # one request per head namespace, in the layer's first round


def test_a_text_resumes_and_branches_bit_for_bit(make_store, tiny_model, model64):
    """A kept text continued by a new Engine on the same store reads what the uninterrupted one read, to the last
    bit (documents' norms recomputed from the rows); a branch (clone) checks against numpy in this layout."""
    engine = three(make_store, "memory", tiny_model)
    ids, sampled = tokenizer.encode("Hello world"), {"temperature": 0.8, "seed": 5}
    with Text.start(engine, ids, **sampled) as whole:
        whole.generate(12, stop=False)
        want = {p: whole._candidates[p] for p in range(len(ids), len(whole.tokens))}
    first = Text.start(engine, ids, **sampled)
    first.generate(7, stop=False)
    text_id = first.keep()
    again = Engine(engine.store, model=engine.key)
    with Text.resume(again, text_id) as text:
        s0, s1, n = first.session, text.session, text.session.written
        assert n > len(ids) and np.array_equal(s0.key_norms[..., :n], s1.key_norms[..., :n])  # |document|^2
        assert np.array_equal(s0.keys[:, :n], s1.keys[:, :n]) and np.array_equal(
            s0.projected[:, :n], s1.projected[:, :n]
        )
        text.generate(5, stop=False)
        assert text.cost["positions_read"] == 5 and text.tokens == whole.tokens
        for p in range(len(ids) + 7, len(text.tokens)):
            assert np.array_equal(text._candidates[p].ids, want[p].ids), p
            assert np.array_equal(text._candidates[p].logits, want[p].logits), p
        p = len(ids) + 6
        with text.branch(p, text.candidates(p)[1][0]) as child:
            child.generate(6, stop=False)
            assert child.cost["positions_read"] == 6
            exact, tol = tolerance.block_tolerance(model64, child.tokens[:-1], "l2", tolerance.U64, layout="three")
            for q in range(p + 1, len(child.tokens)):
                assert not tolerance.disagreements(child._candidates[q], exact[q - 1], 40, tol[q - 1]), q


def test_a_store_holds_both_layouts(make_store, tiny_model):
    """Two keys, two manifests; the plain layout stays the default and is untouched by the other."""
    store = make_store("memory")
    plain, other = push(store, tiny_model, "l2", progress=False), push(store, tiny_model, "l2", False, "three")
    assert (plain["layout"], other["layout"]) == ("four", "three") and plain["fingerprint"] != other["fingerprint"]
    assert other["fingerprint"] == store_fingerprint(tiny_model, "l2", "three")
    assert type(Engine(store, model=plain["fingerprint"]).open()) is not ThreeRounds
    assert other["documents"] > plain["documents"]  # W_vo (d rows a head) and W_q's rows (d + 1 a head)


def test_the_cli_loads_and_generates_in_layout_three(capsys, tmp_path, tiny_model_dir, model64):
    """`vecgpt load --layout three`, then `generate --layout three` runs that model: greedy, it draws numpy's
    tokens wherever the derived tolerance fixes them; a bad layout is argparse's one line, exit 2."""
    store = ["--backend", "faiss", "--store", str(tmp_path / "faiss"), "--model", str(tiny_model_dir)]
    assert main(["load", *store, "--layout", "three"]) == 0
    assert capsys.readouterr().out.strip().endswith("-l2-three)")
    runs = {}
    for layout in ("three", "four"):
        assert main(["generate", *store, "--layout", layout, "Hello", "-n", "4", "--json", "--yes"]) == 0
        runs[layout] = json.loads(capsys.readouterr().out)
    ids, tokens = runs["three"]["prompt_tokens"], runs["three"]["tokens"]
    exact = tolerance.forced_logits(model64, ids, tokens)
    tol = tolerance.logit_tolerance(model64, ids, tokens, "l2", tolerance.U32, exact, layout="three")
    sure = tolerance.sure_greedy_steps(exact, tol)
    assert sure >= 2 and tokens[:sure] == [int(row.argmax()) for row in exact[:sure]]
    assert runs["three"]["requests"]["round_trips"] < runs["four"]["requests"]["round_trips"]
    assert main(["ls", "--backend", "faiss", "--store", str(tmp_path / "faiss")]) == 0
    assert capsys.readouterr().out.count("\n") == 2  # both layouts, two keys
    with pytest.raises(SystemExit) as bad:
        main(["load", *store, "--layout", "two"])
    err = capsys.readouterr().err
    assert bad.value.code == 2 and "invalid choice: 'two'" in err and "Traceback" not in err
