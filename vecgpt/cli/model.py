"""The model subcommands: tokenize and make-model."""

from __future__ import annotations

import argparse
import json

from vecgpt.errors import VecgptError


def cmd_tokenize(args) -> int:
    from vecgpt import tokenizer

    if args.model:  # a model's own tokenizer (a Llama folder's tokenizer.json); numpy is loaded only then
        from vecgpt import weights

        ids = tokenizer.of_model(weights.load(args.model)).encode(args.text)
    else:
        ids = tokenizer.encode(args.text)
    print(json.dumps(ids) if args.json else " ".join(map(str, ids)))
    return 0


def cmd_make_model(args) -> int:
    from vecgpt import weights

    hp = shape_of(args)
    if min(hp.n_layer, hp.n_head, hp.n_embd, hp.n_ctx, hp.n_vocab) < 1 or hp.n_embd % hp.n_head:
        raise VecgptError("--layers, --heads, --embd, --ctx, --vocab must be positive and --embd divisible by --heads")
    if args.seed < 0:
        raise VecgptError(f"--seed must be 0 or more, not {args.seed}")
    if not args.out.strip():
        raise VecgptError('give the folder to write the model to ("." for this one)')
    check_room(weights.parameter_count(hp) * 4, args.out)
    out = weights.make_model(args.out, hp, args.seed)
    print(f"{out}: random GPT-2 ({weights.describe(hp)}), seed {args.seed}")
    return 0


def shape_of(args):
    """--size (scaled by --scale) gives the shape; --layers/--heads/--embd/--ctx/--vocab given beside it override it."""
    from vecgpt import weights

    given = {f: getattr(args, f) for f in ("layers", "heads", "embd", "ctx", "vocab")}
    if args.size is None:
        if args.scale is not None:
            raise VecgptError("--scale scales a --size: give both, e.g. --size gpt2-xl --scale 16")
        return weights.HParams(*(v if v is not None else DEFAULTS[f] for f, v in given.items()))
    hp = weights.size_shape(args.size, 1 if args.scale is None else args.scale)
    fields = dict(zip(given, (hp.n_layer, hp.n_head, hp.n_embd, hp.n_ctx, hp.n_vocab)))
    return weights.HParams(*(v if v is not None else fields[f] for f, v in given.items()))


def check_room(size: int, out: str) -> None:
    """Refuse a checkpoint that cannot fit, before allocating it (held twice in memory while written)."""
    import shutil
    from pathlib import Path

    from vecgpt.cli.attention import available_bytes

    free_memory = available_bytes()
    folder = next(p for p in [Path(out).absolute(), *Path(out).absolute().parents] if p.exists())
    free_disk = shutil.disk_usage(folder).free
    if (free_memory and 2 * size > free_memory) or size > free_disk:  # 0: memory unknown (not Linux)
        raise VecgptError(
            f"a checkpoint of these sizes takes {size / 1e9:,.2f} GB; this machine has "
            f"{free_memory / 1e9:,.1f} GB of memory and {free_disk / 1e9:,.1f} GB of disk free "
            f"in {folder}: choose smaller --layers/--embd/--ctx/--vocab"
        )


def tokenize_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text")
    p.add_argument("--model", help="encode with this model's tokenizer (a folder or name; default: GPT-2's)")
    p.add_argument("--json", action="store_true")


def make_model_arguments(p: argparse.ArgumentParser) -> None:
    from vecgpt.weights import SIZES

    p.add_argument("out")
    p.add_argument("--size", choices=list(SIZES), help="a GPT-2 size's shape (default: gpt2, the small one)")
    p.add_argument("--scale", type=int, help="with --size: that shape scaled down, heads kept, each 64/SCALE wide")
    for flag in DEFAULTS:
        p.add_argument(f"--{flag}", type=int)
    p.add_argument("--seed", type=int, default=0)


DEFAULTS = {"layers": 12, "heads": 12, "embd": 768, "ctx": 1024, "vocab": 50257}
