"""Top-K attention through the stores: the engine with the config key `attention_top_k`, timed and metered.

Per store, context length and K: a prompt of the first passage's `context - n` tokens, one token generated to read
it, then n more timed (ms a token: wall time over those n; their contexts run up to `context`). The meter's counts
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
from measure import ALL, k_value

SCORE_KEYS = ("store", "returned", "values")


def engine_takes_top_k() -> bool:
    from vecgpt.engine import Engine

    return "attention_top_k" in inspect.signature(Engine).parameters


def run_stores(args, s, model64, passages, result) -> None:
    from vecgpt.config import load_config

    from common import subjects

    if not engine_takes_top_k():
        for path in args.configs:
            result["stores_skipped"].append({"store": path, "reason": "the engine does not take attention_top_k yet"})
        return
    model = subjects.load_model(args.model)  # float32, as stores hold it
    ks = sorted([_k(k) for k in (args.store_ks or [str(k) for k in s["ks"]])], key=lambda k: np.inf if k == ALL else k)
    n, longest = args.store_tokens, len(passages[0]) - s["steps"]
    for path in args.configs:
        config = load_config(path)
        if args.store_root:
            subjects.place(config, Path(path).stem, args.store_root)
        for context in s["contexts"]:
            prompt = [int(t) for t in passages[0][longest - context : longest - n]]
            for k in ks:
                try:
                    row = run_one(config, model, model64, prompt, n, k, context)
                except Exception as e:  # noqa: BLE001 - a store that refuses (L2 only) or fails is reported, not fatal
                    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                    result["stores_skipped"].append({"store": path, "context": context, "k": k, "reason": reason})
                    print(f"  {path} context {context} K {k}: {reason}", file=sys.stderr)
                    break  # a refusal holds for every K
                result["stores"].append({"config": path, **row})
                if not args.quiet:
                    print(f"  {row['label']} context {context} K {k}: {row['ms_per_token']:.1f} ms", file=sys.stderr)


def _k(text):
    from run import k_arg

    return k_arg(text)


def run_one(config, model, model64, prompt, n, k, context) -> dict:
    import copy

    from vecgpt import api
    from vecgpt.text import Text

    config = copy.deepcopy(config)
    config.attention_top_k = None if k == ALL else k
    engine = api.open_engine(config, model, progress=False)
    try:
        with Text.start(engine, prompt) as text:
            text.generate(1)  # the prompt read, and its first token
            before = len(text.session.meter.tokens)
            t = time.perf_counter()
            text.generate(n - 1)
            seconds = time.perf_counter() - t
            meter = text.session.meter.tokens[before:]
            tokens = text.tokens[len(prompt) :]
    finally:
        engine.store.close()
    return {
        "label": f"{config.backend} ({config.metric})",
        "backend": config.backend,
        "metric": config.metric,
        "layout": engine.manifest.get("layout") or "four",
        "context": context,
        "k": k,
        "tokens_timed": n - 1,
        "ms_per_token": 1000 * seconds / (n - 1),
        "meter": {key: mean_score(meter, key) for key in SCORE_KEYS},
        "formula": formula(model.hparams, len(prompt), n - 1, k),
        "same_tokens_as_numpy": tokens == numpy_tokens(model64, prompt, n, k),
        "meter_line": "/".join(f"{mean_score(meter, key):g}" for key in SCORE_KEYS),
    }


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
