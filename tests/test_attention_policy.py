"""Attention policies on every store (vecgpt.policy): top-k, a threshold, sinks and a window, alone and together.

Each store runs in its own encoding and layout (its config's metric: l2 stores rank a head's keys by q.k through
rows padded to one length, vecgpt.key_bounds). A policy that drops keys is held to the tolerance rule against
float64 numpy under the same policy (reference.keep), teacher forced, on a prompt whose scores put every key far
from the policy's boundary (no near-tie decides which keys are kept). A K reaching every key is full attention bit
for bit. The counts say what was kept and read; bad settings are one line before any search.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from vecgpt import reference, tokenizer, tolerance
from vecgpt.config import auto_layout, preferred_metric
from vecgpt.engine import Engine
from vecgpt.errors import VecgptError
from vecgpt.loading import push, store_fingerprint
from vecgpt.policy import Policy, dropped_bound

from conftest import BACKENDS, SLOW

PROMPT = "To be or not to be, that is the question: whether 'tis nobler in the mind"
POLICIES = {
    "top-3": Policy(top_k=3),
    "threshold-1.5": Policy(threshold=1.5),
    "sinks-2-window-3": Policy(sinks=2, window=3),
    "sinks-1-window-2-top-2": Policy(top_k=2, sinks=1, window=2),
}


def loaded(make_store, backend, model, layout=None, metric=None, **policy) -> Engine:
    metric = metric or preferred_metric(backend)
    layout = layout or auto_layout(backend, {})
    store = make_store.loaded(backend, model, metric, layout)
    return Engine(store, model=store_fingerprint(model, metric, layout), prefill_chunk=8, **policy)


def engine_options(policy: Policy) -> dict:
    return {f"attention_{k}": v for k, v in policy._asdict().items() if v is not None}


def margin(model64, ids: list[int], policy: Policy) -> float:
    """The smallest distance, over every layer, head and query of a read of ids, between a key's scaled score and
    the policy's boundary in float64 numpy (top-k: between the K-th and K+1-th best; a threshold: from best - beta)."""
    hp, gaps = model64.hparams, [np.inf]
    x = model64.params["wte"]["weight"][ids] + model64.params["wpe"]["weight"][: len(ids)]
    for block in model64.params["h"]:
        h = reference.layer_norm(x, **block["ln_1"], eps=hp.eps)
        q, key, _ = np.split(reference.linear(h, **block["attn"]["c_attn"]), 3, axis=-1)
        for qh, kh in zip(np.split(q, hp.n_head, -1), np.split(key, hp.n_head, -1)):
            s = qh @ kh.T / math.sqrt(qh.shape[-1])
            for i in range(1, len(ids)):
                a, b = policy.middle(i)
                between = np.sort(s[i, a:b])[::-1]
                if policy.top_k is not None and len(between) > policy.top_k:
                    gaps.append(between[policy.top_k - 1] - between[policy.top_k])
                elif policy.threshold is not None and len(between) > 1:
                    gaps.append(np.abs(between[1:] - (between[0] - policy.threshold)).min())
        cache = {"k": np.zeros((0, hp.n_embd)), "v": np.zeros((0, hp.n_embd))}
        x = reference.transformer_block(x, **block, n_head=hp.n_head, eps=hp.eps, cache=cache, policy=policy)
    return float(min(gaps))


# Memory and FAISS run every policy; each other store two, so that every policy runs on stores of both metrics
# (the suite's time: each case is a teacher-forced run and its derived tolerance)
SOME = {
    "pgvector": ("threshold-1.5", "sinks-2-window-3"),
    "lancedb": ("top-3", "threshold-1.5"),
    "turbopuffer": ("threshold-1.5", "sinks-1-window-2-top-2"),
    "sqlite": ("top-3", "sinks-2-window-3"),
    "duckdb": ("top-3", "sinks-1-window-2-top-2"),
    "milvus": ("top-3",),
}


def cases():
    for backend in BACKENDS:
        names = SOME.get(backend, ("top-3",) if backend in SLOW else tuple(POLICIES))
        yield from (pytest.param(backend, name, id=f"{backend}-{name}") for name in names)


@pytest.mark.parametrize("backend, name", list(cases()))
def test_a_policy_keeps_numpys_keys_within_the_tolerance_rule(make_store, tiny_model, model64, backend, name):
    policy, ids = POLICIES[name], tokenizer.encode(PROMPT)[:20]
    assert margin(model64, ids, policy) > 1e-5  # which keys are kept is a fact of these scores, not of rounding
    engine = loaded(make_store, backend, tiny_model, **engine_options(policy))
    with engine.open() as text:
        u = tolerance.unit_roundoff(backend)
        out = tolerance.forced_comparison(text, model64, ids[:12], ids[12:], engine.metric, u)
        assert not out["violations"], out["violations"][:3]
        seen = text.inspect(len(ids) - 2, ids[-2])
        kept = text.meter.summary()["kept_per_head"]
    full = reference.Reference(model64, np.float64).logits(ids[:12])[-1]
    assert np.abs(out["exact"][0] - full).max() > 1e-4  # the policy dropped keys that mattered
    i = len(ids) - 2
    earlier = seen.weights[..., :-1] > 0  # [L, H, i]: the keys the inspected decode step kept
    assert earlier.sum(axis=-1).min() < i and min(kept) < i  # some head dropped keys
    a, b = policy.middle(i)
    assert earlier[..., :a].all() and earlier[..., b:].all()  # the sinks and the window: always
    if policy.top_k is not None:
        assert (earlier[..., a:b].sum(axis=-1) == policy.top_k).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_reaching_every_earlier_key_is_full_attention_bit_for_bit(make_store, tiny_model, backend):
    """With K at least every earlier key of each read, a store computes what it does without K, to the last bit."""
    ids = tokenizer.encode(PROMPT)[:16]
    every = logits(loaded(make_store, backend, tiny_model), ids, 3)
    top = logits(loaded(make_store, backend, tiny_model, attention_top_k=18), ids, 3)
    for a, b in zip(every, top, strict=True):
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.logits, b.logits)


def logits(engine: Engine, ids: list[int], n: int) -> list:
    with engine.open() as text:
        out = [text.read(ids)]
        for _ in range(n):
            out.append(text.read([int(out[-1].ids[0])]))
    return out


@pytest.mark.parametrize("layout", ["four", "three", "five"])
@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_sinks_window_and_k_read_exactly_their_keys(make_store, tiny_model, layout, metric):
    """A decode step at position p under S sinks, a window of W and K between: the store returns S + W + K keys a
    head and layer, scores S + W + (p - S - W) of them, and attention reads S + W + K + 1 values."""
    hp, ids = tiny_model.hparams, tokenizer.encode(PROMPT)[:14]
    s, w, k, per = 2, 3, 4, hp.n_layer * hp.n_head
    engine = loaded(
        make_store, "memory", tiny_model, layout, metric, attention_sinks=s, attention_window=w, attention_top_k=k
    )
    with engine.open() as text:
        text.read(ids)
        text.meter.start_token()
        text.read([ids[0]])
        token = text.meter.tokens[-1]["scores"]
    assert token["returned"] == per * (s + w + k) and token["values"] == per * (s + w + k + 1)
    assert token["store"] == per * len(ids)


def test_a_threshold_reports_the_weight_its_dropped_keys_could_hold(make_store, tiny_model):
    """A decode step under a threshold: the meter's bound is n e^-beta / (1 + n e^-beta) for the most keys any layer
    and head dropped (the inspection of the same position shows which were kept)."""
    ids, beta = tokenizer.encode(PROMPT)[:16], 1.5
    engine = loaded(make_store, "faiss", tiny_model, attention_threshold=beta)
    with engine.open() as text:
        text.read(ids[:-1])
        text.meter.start_token()
        text.read(ids[-1:])
        summary = text.meter.summary()["per_token"][-1]
        seen = text.inspect(len(ids) - 1, ids[-1])
    p = len(ids) - 1
    kept = (seen.weights[..., :-1] > 0).sum(axis=-1)  # [L, H]
    assert 1 <= kept.min() and kept.min() < p  # every head kept its best key; some dropped others
    assert np.isclose(summary["dropped_bound"], dropped_bound(beta, p - kept).max(), rtol=1e-12)
    assert np.allclose(summary["kept_per_head"], kept.mean(axis=0))


def test_a_model_loaded_before_key_bounds_refuses_ranking_under_l2(make_store, tiny_model):
    store = make_store("memory")
    key = push(store, tiny_model, "l2", progress=False, layout="five")["fingerprint"]
    manifest = store.read_manifest(key)
    store.write_manifest(key, {k: v for k, v in manifest.items() if k != "key_bound"})
    with pytest.raises(VecgptError, match="load it again") as e:
        Engine(store, model=key, attention_top_k=4)
    assert "\n" not in str(e.value)
    Engine(store, model=key, attention_sinks=2, attention_window=4)  # a filter on positions needs no ranking


@pytest.mark.parametrize(
    "options, says",
    [
        ({"attention_threshold": -1.0}, "0 or more"),
        ({"attention_threshold": float("nan")}, "0 or more"),
        ({"attention_threshold": float("inf")}, "finite"),
        ({"attention_sinks": -1}, "from 0 to 63"),
        ({"attention_window": 64}, "from 0 to 63"),
        ({"attention_top_k": 2, "attention_threshold": 1.0}, "not both"),
        ({"attention_threshold": 1.0, "attention_index": "hnsw"}, "attention_top_k only"),
    ],
)
def test_bad_policies_are_one_line_before_any_search(make_store, tiny_model, options, says):
    store = make_store("faiss")
    key = push(store, tiny_model, "ip", progress=False, layout="five")["fingerprint"]
    with pytest.raises(VecgptError, match=says) as e:
        Engine(store, model=key, **options)
    assert "\n" not in str(e.value)
