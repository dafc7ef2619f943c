"""Experiment 7's Llama shapes (`--llama`): what a token costs at the hub shapes of families.SIZES (SmolLM2-135M and
360M, Qwen2.5-0.5B, TinyLlama-1.1B, Llama-3.2-1B) beside GPT-2's four sizes, every one in layout five.

From the shape alone (no load): parameters, documents and float32 bytes a load writes (loading.plan), and what a
token costs on turbopuffer by the backend's cost model (estimate_cost through cli.store.cost_estimate, as `vecgpt load
--dry-run` prints it: one copy of the matrices, two of the keys; a key search request and key writes per key head). Measured, on random checkpoints of the shape cut to a few layers (`--llama-layers`,
default 2 and 4: every layer's matrices as the shape has them, the token table and output matrix whole): FAISS
(inner product, layout five) and numpy float32 (reference or reference_llama) ms a token, the meter's requests,
round trips and subqueries a token. A token's cost is a fixed part (the token search, its embedding) plus one
layer's times the layers, so each figure is fitted as a + b x layers over the cut checkpoints and read at the
shape's own depth; `--llama-full NAME` also measures a shape whole, to check that reading. Each token is timed by the
clock (ms) and by this process's CPU time (cpu_ms: with one BLAS thread, what a quiet machine's clock would show;
on a machine shared with other work the clock counts their turns too).
"""

from __future__ import annotations

import gc
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

PROMPT = [15496, 995]  # "Hello world" (ids taken modulo a scaled vocabulary)
MEASURED = ("store_ms", "store_cpu_ms", "numpy_ms", "numpy_cpu_ms", "requests", "round_trips", "subqueries")


def shapes(scale: int = 1) -> dict:
    """Every shape by name: the five Llama-family hub models, then GPT-2's sizes (scaled down for a quick run)."""
    from vecgpt import families, weights

    out = {name.split("/")[1]: scaled(hp, scale) for name, hp in families.SIZES.items()}
    return out | {name: weights.size_shape(name, scale) for name in weights.SIZES}


def scaled(hp, scale: int):
    """A Llama shape at 1/scale of its width, feed-forward, head width and vocabulary, heads and layers kept."""
    if scale == 1:
        return hp
    return replace(
        hp,
        n_embd=hp.n_embd // scale,
        n_inner=hp.n_inner // scale,
        head_dim=max(2, hp.head_dim // scale),
        n_vocab=max(256, hp.n_vocab // scale),
        n_ctx=max(64, hp.n_ctx // scale),
    )


def planned(name: str, hp) -> dict:
    """The shape's figures without a load: parameters, documents and float32 bytes in layout five, and a token's
    kNN subqueries and dollars on turbopuffer by the cost model."""
    from vecgpt.families import LlamaHParams
    from vecgpt.loading import plan
    from vecgpt.weights import parameter_count

    rows = plan(hp, "ip", "five")
    llama = isinstance(hp, LlamaHParams)
    return {
        "shape": name,
        "family": hp.family if llama else "gpt2",
        "layers": hp.n_layer,
        "heads": f"{hp.n_head} / {hp.n_kv_head}" if llama else f"{hp.n_head}",
        "width": hp.n_embd,
        "vocab": hp.n_vocab,
        "parameters": parameter_count(hp),
        "documents": sum(n for _, n, _ in rows),
        "float32_bytes": sum(n * d * 4 for _, n, d in rows),
        # layout five: five a layer and the token search; untied, the next token's row of embed_tokens a round too
        "rounds_per_token": 5 * hp.n_layer + 1 + int(llama and not hp.tied),
        **turbopuffer_cost(hp),
    }


def turbopuffer_cost(hp) -> dict:
    """A token's kNN subqueries, requests and dollars on turbopuffer in layout five, as `vecgpt load --dry-run
    --config configs/turbopuffer.toml --layout five` prints them with one copy of the matrices."""
    from size_fit import read_estimate

    from vecgpt.cli.store import cost_estimate
    from vecgpt.config import load_config

    from common.subjects import CONFIGS

    config = load_config(CONFIGS / "turbopuffer.toml", layout="five")
    config.store = {**config.store, "replicas": 1}
    said = read_estimate(cost_estimate(config, hp))
    return {
        "tpuf_subqueries_per_token": said["subqueries_per_token"],
        "tpuf_requests_per_token": said["requests_per_token"],
        "tpuf_dollars_per_token": said["dollars_per_token"],
    }


def measure(hp, args, folder: Path) -> dict:
    """A random checkpoint of shape hp written to folder, pushed into FAISS (ip, layout five) and read: ms a token
    (median of -n), the meter's figures a token, numpy float32's ms a token on the same tokens."""
    from vecgpt import weights
    from vecgpt.families import LlamaHParams

    make = weights.make_llama_model if isinstance(hp, LlamaHParams) else weights.make_model
    t = time.perf_counter()
    make(folder, hp, seed=args.seed)
    model = weights.load(str(folder))
    out = {"layers": hp.n_layer, "write_s": time.perf_counter() - t}
    prompt = [p % hp.n_vocab for p in PROMPT]
    out.update(on_faiss(model, prompt, args, folder.name))
    out.update(on_numpy(model, prompt, out["tokens"]))
    del model
    gc.collect()
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return out


def on_faiss(model, prompt, args, tag: str) -> dict:
    from vecgpt.config import load_config, open_store
    from vecgpt.engine import Engine
    from vecgpt.loading import drop, push

    from common.subjects import CONFIGS, place

    config = load_config(CONFIGS / "faiss.toml", layout="five")
    place(config, tag, str(store_root(args)))
    store = open_store(config)
    try:
        t = time.perf_counter()
        key = push(store, model, config.metric, progress=False, layout="five")["fingerprint"]
        load_s = time.perf_counter() - t
        with Engine(store, model=key).open() as text:
            got = read_tokens(text, prompt, args.n)
        if not args.keep:
            drop(store, key)
    finally:
        store.close()
    return {"load_s": load_s, **got}


def read_tokens(text, prompt, n: int) -> dict:
    """The prompt, then n greedy tokens each timed: ms a token (median) and the meter's figures a token."""
    tokens, times = [int(text.read(prompt).ids[0])], []
    for _ in range(n):
        text.meter.start_token()
        t = clocks()
        tokens.append(int(text.read([tokens[-1]]).ids[0]))
        times.append(clocks() - t)
    decode = text.meter.summary()["per_token"][1:]
    mean = lambda field: float(np.mean([tok[field] for tok in decode]))  # noqa: E731
    return {
        **medians("store", times),
        "requests": mean("total"),
        "round_trips": mean("round_trips"),
        "subqueries": mean("subqueries"),
        "tokens": tokens,
    }


def on_numpy(model, prompt, tokens) -> dict:
    """numpy float32 fed the store's tokens: ms a token (median), and whether its greedy tokens are the store's."""
    from common.subjects import reference

    ref, times = reference(model, np.float32), []
    own = [int(np.argmax(ref.logits(prompt)[-1]))]
    for t in tokens[:-1]:
        began = clocks()
        own.append(int(np.argmax(ref.logits([t])[-1])))
        times.append(clocks() - began)
    return {**medians("numpy", times), "numpy_tokens": own, "same_tokens": own == tokens}


def clocks() -> np.ndarray:
    """(the clock, this process's CPU time, all its threads) in seconds."""
    return np.array([time.perf_counter(), time.process_time()])


def medians(name: str, times) -> dict:
    """ms a token by the clock and by CPU time: the medians over the tokens."""
    ms = 1000 * np.median(np.array(times), axis=0)
    return {f"{name}_ms": float(ms[0]), f"{name}_cpu_ms": float(ms[1])}


def at_depth(cuts: list[dict], layers: int) -> dict:
    """Each measured figure fitted as a + b x layers over the cut checkpoints, read at `layers`."""
    x, out = [c["layers"] for c in cuts], {}
    for field in MEASURED:
        y = [c[field] for c in cuts]
        if len(set(x)) > 1:
            slope, icept = np.polyfit(x, y, 1)
            out[field], out[f"{field}_per_layer"] = float(icept + slope * layers), float(slope)
        else:  # one depth, the shape's own (a shape no deeper than the cuts): as measured
            out[field], out[f"{field}_per_layer"] = float(np.mean(y)), None
    return out


def store_root(args) -> Path:
    from vecgpt.backends.base import cache_dir

    return Path(args.store_root).expanduser() / "llama" if args.store_root else cache_dir("sizes") / "llama"


def models_dir(args) -> Path:
    from vecgpt import weights

    return (Path(args.models).expanduser() if args.models else weights.default_models_dir()) / "sizes-cut"


def run(args) -> int:
    """--llama: every shape planned, measured cut to --llama-layers (and whole where --llama-full names it)."""
    from llama_report import write

    from common.record import new_run

    out, rows = new_run("sizes", args.out), []
    if args.render:
        return render(args, out)
    for name, hp in shapes(args.scale).items():
        if args.llama_shapes and name not in args.llama_shapes:
            continue
        rows.append(shape_row(name, hp, args))
        say(f"{name}: {rows[-1].get('store_ms', 0):.1f} ms a token at {hp.n_layer} layers (fitted)")
    write(out, args, rows)
    return 0


def render(args, out) -> int:
    """--render JSON: an earlier run's measurements, with the shapes' planned figures and costs taken again (the cost
    model as it is now), tables and plot written anew."""
    import json

    from llama_report import write

    data = json.loads(Path(args.render[0]).read_text())
    scale = data["settings"].get("scale", 1)
    known = shapes(scale)
    measured = [{k: v for k, v in r.items() if not k.startswith("tpuf_")} for r in data["rows"]]
    rows = [{**r, **planned(r["shape"], known[r["shape"]])} for r in measured]
    args.llama_layers, args.n, args.scale = data["settings"]["layers_measured"], data["settings"]["n"], scale
    args.llama_full = data["settings"]["full"]
    write(out, args, rows, data["provenance"])
    return 0


def shape_row(name: str, hp, args) -> dict:
    row = planned(name, hp)
    cuts = []
    for layers in sorted({min(n, hp.n_layer) for n in args.llama_layers}):
        say(f"{name}: cut to {layers} layers")
        cuts.append(measure(replace(hp, n_layer=layers), args, models_dir(args) / f"{name}-L{layers}"))
    row.update(at_depth(cuts, hp.n_layer), cuts=cuts, same_tokens=all(c["same_tokens"] for c in cuts))
    if name in (args.llama_full or []):
        say(f"{name}: whole, {hp.n_layer} layers")
        row["whole"] = measure(hp, args, models_dir(args) / f"{name}-whole")
    return row


def say(message: str) -> None:
    print(f"sizes --llama: {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)
