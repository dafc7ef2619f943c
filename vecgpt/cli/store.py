"""The store subcommands: load, ls, drop, generate, compare (their arguments, then what they run)."""

from __future__ import annotations

import argparse
import inspect
import json


def add_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML file choosing the backend and its options (see configs/)")
    p.add_argument("--backend", help="override the config's backend")
    p.add_argument("--metric", choices=["l2", "ip"], help="override the config's encoding")


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model folder, shipped model name, or hub name such as gpt2 (default: shakespeare)")


def config_of(args):
    from vecgpt.config import load_config

    return load_config(args.config, backend=args.backend, metric=args.metric)


def cmd_load(args) -> int:
    from vecgpt import weights
    from vecgpt.backends.base import extra
    from vecgpt.config import open_store
    from vecgpt.loading import plan, push

    config = config_of(args)
    model = weights.load(args.model or config.model)
    if args.dry_run:
        rows = plan(model, config.metric)
        docs, size = sum(n for _, n, _ in rows), sum(n * d * 4 for _, n, d in rows)
        print(f"{len(rows)} collections, {docs:,} documents, {size / 1e6:,.1f} MB of float32 vectors")
        estimate = extra(config.backend, "estimate_cost")
        if estimate:
            accepted = inspect.signature(estimate).parameters
            print(estimate(rows, **{k: v for k, v in config.store.items() if k in accepted}))
        return 0
    store = open_store(config)
    manifest = push(store, model, config.metric, replace=args.replace, progress=True)
    store.close()
    print(f"{config.backend}: holds {manifest['source']} ({manifest['fingerprint']})")
    return 0


def cmd_ls(args) -> int:
    from vecgpt.config import open_store

    store = open_store(config_of(args))
    manifest = store.read_manifest()
    if manifest is None:
        print("no model")
    else:
        print(f"{manifest['fingerprint']}  {manifest['source']}  metric={manifest['metric']}")
    for name, s in store.stats().items():
        print(f"  {name:28s} {s['documents']:>8,} docs {s['bytes'] / 1e6:>9.1f} MB")
    return 0


def cmd_drop(args) -> int:
    from vecgpt.config import open_store

    store = open_store(config_of(args))
    for name in store.collections():
        store.drop(name)
    store.write_manifest(None)
    print("dropped")
    return 0


def cmd_generate(args) -> int:
    from vecgpt import api

    config = config_of(args)
    common = dict(n=args.n, model=args.model or config.model, temperature=args.temperature,
                  top_k=config.top_k if args.top_k is None else args.top_k, seed=args.seed, stop=not args.no_stop)
    if args.reference:
        out = api.generate_reference(args.prompt, **common)
    else:
        out = api.generate_text(args.prompt, config=config, progress=True, replace=args.replace, **common)
    print(json.dumps(out) if args.json else args.prompt + out["text"])
    return 0


def cmd_compare(args) -> int:
    from vecgpt import api

    config = config_of(args)
    out = api.compare(args.prompt, n=args.n, config=config, model=args.model or config.model)
    if args.json:
        print(json.dumps(out))
        return 0
    from vecgpt import tokenizer

    print(f"{'rank':>4} {'token':>6} {'text':14} {'store':>12} {'numpy':>12} {'abs err':>10}")
    for row in out["scores"]:
        text = repr(tokenizer.decode([row["token"]]))[:14]
        print(f"{row['rank']:>4} {row['token']:>6} {text:14} {row['store']:>12.6f} {row['numpy']:>12.6f} {row['abs_error']:>10.2e}")
    print(f"max abs error {out['max_abs_error']:.3e}; same top-{len(out['scores'])} set: {out['same_top_set']}")
    print(f"store greedy: {out['store_tokens']}\nnumpy greedy: {out['numpy_tokens']}")
    print(f"identical for {out['identical_steps']} of {len(out['numpy_tokens'])} steps")
    return 0



def load_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p), add_model_arg(p)
    p.add_argument("--replace", action="store_true", help="overwrite a store holding another model")
    p.add_argument("--dry-run", action="store_true", help="print what a load would write, write nothing")


def generate_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p), add_model_arg(p)
    p.add_argument("prompt")
    p.add_argument("-n", type=int, default=8, help="tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--top-k", type=int, default=None, help="candidates to sample from (default 40)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-stop", action="store_true", help="do not stop at <|endoftext|>")
    p.add_argument("--json", action="store_true")
    p.add_argument("--reference", action="store_true", help="run the numpy reference instead of a store")
    p.add_argument("--replace", action="store_true", help="load this model over another one the store holds")


def compare_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p), add_model_arg(p)
    p.add_argument("prompt")
    p.add_argument("-n", type=int, default=8)
    p.add_argument("--json", action="store_true")
