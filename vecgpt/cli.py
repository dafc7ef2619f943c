"""`vecgpt` command line: stdout carries only results; progress and warnings go to stderr."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys

from vecgpt.errors import VecgptError


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
    from vecgpt.config import open_store
    from vecgpt.engine import plan, push

    config = config_of(args)
    model = weights.load(args.model or config.model)
    if args.dry_run:
        rows = plan(model, config.metric)
        docs, size = sum(n for _, n, _ in rows), sum(n * d * 4 for _, n, d in rows)
        print(f"{len(rows)} collections, {docs:,} documents, {size / 1e6:,.1f} MB of float32 vectors")
        estimate = getattr(__import__(f"vecgpt.backends.{config.backend}", fromlist=["x"]), "estimate_cost", None)
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


def cmd_tokenize(args) -> int:
    from vecgpt import tokenizer

    ids = tokenizer.encode(args.text)
    print(json.dumps(ids) if args.json else " ".join(map(str, ids)))
    return 0


def cmd_make_model(args) -> int:
    from vecgpt import weights

    hp = weights.HParams(args.layers, args.heads, args.embd, args.ctx, args.vocab)
    if min(args.layers, args.heads, args.embd, args.ctx, args.vocab) < 1 or args.embd % args.heads:
        raise VecgptError("--layers, --heads, --embd, --ctx, --vocab must be positive and --embd divisible by --heads")
    if args.seed < 0:
        raise VecgptError(f"--seed must be 0 or more, not {args.seed}")
    if not args.out.strip():
        raise VecgptError("give the folder to write the model to (\".\" for this one)")
    check_room(weights.parameter_count(hp) * 4, args.out)
    out = weights.make_model(args.out, hp, args.seed)
    print(f"{out}: random GPT-2 ({weights.describe(hp)}), seed {args.seed}")
    return 0


def check_room(size: int, out: str) -> None:
    """Refuse a checkpoint that cannot fit, before allocating it (held twice in memory while written)."""
    import shutil
    from pathlib import Path

    from vecgpt.attention_cli import available_bytes

    free_memory = available_bytes()
    folder = next(p for p in [Path(out).absolute(), *Path(out).absolute().parents] if p.exists())
    free_disk = shutil.disk_usage(folder).free
    if (free_memory and 2 * size > free_memory) or size > free_disk:  # 0: memory unknown (not Linux)
        raise VecgptError(f"a checkpoint of these sizes takes {size / 1e9:,.2f} GB; this machine has "
                          f"{free_memory / 1e9:,.1f} GB of memory and {free_disk / 1e9:,.1f} GB of disk free "
                          f"in {folder}: choose smaller --layers/--embd/--ctx/--vocab")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="vecgpt", description="GPT-2 where every matrix multiply is a vector search")
    sub = root.add_subparsers(dest="command", required=True)

    p = sub.add_parser("load", help="push a model into a store")
    add_store_args(p), add_model_arg(p)
    p.add_argument("--replace", action="store_true", help="overwrite a store holding another model")
    p.add_argument("--dry-run", action="store_true", help="print what a load would write, write nothing")
    p.set_defaults(func=cmd_load)

    for name, func, text in (("ls", cmd_ls, "the model a store holds"), ("drop", cmd_drop, "remove the model from a store")):
        p = sub.add_parser(name, help=text)
        add_store_args(p)
        p.set_defaults(func=func)

    p = sub.add_parser("generate", help="continue a prompt through a store")
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
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("compare", help="store against numpy: scores and greedy tokens")
    add_store_args(p), add_model_arg(p)
    p.add_argument("prompt")
    p.add_argument("-n", type=int, default=8)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("tokenize", help="GPT-2 token ids of a text")
    p.add_argument("text")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tokenize)

    p = sub.add_parser("make-model", help="write a random GPT-2-shaped checkpoint")
    p.add_argument("out")
    for flag, default in (("layers", 12), ("heads", 12), ("embd", 768), ("ctx", 1024), ("vocab", 50257), ("seed", 0)):
        p.add_argument(f"--{flag}", type=int, default=default)
    p.set_defaults(func=cmd_make_model)

    for module in ("vecgpt.attention_cli", "vecgpt.experiments_cli", "vecgpt.tpuf_cli"):
        try:
            __import__(module, fromlist=["register"]).register(sub)
        except ImportError:
            pass
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code = args.func(args) or 0
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's final flush
        return code
    except VecgptError as e:
        print(f"vecgpt: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `vecgpt ls | head`: the reader has what it wanted
        quiet_stdout()
        return 0
    except OSError as e:  # a path that is a folder, unreadable, on a full disk: the user's to fix
        print(f"vecgpt: error: {os_error(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vecgpt: interrupted", file=sys.stderr)
        return 130


def quiet_stdout() -> None:
    """Point stdout at /dev/null so the buffered rest is dropped instead of raising again at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no real file (captured in tests)
        pass


def os_error(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{e.strerror or e}"


if __name__ == "__main__":
    sys.exit(main())
