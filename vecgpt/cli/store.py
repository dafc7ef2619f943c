"""The store subcommands: load, ls, drop, generate, compare (their arguments, then what they run)."""

from __future__ import annotations

import argparse
import inspect
import json
import sys

from vecgpt.config import AUTO, LAYOUTS
from vecgpt.errors import VecgptError


def add_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML file choosing the backend and its options (see configs/)")
    p.add_argument("--backend", help="override the config's backend")
    p.add_argument("--metric", choices=["l2", "ip"], help="override the config's encoding")
    p.add_argument(
        "--store",
        metavar="LOCATION",
        help="where the store keeps its data: the backend's folder (path), "
        "schema (pgvector) or namespace prefix (turbopuffer); overrides that [store] option",
    )


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model folder, shipped model name, or hub name such as gpt2 (default: shakespeare)")


def config_of(args):
    from vecgpt.backends.base import location_key
    from vecgpt.config import load_config

    config = load_config(
        args.config,
        backend=args.backend,
        metric=args.metric,
        layout=getattr(args, "layout", None),
        attention_top_k=getattr(args, "attention_top_k", None),
        attention_index=getattr(args, "attention_index", None),
        attention_threshold=getattr(args, "attention_threshold", None),
        attention_sinks=getattr(args, "attention_sinks", None),
        attention_window=getattr(args, "attention_window", None),
    )
    if args.store is not None:
        config.store[location_key(config.backend)] = args.store
    return config


def cmd_load(args) -> int:
    from vecgpt import weights
    from vecgpt.config import open_store, settle_layout
    from vecgpt.loading import push

    config = config_of(args)
    if args.dry_run:
        print("\n".join(dry_run(config, args.model or config.model)))
        return 0
    model = weights.load(args.model or config.model)
    settle_layout(config, model.hparams)
    store = open_store(config)
    try:
        manifest = push(store, model, config.metric, progress=True if args.progress else None, layout=config.layout)
    finally:
        store.close()
    print(f"{config.backend}: holds {manifest['source']} ({manifest['fingerprint']})")
    return 0


def dry_run(config, model: str) -> list[str]:
    """What a load would write, from the model's shape alone (no weights read or fetched): a line each for the
    model, documents, bytes, time at this machine's measured rate, memory where the store holds the vectors in it,
    and (a billed store) dollars."""
    from vecgpt import weights
    from vecgpt.config import settle_layout
    from vecgpt.loading import plan

    hp, source = weights.shape(model)
    settle_layout(config, hp)
    rows = plan(hp, config.metric, config.layout)
    docs, size = sum(n for _, n, _ in rows), sum(n * d * 4 for _, n, d in rows)
    lines = [
        f"model: {source} ({hp.n_layer} layers, {hp.n_embd} wide, {hp.n_head} heads; "
        f"{weights.parameter_count(hp) / 1e6:,.1f}M parameters, {weights.parameter_count(hp) * 4 / 1e9:,.2f} GB float32)",
        f"documents: {docs:,} in {len(rows)} collections ({config.metric}, layout {config.layout})",
        f"bytes: {size / 1e6:,.1f} MB of float32 vectors",
        load_time(config.backend, size),
    ]
    if hasattr(hp, "n_kv_head"):  # a Llama-family shape
        lines.insert(1, family_line(hp))
    if config.backend in ("memory", "faiss"):
        from vecgpt.cli.attention import available_bytes

        lines.append(
            f"memory: {size / 1e9:,.2f} GB held in memory by {config.backend}, {available_bytes() / 1e9:,.1f} GB free"
        )
    estimate = cost_estimate(config, hp)
    return lines + ([estimate] if estimate else [])


def family_line(hp) -> str:
    output = "tied to the token table" if hp.tied else "its own"
    scaling = f" ({hp.scaling['rope_type']} scaling)" if hp.scaling else ""
    return (
        f"family: {hp.family}; {hp.n_head} query heads sharing {hp.n_kv_head} key/value heads, SwiGLU {hp.n_inner} "
        f"wide, rotary theta {hp.rope_theta:g}{scaling}, output matrix {output}"
    )


def load_time(backend: str, size: int) -> str:
    from vecgpt.loading import read_rates

    rate = read_rates().get(backend)
    if not rate:
        return f"time: no {backend} load measured on this machine yet (each completed load records its rate)"
    seconds = size / 1e6 / rate["mb_per_s"]
    return (
        f"time: about {duration(seconds)} at {rate['mb_per_s']:,.1f} MB/s ({rate['documents_per_s']:,.0f} documents/s), "
        f"the largest {backend} load measured here ({rate['documents']:,} documents, {rate['at'][:10]})"
    )


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:,.0f} s"
    return f"{seconds / 60:,.1f} min" if seconds < 5400 else f"{seconds / 3600:,.1f} h"


def cost_estimate(config, hp) -> str | None:
    """What loading a model of shape `hp` into the config's store costs and what a token costs there (the backend's
    estimate_cost), or None for a store that bills nothing."""
    from vecgpt.backends.base import extra
    from vecgpt.loading import plan, text_row

    estimate = extra(config.backend, "estimate_cost")
    if estimate is None:
        return None
    shape = {"n_head": hp.n_head, "key_row": text_row(hp, config.layout)}
    if hasattr(hp, "n_kv_head"):  # a Llama: n_kv_head key heads, a key padded under l2 (llama_rounds' row_widths)
        payload = hp.head_dim if config.layout == "five" else hp.group * hp.n_embd
        shape.update(n_kv_head=hp.n_kv_head, key_row=(hp.head_dim + int(config.metric == "l2"), payload))
    options = {**config.store, **shape}
    accepted = inspect.signature(estimate).parameters
    return estimate(plan(hp, config.metric, config.layout), **{k: v for k, v in options.items() if k in accepted})


def cmd_ls(args) -> int:
    from vecgpt.config import open_store
    from vecgpt.loading import models

    store = open_store(config_of(args))
    try:
        held = models(store)
    finally:
        store.close()
    if not held:
        print("no model")
    for m in held:
        print(
            f"{m['fingerprint']}  {m['source']}  metric={m['metric']}  layout={m.get('layout') or 'four'}  "
            f"{m.get('documents', 0):,} docs  "
            f"{m['bytes'] / 1e6:.1f} MB  loaded {m.get('loaded_at', '?')}"
        )
    return 0


def cmd_drop(args) -> int:
    from vecgpt.config import open_store
    from vecgpt.loading import drop, drop_old_layout

    config = config_of(args)
    if not args.old_layout and not args.model:
        raise VecgptError("name the model to drop: --model M (a folder, name or fingerprint from `vecgpt ls`)")
    store = open_store(config)
    try:
        if args.old_layout:
            print(f"dropped {len(drop_old_layout(store))} collections of the previous layout")
            return 0
        keys = [m["fingerprint"] for m in held_as(store, args.model, args.metric)]
        for key in keys:
            drop(store, key)
    finally:
        store.close()
    print("\n".join(f"dropped {key}" for key in keys))
    return 0


def held_as(store, model: str, metric: str | None) -> list[dict]:
    """The models of the store that `model` (a fingerprint or its start, a folder or a name) names."""
    from vecgpt import weights
    from vecgpt.loading import models

    held = [m for m in models(store) if metric in (None, m["metric"])]
    found = [m for m in held if len(model) >= 6 and m["fingerprint"].startswith(model)]
    if not found:
        fingerprint = weights.load(model).fingerprint
        found = [m for m in held if m["model_fingerprint"] == fingerprint]
    if not found:
        raise VecgptError(
            f"the store holds no model {model}{f' in the {metric} encoding' if metric else ''}; "
            f"`vecgpt ls` lists what it holds"
        )
    return found


def implicit_load(args, config):
    """Before `generate` loads a model the store lacks: on a paid service, state the cost and ask (or --yes)."""

    def confirm(store) -> None:
        from vecgpt import weights

        cost = cost_estimate(config, weights.load(args.model or config.model).hparams)
        if cost is None:  # not billed: load without asking
            return
        if on_this_machine(store):
            print(f"the store lacks this model; loading it first ({store.url} bills nothing)", file=sys.stderr)
            return
        print(f"the store lacks this model; loading it first:\n{cost}", file=sys.stderr)
        if args.yes:
            return
        if not sys.stdin.isatty():
            raise VecgptError(
                f"{config.backend} bills this load; pass --yes to load the model, or run "
                f"`vecgpt load --config CONFIG --layout {config.layout}` first"
            )
        print("load it? [y/N] ", end="", file=sys.stderr, flush=True)  # stdout carries only the result
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            raise VecgptError("not loaded; nothing was written")

    return confirm


def on_this_machine(store) -> bool:
    """A store served at a loopback address (`vecgpt tpuf-local`): not the paid service."""
    from urllib.parse import urlsplit

    url = getattr(store, "url", None)
    host = urlsplit(url).hostname if isinstance(url, str) else None
    return host is not None and (host == "localhost" or host == "::1" or host.startswith("127."))


def cmd_generate(args) -> int:
    from vecgpt import api

    config = config_of(args)
    seed, said = seed_of(args)
    echo = None if args.json else Echo("" if args.resume else args.prompt)
    common = dict(
        n=args.n,
        model=args.model or config.model,
        temperature=args.temperature,
        top_k=config.top_k if args.top_k is None else args.top_k,
        seed=seed,
        stop=not args.no_stop,
        on_text=SaysFirst(said, echo),
    )
    if args.batch is not None:
        return generate_batch(args, config, common)
    check_generate(args)
    if args.reference:
        out = api.generate_reference(args.prompt, policy=config.policy(), **common)
    else:
        out = api.generate_text(
            args.prompt,
            config=config,
            progress=None,
            confirm=implicit_load(args, config),
            keep=args.keep,
            resume=args.resume,
            on_kept=kept_notice,
            **common,
        )
    if args.json:
        print(json.dumps(out))
    else:
        echo.end()
    return 0


def check_generate(args) -> None:
    """A prompt or --resume, not both; --reference keeps no text."""
    if args.prompt is None and not args.resume:
        raise VecgptError("give a prompt, or --resume TEXT_ID to continue a kept text")
    if args.prompt is not None and args.resume:
        raise VecgptError(
            f"--resume continues text {args.resume} as it is and takes no prompt: drop {args.prompt!r} "
            f"(`vecgpt texts show|step-back|retry|branch {args.resume} ...` change a kept text)"
        )
    if args.reference and (args.keep or args.resume):
        raise VecgptError("--reference keeps no text; drop --keep/--resume")


def generate_batch(args, config, common: dict) -> int:
    """--batch FILE: a text for each line, stepped together; printed in the file's order as they are ready."""
    from tqdm import tqdm

    from vecgpt import batch

    clash = [
        flag
        for flag, on in (
            ("a prompt", args.prompt),
            ("--resume", args.resume),
            ("--reference", args.reference),
        )
        if on
    ]
    if clash:
        raise VecgptError(f"--batch reads its prompts from the file; drop {', '.join(clash)}")
    prompts = batch.read_prompts(args.batch)
    common.pop("on_text")("")  # the file is read: the seed line, if any
    printer = InOrder(prompts, args.json)
    with tqdm(total=len(prompts), unit="text", desc="vecgpt", disable=None, file=sys.stderr) as bar:
        printer.bar = bar
        outs = batch.generate_many(
            prompts,
            config=config,
            at_once=args.at_once,
            progress=None,
            confirm=implicit_load(args, config),
            on_result=printer,
            where=args.batch,
            keep=args.keep,
            on_kept=lambda i, text_id: kept_notice(text_id, f"{args.batch}:{i + 1}: "),
            **common,
        )
    failed = [i + 1 for i, out in enumerate(outs) if "error" in out]
    for i in failed:
        print(f"vecgpt: {args.batch}:{i}: {outs[i - 1]['error']}", file=sys.stderr)
    return 1 if failed else 0


class InOrder:
    """Each text printed once every text before it in the file has been: a JSON line, or prompt and text (the
    prompt as the file has it, as `generate` echoes its own)."""

    def __init__(self, prompts: list[str], as_json: bool):
        import threading

        self.ready: dict[int, dict] = {}
        self.prompts, self.next, self.as_json, self.lock, self.bar = prompts, 0, as_json, threading.Lock(), None

    def __call__(self, i: int, out: dict) -> None:
        with self.lock:
            self.ready[i] = out
            self.bar and self.bar.update(1)
            while self.next in self.ready:
                out = self.ready.pop(self.next)
                if self.as_json:
                    print(json.dumps(out), flush=True)
                elif "error" not in out:
                    print(self.prompts[self.next] + out["text"] + "\n", flush=True)
                self.next += 1


def seed_of(args) -> tuple[int, str | None]:
    """--seed, or for a new sampled text a fresh one, with the line that says it on stderr (SaysFirst prints it
    once the run has started, so that a refused run says no seed) so that the run can be repeated."""
    if args.seed is not None or args.resume or args.temperature == 0:
        return (0 if args.seed is None else args.seed), None
    import os

    seed = int.from_bytes(os.urandom(4), "big") >> 1
    return seed, f"vecgpt: seed: {seed} (--seed {seed} draws these tokens again)"


class SaysFirst:
    """An on_text that says `line` on stderr before the first piece of text, then passes the pieces on."""

    def __init__(self, line: str | None, then=None):
        self.line, self.then = line, then

    def __call__(self, piece: str) -> None:
        if self.line:
            print(self.line, file=sys.stderr, flush=True)
            self.line = None
        if self.then is not None:
            self.then(piece)


def kept_notice(text_id: str, where: str = "") -> None:
    print(f"vecgpt: {where}text {text_id} is kept; continue it with --resume {text_id}", file=sys.stderr, flush=True)


class Echo:
    """Text on stdout as it is made: the prompt with the first piece, then each piece, flushed; with end()'s
    newline, the same bytes as `print(prompt + text)`."""

    def __init__(self, prompt: str):
        self.prompt: str | None = prompt

    def __call__(self, piece: str) -> None:
        if self.prompt is not None:
            piece, self.prompt = self.prompt + piece, None
        sys.stdout.write(piece)
        sys.stdout.flush()

    def end(self) -> None:
        self("\n")


def cmd_compare(args) -> int:
    from vecgpt import api

    config = config_of(args)
    out = api.compare(
        args.prompt, n=args.n, config=config, model=args.model or config.model, confirm=implicit_load(args, config)
    )
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{'rank':>4} {'token':>6} {'text':14} {'store':>12} {'numpy':>12} {'abs err':>10}")
    for row in out["scores"]:
        text = repr(row["text"])[:14]
        print(
            f"{row['rank']:>4} {row['token']:>6} {text:14} {row['store']:>12.6f} {row['numpy']:>12.6f} {row['abs_error']:>10.2e}"
        )
    print(f"max abs error {out['max_abs_error']:.3e}; same top-{len(out['scores'])} set: {out['same_top_set']}")
    print(f"store greedy: {out['store_tokens']}\nnumpy greedy: {out['numpy_tokens']}")
    print(f"identical for {out['identical_steps']} of {len(out['numpy_tokens'])} steps")
    return 0


def add_layout_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--layout",
        choices=(*LAYOUTS, AUTO),
        help="auto (default): three behind a network (turbopuffer, pgvector with a DSN; four for a Llama-family "
        "model), five in process; four rounds a layer; three, with weight products made at load; five, the textbook "
        "order (docs/layouts.md)",
    )


def load_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p), add_model_arg(p), add_layout_arg(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print what a load would write (documents, bytes, time, dollars) from the model's shape; write nothing",
    )
    p.add_argument("--progress", action="store_true", help="a progress bar on stderr even when it is not a terminal")


def add_policy_args(p: argparse.ArgumentParser) -> None:
    """Which earlier keys each query attends to (vecgpt.policy; docs/topk-attention.md); default: every one."""
    p.add_argument(
        "--attention-top-k", type=int, metavar="K", help="each query's K best earlier keys by q.k (a key search of K)"
    )
    p.add_argument(
        "--attention-threshold",
        type=float,
        metavar="BETA",
        help="or every earlier key whose q.k / sqrt(hd) is within BETA of the best (a range search)",
    )
    p.add_argument("--attention-sinks", type=int, metavar="S", help="always keep the first S positions")
    p.add_argument(
        "--attention-window",
        type=int,
        metavar="W",
        help="always keep the last W earlier positions; top-k or the threshold choose between (neither: none)",
    )
    p.add_argument(
        "--attention-index",
        metavar="KIND",
        help="with --attention-top-k: search the keys approximately, by the store's index of that kind (faiss: hnsw)",
    )


def generate_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p), add_model_arg(p), add_layout_arg(p)
    p.add_argument("prompt", nargs="?")
    p.add_argument("-n", type=int, default=8, help="tokens to generate")
    p.add_argument("--keep", action="store_true", help="leave the text (--batch: each) in the store; its id on stderr")
    p.add_argument(
        "--resume",
        metavar="TEXT_ID",
        help="continue a kept text (with its own model and sampling settings); a prompt beside it is refused: "
        "nothing is appended to a kept text",
    )
    p.add_argument("--temperature", type=float, default=0.8, help="0.8 by default; 0 is greedy")
    p.add_argument("--top-k", type=int, default=None, help="candidates to sample from (default 40)")
    p.add_argument("--seed", type=int, default=None, help="the draws' seed (default: a new one, said on stderr)")
    p.add_argument("--no-stop", action="store_true", help="do not stop at <|endoftext|>")
    add_policy_args(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--reference", action="store_true", help="run the numpy reference instead of a store")
    p.add_argument(
        "--batch", metavar="FILE", help="a text for each line of FILE, stepped together (--json: a line each)"
    )
    p.add_argument("--at-once", type=int, default=16, help="with --batch: texts reading at a time (default 16)")
    add_yes(p)


def compare_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p), add_model_arg(p)
    p.add_argument("prompt")
    p.add_argument(
        "-n", type=int, default=8, help="greedy tokens each of the store and numpy generates, compared (default 8)"
    )
    p.add_argument("--json", action="store_true")
    add_yes(p)


def add_yes(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--yes", action="store_true", help="on a paid service, load the model without asking if the store lacks it"
    )


def drop_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p)
    p.add_argument(
        "--model",
        help="the model to remove: a folder, a name, or a fingerprint (or its start) from `vecgpt ls`; "
        "with --metric only that encoding",
    )
    p.add_argument(
        "--old-layout", action="store_true", help="remove a model stored in the previous layout (bare names)"
    )
