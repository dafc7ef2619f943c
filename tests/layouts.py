"""What the load-time layouts' tests share (test_three_rounds, test_five_rounds): a model loaded in a layout, its
generation against float64 numpy under the bound derived in that layout's order, a kept text resumed and branched,
the CLI's load and generate."""

from __future__ import annotations

import json

import numpy as np

from vecgpt import tokenizer, tolerance
from vecgpt.api import generate
from vecgpt.cli import main
from vecgpt.engine import Engine
from vecgpt.loading import store_fingerprint
from vecgpt.reference import Reference
from vecgpt.text import Text

PROMPT = "The quick brown fox jumps over"


def loaded(make_store, backend: str, model, metric: str = "l2", layout: str = "three") -> Engine:
    store = make_store.loaded(backend, model, metric, layout)
    return Engine(store, model=store_fingerprint(model, metric, layout))


def forced_comparison(engine: Engine, model64, backend: str, metric: str, kind: type, steps: int = 20) -> dict:
    """Teacher-forced on numpy's greedy tokens (20 steps, each position's keys searched),
    the rule at every step under the bound derived in the session's layout; the comparison's figures."""
    ids = tokenizer.encode(PROMPT)
    greedy = generate(Reference(model64, np.float64), ids, steps, stop=False).tokens
    with engine.open() as text:
        assert type(text) is kind
        r = tolerance.forced_comparison(text, model64, ids, greedy, metric, tolerance.unit_roundoff(backend))
    print(f"{backend}-{metric}: tol {r['tol'].min():.2e}..{r['tol'].max():.2e}, max error {r['max_error'].max():.2e}")
    return r


def rounds_on_turbopuffer(make_store, model, layout: str, prompt: int, decode: int, matrix: int) -> dict:
    """A ten-token prompt and 8 greedy tokens on the local turbopuffer in the layout: the prompt takes `prompt`
    rounds, each decode step `decode`, of them a key search and `matrix` matrix rounds a layer (the key search
    one request per head namespace); the meter's summary."""
    hp = model.hparams
    with loaded(make_store, "turbopuffer", model, "l2", layout).open() as text:
        generate(text, tokenizer.encode("To be or not to be, that is"), 8, stop=False)
        summary = text.meter.summary()
    assert summary["per_token"][0]["round_trips"] == prompt
    assert [t["round_trips"] for t in summary["per_token"][1:]] == [decode] * 7
    last = summary["per_token"][-1]
    kinds = {"key_search": hp.n_layer, "matrix": matrix * hp.n_layer, "token_search": 1}  # the next rows come with it
    assert last["round_trips_by_kind"] == kinds and last["by_kind"]["key_search"] == hp.n_layer * hp.n_head
    assert last["by_kind"]["lookup"] == 1  # the next position's row, in the token search's round
    return summary


def resumes_and_branches(engine: Engine, model64) -> None:
    """A kept text continued by a new Engine on the same store reads what the uninterrupted one read, to the last
    bit (keys, kept values and |vector|^2 from the rows); a branch (clone) checks against numpy in the layout."""
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
        assert n > len(ids) and np.array_equal(s0.key_norms[..., :n], s1.key_norms[..., :n])
        assert np.array_equal(s0.projected[:, :n], s1.projected[:, :n])
        text.generate(5, stop=False)
        assert text.cost["positions_read"] == 5 and text.tokens == whole.tokens
        for p in range(len(ids) + 7, len(text.tokens)):
            assert np.array_equal(text._candidates[p].ids, want[p].ids), p
            assert np.array_equal(text._candidates[p].logits, want[p].logits), p
        p, layout = len(ids) + 6, text.session.layout
        with text.branch(p, text.candidates(p)[1][0]) as child:
            child.generate(6, stop=False)
            assert child.cost["positions_read"] == 6
            exact, tol = tolerance.block_tolerance(model64, child.tokens[:-1], "l2", tolerance.U64, layout=layout)
            for q in range(p + 1, len(child.tokens)):
                assert not tolerance.disagreements(child._candidates[q], exact[q - 1], 40, tol[q - 1]), q


def cli_runs(capsys, tmp_path, tiny_model_dir, model64, layout: str) -> dict:
    """`vecgpt load --layout <layout>` into FAISS, then `generate` in that layout and in "four" (loaded by
    generate): greedy, the layout draws numpy's tokens wherever the derived tolerance fixes them; both
    generate runs' JSON by layout."""
    store = ["--backend", "faiss", "--metric", "l2", "--store", str(tmp_path / "faiss"), "--model", str(tiny_model_dir)]
    assert main(["load", *store, "--layout", layout]) == 0
    assert capsys.readouterr().out.strip().endswith(f"-l2-{layout})")
    runs = {}
    for name in (layout, "four"):
        greedy = ["--temperature", "0"]  # the CLI samples by default
        assert main(["generate", *store, "--layout", name, "Hello", "-n", "4", "--json", "--yes", *greedy]) == 0
        runs[name] = json.loads(capsys.readouterr().out)
    ids, tokens = runs[layout]["prompt_tokens"], runs[layout]["tokens"]
    exact = tolerance.forced_logits(model64, ids, tokens)
    tol = tolerance.logit_tolerance(model64, ids, tokens, "l2", tolerance.U32, exact, layout=layout)
    sure = tolerance.sure_greedy_steps(exact, tol)
    assert sure >= 2 and tokens[:sure] == [int(row.argmax()) for row in exact[:sure]]
    assert main(["ls", "--backend", "faiss", "--store", str(tmp_path / "faiss")]) == 0
    assert capsys.readouterr().out.count("\n") == 2  # both layouts, two keys
    return runs
