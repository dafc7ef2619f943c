"""What the Llama family's engine tests share (test_llama_engine, test_llama_four): small random checkpoints, a model
loaded in a layout, and its generation against float64 numpy under the bound vecgpt.llama_tolerance derives in that
layout's order."""

from __future__ import annotations

import numpy as np
import pytest

from vecgpt import families, llama_tolerance, tolerance, weights
from vecgpt.api import generate
from vecgpt.engine import Engine
from vecgpt.loading import push
from vecgpt.reference_llama import LlamaReference
from vecgpt.reference_llama import generate as reference_greedy

SHAPE = {"n_layer": 2, "n_head": 4, "n_embd": 64, "n_inner": 96, "n_ctx": 64, "n_vocab": 512}
SHAPES = {
    "llama": families.LlamaHParams(**SHAPE, n_kv_head=2, tied=True),
    "qwen2": families.LlamaHParams(**SHAPE, n_kv_head=1, family="qwen2", biases=families.QKV),
    "mha": families.LlamaHParams(**SHAPE, n_kv_head=4),
}
PROMPT = [5, 17, 300, 2, 41, 99, 7, 250]
STEPS = 16
STD = 0.2  # weights large enough that attention is not uniform and the tokens vary


def write_checkpoints(folder, shapes=SHAPES) -> dict:
    return {name: weights.make_llama_model(folder / name, hp, seed=3, std=STD) for name, hp in shapes.items()}


def models(checkpoints, name):  # (float32 as loaded, float64 for numpy)
    path = str(checkpoints[name])
    return weights.load(path), weights.load(path, dtype=np.float64)


def engine_for(make_store, backend, model, metric, layout="five", **kw) -> Engine:
    store = make_store(backend)
    if metric not in store.metrics:
        pytest.skip(f"{backend} does not rank by {metric}")
    push(store, model, metric, progress=False, layout=layout)
    return Engine(store, **kw)


def agrees(engine, model64, backend, metric, steps=STEPS, sure_least=STEPS // 2, kind=None) -> dict:
    """Teacher-forced on float64 numpy's greedy tokens: the rule at every step; then free-running greedy, which must
    give numpy's tokens at every step whose top-2 gap exceeds twice the derived tolerance (`kind`: the Session class
    the engine opens)."""
    want = reference_greedy(LlamaReference(model64, np.float64, engine.policy), PROMPT, steps)
    u = tolerance.unit_roundoff(backend)
    with engine.open() as text:
        assert kind is None or type(text) is kind
        r = llama_tolerance.forced_comparison(text, model64, PROMPT, want, metric, u)
    with engine.open() as text:
        got = generate(text, PROMPT, steps, stop=False).tokens
    sure = tolerance.sure_greedy_steps(r["exact"], r["tol"])
    print(
        f"{backend}-{metric}: tol {r['tol'].min():.2e}..{r['tol'].max():.2e}, max error {r['max_error'].max():.2e}, "
        f"{sure} of {steps} greedy steps fixed"
    )
    assert not r["violations"], r["violations"][:5]
    assert sure >= min(sure_least, steps) and got[:sure] == want[:sure], (sure, got, want)
    return r


def last_token_on_turbopuffer(make_store, model, layout: str, n: int) -> dict:
    """The meter's figures of a text's last of n generated tokens on the local turbopuffer, one copy of its keys."""
    store = make_store("turbopuffer", key_replicas=1)
    key = push(store, model, "l2", progress=False, layout=layout)["fingerprint"]
    with Engine(store, model=key).open() as text:
        generate(text, PROMPT, n, stop=False)
        return text.meter.summary()["per_token"][-1]
