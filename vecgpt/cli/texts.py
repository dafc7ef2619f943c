"""The texts subcommand: list the texts a store keeps, remove abandoned ones, close one; and what the
playground does to a kept text: show it, step back, retry, branch. Each of those says on stderr what it cost."""

from __future__ import annotations

import argparse
import json
import re
import sys

from vecgpt.cli.store import add_store_args, config_of
from vecgpt.errors import VecgptError

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
OPERANDS = {  # action -> the words it takes after the text's id
    "show": (),
    "step-back": ("POSITION",),
    "retry": (),
    "branch": ("POSITION", "TOKEN"),
}


def seconds(text: str) -> float:
    """'90s', '15m', '1h', '2d' (or a bare number of seconds)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise VecgptError(f"--older-than {text!r}: give a number with s, m, h or d, e.g. 1h")
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


def run(args) -> int:
    from vecgpt.config import open_store
    from vecgpt.text import gc_texts, list_texts

    args.action = ALIASES.get(args.action, args.action)
    if args.action in OPERANDS:
        return operate(args)
    if args.action != "close" and args.words:
        raise VecgptError(f"texts {args.action} takes no {args.words[0]!r}; `vecgpt texts --help` lists the forms")
    store = open_store(config_of(args))
    try:
        if args.action == "gc":
            removed = gc_texts(store, seconds(args.older_than or "1h"))
            print(json.dumps(removed) if args.json else f"removed {len(removed)} texts {' '.join(removed)}".rstrip())
        elif args.action == "close":
            close(store, args.words)
        else:
            listing(list_texts(store), args.json)
    finally:
        store.close()
    return 0


def close(store, words: list[str]) -> None:
    from vecgpt.text import read_record, remove

    if len(words) != 1:
        raise VecgptError("name the text to close: vecgpt texts close TEXT_ID")
    remove(store, words[0], read_record(store, words[0])["version"])
    print(f"closed text {words[0]}")


def listing(texts: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps(texts))
        return
    wide = max([len("model"), *(len(t["model"]) for t in texts)])  # a model's key whole: `vecgpt ls` shows it so
    print(f"{'text':12}  {'model':{wide}}  {'tokens':>6}  {'age':>8}  {'bytes':>12}")
    for t in texts:
        print(f"{t['id']:12}  {t['model']:{wide}}  {t['tokens']:>6}  {t['age_s']:>7.0f}s  {t['bytes']:>12,}")


# ----------------------------------------------------------------------------- show, step back, retry, branch


def operands(args) -> tuple[str, list[int]]:
    """The text's id and the action's whole numbers, or a one-line error naming the form."""
    names = OPERANDS[args.action]
    form = " ".join(("TEXT_ID", *names))
    if len(args.words) != 1 + len(names):
        raise VecgptError(f"texts {args.action} takes {form}: vecgpt texts {args.action} {form}")
    return args.words[0], [whole(word, name) for word, name in zip(args.words[1:], names)]


def whole(word: str, name: str) -> int:
    try:
        return int(word)
    except ValueError:
        raise VecgptError(f"{name} must be a whole number, not {word!r}") from None


def operate(args) -> int:
    """Open the kept text (Text.resume), do the action, print its result; its cost on stderr."""
    from vecgpt import api
    from vecgpt.text import Text

    text_id, numbers = operands(args)
    config = config_of(args)
    engine = api.engine_for_text(config, text_id)
    try:
        text = Text.resume(engine, text_id)
        text.keep()
        made = ACTIONS[args.action](text, numbers, args)
        cost = command_cost(config, engine.store, [text, made])
        print(f"vecgpt: {args.action}: {cost_line(cost)}", file=sys.stderr)
        shown = made or text
        if args.json:
            out = api.text_json(shown)
            print(json.dumps(out if args.action == "show" else {**out, "cost": cost}))
        elif args.action == "show":
            print(describe(api.text_json(text)), end="")
        else:
            print(shown.id if args.action == "branch" else tokens_text(shown))
    finally:
        engine.store.close()
    return 0


def step_back(text, numbers, args):
    (position,) = numbers
    check_position(text, position, len(text.tokens))
    text.step_back(position)


def retry(text, numbers, args):
    if args.seed is not None and args.seed < 0:
        raise VecgptError(f"--seed must be 0 or more, not {args.seed}")
    before = text.tokens[-1:]
    token = text.retry(args.seed)
    was = f"{before[0]} {quoted(text, before[0])}" if before else "-"
    print(
        f"vecgpt: retry: position {len(text.tokens) - 1} drawn again with seed {text.settings['seed']}: "
        f"{was} -> {token} {quoted(text, token)}",
        file=sys.stderr,
    )


def branch(text, numbers, args):
    position, token = numbers
    check_position(text, position)
    child = text.branch(position, token)
    child.keep()
    child.generate(0)  # an operation: the candidates rows it copied land, and a record that claims them
    return child


ACTIONS = {"show": lambda text, numbers, args: None, "step-back": step_back, "retry": retry, "branch": branch}


def check_position(text, position: int, end: int | None = None) -> None:
    """A generated position (or, with `end`, up to it), as the playground checks it."""
    top = end if end is not None else len(text.tokens) - 1
    if not text.prompt_len <= position <= top:
        raise VecgptError(
            f"position {position} is not a generated token of text {text.id} "
            f"(those are {text.prompt_len}..{len(text.tokens) - 1}; `vecgpt texts show {text.id}` lists them)"
        )


def command_cost(config, store, texts) -> dict:
    """What this command sent: every request of the texts' sessions (opening the text included), the
    positions read and, on a store that charges and keeps a usage tally, dollars at the published prices."""
    from vecgpt.backends.base import extra
    from vecgpt.meter import summarize

    sessions = [t.session for t in texts if t is not None]
    total = summarize([token for s in sessions for token in s.meter.tokens])
    cost = {**total, "positions_read": sum(s.positions_read for s in sessions)}
    price = extra(config.backend, "dollars") if getattr(store, "usage", None) is not None else None
    if price is not None:
        cost["dollars"] = price(store.usage)
    return cost


def cost_line(c: dict) -> str:
    """A cost as the playground words it."""
    parts = [f"{c['total']} requests", f"{c['round_trips']} round trips", f"{c['positions_read']} positions read"]
    parts.append(f"{1000 * c['seconds']:.1f} ms")
    if c.get("dollars") is not None:
        parts.append(f"${c['dollars']:.3g}")
    return ", ".join(parts)


def quoted(text, token: int) -> str:
    return json.dumps(text.tokenizer.decode([token]))


def tokens_text(text) -> str:
    return text.tokenizer.decode(text.tokens)


def describe(d: dict) -> str:
    """`texts show` for a reader: the settings, the text, each generated token with its best candidates."""
    s, spent = d["settings"], d["spent"]
    lines = [
        f"text {d['id']}  model {d['model']}  {len(d['tokens'])} tokens ({d['prompt_len']} prompt)",
        f"temperature {s['temperature']}, top-k {s['top_k']}, seed {s['seed']}",
        d["prompt"] + d["text"],
        f"{'pos':>5} {'token':>6} {'text':16} {'p':>6}  best candidates (p)",
    ]
    for c, t in zip(d["candidates"], d["tokens"][d["prompt_len"] :]):
        chosen = next((r for r in c["rows"] or [] if r["chosen"]), None)
        best = ", ".join(f"{json.dumps(r['text'])} {r['probability']:.3f}" for r in (c["rows"] or [])[:4])
        p = f"{chosen['probability']:.3f}" if chosen else "-"
        lines.append(f"{t['position']:>5} {t['id']:>6} {json.dumps(t['text'])[:16]:16} {p:>6}  {best}")
    if spent:
        lines.append(
            f"spent so far: {spent['requests']} requests, {spent['round_trips']} round trips, "
            f"{spent['positions_read']} positions read, {spent['seconds']:.3f} s"
        )
    return "\n".join(lines) + "\n"


FORMS = {  # action -> (its words, what it does)
    "list": ("", "the texts the store keeps: id, model, tokens, age, bytes"),
    "gc": ("", "remove texts not written for --older-than, and rows no text claims"),
    "close": ("TEXT_ID", "remove a kept text"),
    "show": ("TEXT_ID", "a kept text: its settings, tokens and each generated token's candidates; what it has cost"),
    "step-back": ("TEXT_ID POSITION", "forget the text's tokens from POSITION on (a generated position)"),
    "retry": ("TEXT_ID", "draw the last token again, with --seed or the text's seed + 1"),
    "branch": ("TEXT_ID POSITION TOKEN", "a new text sharing positions before POSITION, TOKEN at it; prints its id"),
}
ALIASES = {"ls": "list"}  # as `vecgpt ls` lists models
WORDS = {
    "TEXT_ID": "a kept text's id (`vecgpt texts` lists them)",
    "POSITION": "a generated token's position (`vecgpt texts show TEXT_ID` lists them)",
    "TOKEN": "a token id (`vecgpt tokenize TEXT` gives them)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`texts` and each action's own parser (`vecgpt texts show --help`); the options may come before the action."""
    p.description = (
        "vecgpt texts [list] | gc | close TEXT_ID | show TEXT_ID | step-back TEXT_ID POSITION | "
        "retry TEXT_ID [--seed S] | branch TEXT_ID POSITION TOKEN (prints the new text's id)"
    )
    add_options(p)
    p.set_defaults(action="list", words=[])
    actions = p.add_subparsers(dest="action", metavar="ACTION", title="actions (each has its --help)")
    for action, (words, does) in FORMS.items():
        # unset options are left out of an action's answer, so those given before the action stay
        a = actions.add_parser(
            action,
            aliases=[a for a, of in ALIASES.items() if of == action],
            help=does,
            description=does,
            usage=f"vecgpt texts {action} {words} [options]".replace("  ", " "),
            argument_default=argparse.SUPPRESS,
        )
        said = "; ".join(f"{w}: {WORDS[w]}" for w in words.split())
        a.add_argument("words", nargs="*", metavar=words or "-", help=said or argparse.SUPPRESS)
        add_options(a, action)


def add_options(p: argparse.ArgumentParser, action: str | None = None) -> None:
    """The store's options and --json, and the options of `action` (all of them on `texts` itself)."""
    add_store_args(p)
    if action in (None, "gc"):
        p.add_argument("--older-than", metavar="AGE", help="gc: remove texts not written for this long (default 1h)")
    if action in (None, "retry"):
        p.add_argument("--seed", type=int, help="retry: the new seed (default: the text's seed + 1)")
    p.add_argument("--json", action="store_true", help="the result as JSON")
