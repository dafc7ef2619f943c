"""Top-K attention through the stores: the engine with the config key `attention_top_k`, timed and metered.

Per store, context length and K: a prompt of the first passage's `context - n + 1` tokens, one token generated to
read it, then n - 1 more, each timed (ms a token: the median over those tokens of --store-repeats texts); the last
timed read is the query at position `context - 1`, with context - 1 earlier keys as numpy's steps. The meter's counts
a token (keys scored by the store, keys returned, values read) beside the formula's at the same positions, and
whether the store's greedy tokens are numpy float64's with the same K (vecgpt.reference). Turbopuffer's dollars are
a price-list estimate (turbopuffer.cost): every subquery is billed at least 1.28 GB queried whatever K, and only the
12 bytes (id and distance) of each returned key change with it.
"""

from __future__ import annotations

import inspect
import sys
import time
from pathlib import Path

import numpy as np
from measure import ALL, k_arg, k_value

SCORE_KEYS = ("store", "returned", "values")


def engine_takes_top_k() -> bool:
    from vecgpt.engine import Engine

    return "attention_top_k" in inspect.signature(Engine).parameters


def run_stores(args, s, model64, passages, result) -> None:
    from vecgpt.config import load_config
    from vecgpt.errors import VecgptError

    from common import subjects

    if not engine_takes_top_k():
        for path in args.configs:
            result["stores_skipped"].append({"store": path, "reason": "the engine does not take attention_top_k yet"})
        return
    model = subjects.load_model(args.model)  # float32, as stores hold it
    ks = sorted_ks(args.store_ks or [str(k) for k in s["ks"]])
    agree_ks = sorted_ks(args.store_agreement_ks)
    for path in args.configs:
        config = load_config(path)
        if args.store_root:
            subjects.place(config, Path(path).stem, args.store_root)
        for context in s["contexts"]:
            for k in ks if config.attention_index is None else [k for k in ks if k != ALL]:
                try:
                    row = store_row(args, s, config, model, model64, passages, context, k, k in agree_ks)
                except VecgptError as e:  # a store that refuses (L2 only) is reported, not fatal
                    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                    result["stores_skipped"].append({"store": path, "context": context, "k": k, "reason": reason})
                    print(f"  {path} context {context} K {k}: {reason}", file=sys.stderr)
                    break  # a refusal holds for every K
                result["stores"].append({"config": path, **row})
                if not args.quiet:
                    print(f"  {row['label']} context {context} K {k}: {row['ms_per_token']:.1f} ms", file=sys.stderr)


def sorted_ks(texts) -> list:
    return sorted([k_arg(k) for k in texts], key=lambda k: np.inf if k == ALL else k)


def store_row(args, s, config, model, model64, passages, context, k, agreement) -> dict:
    """Timing and counts on one store at one context and K; with agreement, the teacher-forced steps too."""
    import copy

    from vecgpt import api

    config = copy.deepcopy(config)
    config.attention_top_k = None if k == ALL else k
    n, longest = args.store_tokens, len(passages[0]) - s["steps"]
    prompt = [int(t) for t in passages[0][longest - context : longest - n + 1]]
    engine = api.open_engine(config, model, progress=False)
    try:
        row = run_one(engine, config, model, model64, prompt, n, k, context, args.store_repeats)
        if agreement:
            row["agreement"] = steps_agreement(engine, model64, passages[: args.store_passages], context, k, s)
    finally:
        engine.store.close()
    return row


def steps_agreement(engine, model64, passages, context, k, s) -> dict:
    """The teacher-forced steps through the store (a text a step, reading its window as a prompt): its greedy
    tokens against numpy float64's with full attention and with the same top-K attention."""
    from passages import windows
    from sparse_forward import exact_top_k, forward

    from vecgpt.text import Text

    got, full, same_k = [], [], []
    for passage in passages:
        ids, _ = windows(passage, context, s["steps"])
        for window in ids:
            with Text.start(engine, [int(t) for t in window]) as text:
                got.append(text.generate(1)[0])
        full += forward(model64.params, model64.hparams, ids).argmax(-1).tolist()
        same_k += forward(model64.params, model64.hparams, ids, exact_top_k(k_value(k, context))).argmax(-1).tolist()
    got, full, same_k = (np.asarray(a) for a in (got, full, same_k))
    return {
        "steps": len(got),
        "with_full": float((got == full).mean()),
        "with_numpy_top_k": float((got == same_k).mean()),
        "numpy_top_k_with_full": float((same_k == full).mean()),
    }


def run_one(engine, config, model, model64, prompt, n, k, context, repeats) -> dict:
    runs = [timed_text(engine, prompt, n) for _ in range(repeats)]
    seconds = np.concatenate([r[0] for r in runs])
    meter, tokens = runs[0][1], runs[0][2]
    return {
        "label": f"{config.backend} ({config.metric}{', ' + config.attention_index if config.attention_index else ''})",
        "attention_index": config.attention_index,
        "backend": config.backend,
        "metric": config.metric,
        "layout": engine.manifest.get("layout") or "four",
        "context": context,
        "k": k,
        "tokens_timed": len(seconds),
        "ms_per_token": 1000 * float(np.median(seconds)),
        "ms_per_token_mean": 1000 * float(seconds.mean()),
        "meter": {key: mean_score(meter, key) for key in SCORE_KEYS},
        "formula": formula(model.hparams, len(prompt), n - 1, k),
        "same_tokens_as_numpy": tokens == numpy_tokens(model64, prompt, n, k),
        "meter_line": "/".join(f"{mean_score(meter, key):g}" for key in SCORE_KEYS),
    }


def timed_text(engine, prompt, n):
    """A new text: the prompt read with its first token, then n - 1 tokens each timed -> (seconds [n - 1], the
    meter's tallies of those tokens, the n tokens)."""
    from vecgpt.text import Text

    with Text.start(engine, prompt) as text:
        text.generate(1)
        before, stamps = len(text.session.meter.tokens), [time.perf_counter()]
        text.generate(n - 1, on_token=lambda *_: stamps.append(time.perf_counter()))
        return np.diff(stamps), text.session.meter.tokens[before:], text.tokens[len(prompt) :]


def mean_score(tokens: list, key: str) -> float:
    return float(np.mean([t["scores"].get(key, 0) for t in tokens]))


def formula(hp, first: int, n: int, k) -> dict:
    """Mean counts a token over queries at positions first .. first + n - 1 (position p has p earlier keys)."""
    heads = hp.n_layer * hp.n_head
    earlier = np.arange(first, first + n)
    kept = earlier if k == ALL else np.minimum(k, earlier)
    return {
        "keys_scored": float(heads * earlier.mean()),
        "keys_returned": float(heads * kept.mean()),
        "values_read": float(heads * (kept.mean() + 1)),
    }


def numpy_tokens(model64, prompt, n, k) -> list[int]:
    from vecgpt.api import generate
    from vecgpt.reference import Reference

    ref = Reference(model64, np.float64, attention_top_k=None if k == ALL else k)
    return [int(t) for t in generate(ref, prompt, n, stop=False).tokens]


def turbopuffer_dollars(model, contexts, ks) -> list[dict]:
    """A generated token's dollars on turbopuffer by the price list, were its key searches top-K: the full
    token's estimate (turbopuffer.cost.token_cost) with each head's returned keys at 12 bytes each."""
    from vecgpt.backends.turbopuffer.cost import PRICES, token_cost
    from vecgpt.loading import plan, text_row

    hp = model.hparams
    rows = [(name, n, d, n * (8 + 4 * d + 8)) for name, n, d in plan(model, "l2", "three")]
    base = token_cost(rows, hp.n_head, text_row(hp, "three"), 2)
    out = []
    for context in contexts:
        for k in ks:
            returned = hp.n_layer * hp.n_head * k_value(k, context) * 12
            out.append(
                {
                    "context": context,
                    "k": k,
                    "key_bytes_returned": returned,
                    "dollars": base["dollars"] + returned / 1e9 * PRICES["returned_gb"],
                    "subqueries": base["subqueries"],
                }
            )
    return out
