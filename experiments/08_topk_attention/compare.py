"""Experiment 08 on several models over the same held-out passages (--models A B): does a rotary model need fewer or
more keys per query, and are its first positions sinks?

For each model, as the single run does (run.numpy_half) but with the policies that rank keys only, top-k and the
threshold: full attention once, each family's grid, its 99% point by bisection, at every context. Beside them, from
full attention's weights, the share of each head's weight on positions 0..S-1 (sinks.py). Keys are counted per
query head (each query head keeps its own set: a GQA key head serves its group's query heads, each choosing), so
models with as many query heads compare directly; `keys_returned_union` counts a key head's group together. With
--configs, each model's fewest-keys policies run through the stores too (stores.py), numpy's tokens checked.
Writes topk_compare.json, .md and .png.
"""

from __future__ import annotations

import copy
import sys
import time

import numpy as np

COMPARED = ("top-k", "threshold")


def run_compare(args, main) -> int:
    """main: the experiment's run module (its settings, load_windows, numpy_half)."""
    from common.record import new_run, provenance, write_json

    s = {**main.settings(args), "families": list(COMPARED), "hnsw_ks": [], "sinks_measured": args.sinks_measured}
    out, t = new_run(main.NAME, args.out), time.perf_counter()
    result = {"provenance": provenance(args.seed, None, models=args.models, settings=s), "settings": s, "models": []}
    for name in args.models:
        result["models"].append(one_model(args, copy.deepcopy(s), name, main))
        write_json(out / "topk_compare.json", result)  # each model's figures survive an interrupted run
    result["comparison"] = comparison(result)
    result["seconds"] = time.perf_counter() - t
    publish(out, result)
    return 0


def one_model(args, s, name, main) -> dict:
    from measure import Steps
    from sinks import sink_weights

    from common import subjects

    model = subjects.load_model(name, dtype=np.float64)
    windows, passages = main.load_windows(args, s, model.hparams)
    hp = model.hparams
    part = {
        "name": name,
        "label": subjects.model_label(model, name),
        "llama": subjects.is_llama(model),
        "query_heads": hp.n_layer * hp.n_head,
        "key_heads": hp.n_layer * getattr(hp, "n_kv_head", hp.n_head),
        "settings": s,
        "stores": [],
        "stores_skipped": [],
    }
    say(args, f"{name}: numpy, {len(windows)} windows")
    full = main.numpy_half(part, model, windows, passages, args.quiet, None)
    part["sinks"] = sink_weights(full, Steps(windows, s["contexts"], s["span"]), args.sinks_measured)
    if args.configs:
        from stores import run_stores

        args.model = name
        run_stores(args, s, subjects.load_model(name), model, passages, part)
    return part


def comparison(result) -> dict:
    """Per context and family: each model's 99% point, its keys a token and a query head, their share of every key;
    and its sink figures."""
    out = {}
    for c in map(str, result["settings"]["contexts"]):
        per = {}
        for m in result["models"]:
            fewest, every = m["fewest"][c], m["answer"][c]
            row = {"every_key": None if every is None else every["every_key"]}
            for family in COMPARED:
                r = fewest.get(family)
                row[family] = None if r is None else point(r, m)
            row["sinks"] = {k: m["sinks"][c][k] for k in ("mean", "max_head", "uniform", "heads_over_10x")}
            per[m["name"]] = row
        out[c] = per
    return out


def point(r, m) -> dict:
    keys = r["per_token"]["keys_returned"]
    return {
        "label": r["label"],
        "value": r["value"],
        "agreement": r["agreement"],
        "keys_a_token": keys,
        "keys_a_query_head": keys / m["query_heads"],
        "keys_a_key_head_group": r["per_token"].get("keys_returned_union", keys) / m["key_heads"],
        "mass_held": r["mass_mean"],
        "kl_mean": r["kl_mean"],
    }


def publish(out, result) -> None:
    from compare_report import plot, report

    from common import plots
    from common.record import say_written, write_json

    write_json(out / "topk_compare.json", result)
    md = report(result)
    (out / "topk_compare.md").write_text(md)
    drawn = plots.draw({"topk_compare.png": lambda: plot(result, out / "topk_compare.png")})
    print(md)
    say_written(out, ["topk_compare.json", "topk_compare.md", *drawn])


def say(args, message: str) -> None:
    if not args.quiet:
        print(f"topk-attention: {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)
