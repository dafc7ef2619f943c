"""The policies through the stores: the engine with the config's attention policy, metered.

Per store, context and policy (each family's 99% point of the numpy sweep at that context, and full attention): a
prompt of the first passage's `context - n + 1` tokens, one token generated to read it, then n - 1 more; the last
reads the query at position `context - 1`. A decode token's figures, the mean over those n - 1: the meter's keys
returned and values read, requests and round trips (requests sent together count once), the seconds spent in the
store's requests, and on turbopuffer (its local server, a delay a request) the dollars its billed usage comes to at
the published prices. Whether the store's greedy tokens are numpy float64 Reference(policy=...)'s (a Llama's:
LlamaReference's) is kept too. A Llama-family model runs in layout five where its config's layout is not built for
the family.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import numpy as np

from vecgpt.policy import Policy


def store_policies(result, context, hnsw: bool) -> list[tuple[str, Policy]]:
    """(label, policy): full attention and each family's fewest keys at 99% at this context (HNSW: top-k's)."""
    best = result.get("fewest", {}).get(str(context), {})
    out = [] if hnsw else [("full", Policy())]
    for family, r in sorted(best.items()):
        if not hnsw or family == "top-k":
            out.append((f"{family}: {r['label']}", Policy(**r["policy"])))
    return out


def run_stores(args, s, model, model64, passages, result) -> None:
    from vecgpt.config import load_config
    from vecgpt.errors import VecgptError

    from common import subjects

    for path in args.configs:
        config = load_config(path)
        if args.store_root:
            subjects.place(config, Path(path).stem, args.store_root)
        server = start(config, args.latency_ms)
        try:
            for context in args.store_contexts:
                for label, policy in store_policies(result, context, config.attention_index is not None):
                    try:
                        row = store_row(args, config, model, model64, passages[0], context, policy)
                    except VecgptError as e:  # a store that refuses is reported, not fatal
                        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                        result["stores_skipped"].append({"store": path, "context": context, "reason": reason})
                        continue
                    result["stores"].append({"config": path, "policy_label": label, **row})
                    if not args.quiet:
                        print(f"  {row['label']} {context} {label}: {row['meter']}", file=sys.stderr)
        finally:
            if server is not None:
                server.kill()


def start(config, latency_ms):
    """turbopuffer: the local server, started for this config (its process); other stores: None."""
    if config.backend != "turbopuffer":
        return None
    from common.tpuf_server import start_server

    proc, url = start_server(latency_ms)
    config.store["base_url"], config.store["timeout"] = url, 60.0
    return proc


def store_row(args, config, model, model64, passage, context, policy) -> dict:
    from vecgpt import api

    config = copy.deepcopy(config)
    for name, value in policy._asdict().items():
        setattr(config, f"attention_{name}", value)
    n, longest = args.store_tokens, len(passage) - 1
    prompt = [int(t) for t in passage[longest - context : longest - n + 1]]
    engine = open_engine(api, config, model)
    try:
        row = run_one(engine, config, prompt, n, context)
    finally:
        engine.store.close()
    row["same_tokens_as_numpy"] = row.pop("tokens") == numpy_tokens(model64, prompt, n, policy)
    row["policy"] = policy._asdict()
    return row


def open_engine(api, config, model):
    """api.open_engine, in layout five where a Llama-family model is refused in the config's (before any write)."""
    from vecgpt.errors import VecgptError

    from common.subjects import is_llama

    try:
        return api.open_engine(config, model, progress=False)
    except VecgptError:
        if not is_llama(model) or config.layout == "five":
            raise
    config.layout = "five"
    return api.open_engine(config, model, progress=False)


def run_one(engine, config, prompt, n, context) -> dict:
    from vecgpt.meter import summarize
    from vecgpt.text import Text

    usage = getattr(engine.store, "usage", None)
    with Text.start(engine, prompt) as text:
        text.generate(1)
        before, spent = len(text.session.meter.tokens), dict(usage or {})
        began = time.perf_counter()
        text.generate(n - 1)
        seconds = time.perf_counter() - began
        got = summarize(text.session.meter.tokens[before:])
        tokens = text.tokens[len(prompt) :]
    index = f", {config.attention_index}" if config.attention_index else ""
    return {
        "label": f"{config.backend} ({config.metric}{index})",
        "layout": config.layout,
        "backend": config.backend,
        "attention_index": config.attention_index,
        "context": context,
        "tokens_timed": n - 1,
        "ms_per_token": 1000 * seconds / (n - 1),
        "meter": per_token(got, n - 1),
        "dollars_per_token": None if usage is None else dollars_since(spent, usage) / (n - 1),
        "tokens": tokens,
    }


def per_token(got: dict, n: int) -> dict:
    return {
        "returned": got["scores"]["returned"] / n,
        "values": got["scores"]["values"] / n,
        "scored": got["scores"]["store"] / n,
        "requests": got["total"] / n,
        "round_trips": got["round_trips"] / n,
        "store_ms": 1000 * got["seconds"] / n,
        "key_search_requests": got["by_kind"].get("key_search", 0) / n,
        "key_search_round_trips": got["round_trips_by_kind"].get("key_search", 0) / n,
        "key_search_ms": 1000 * got["seconds_by_kind"].get("key_search", 0) / n,
        "kept_per_head": got.get("kept_per_head"),
        "dropped_bound": got.get("dropped_bound"),
    }


def dollars_since(before: dict, usage) -> float:
    from vecgpt.backends.turbopuffer import dollars

    return dollars({k: usage.get(k, 0) - before.get(k, 0) for k in usage})


def numpy_tokens(model64, prompt, n, policy) -> list[int]:
    from vecgpt.api import generate

    from common.subjects import reference

    ref = reference(model64, np.float64, policy=policy)
    return [int(t) for t in generate(ref, prompt, n, stop=False).tokens]
