"""The texts subcommand: list the texts a store holds, remove abandoned ones, close one."""

from __future__ import annotations

import argparse
import json
import re

from vecgpt.cli.store import add_store_args, config_of
from vecgpt.errors import VecgptError

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(text: str) -> float:
    """'90s', '15m', '1h', '2d' (or a bare number of seconds)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise VecgptError(f"--older-than {text!r}: give a number with s, m, h or d, e.g. 1h")
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


def run(args) -> int:
    from vecgpt.config import open_store
    from vecgpt.text import gc_texts, list_texts

    store = open_store(config_of(args))
    try:
        if args.action == "gc":
            removed = gc_texts(store, seconds(args.older_than))
            print(json.dumps(removed) if args.json else f"removed {len(removed)} texts {' '.join(removed)}".rstrip())
        elif args.action == "close":
            close(store, args.text_id)
        else:
            show(list_texts(store), args.json)
    finally:
        store.close()
    return 0


def close(store, text_id: str | None) -> None:
    from vecgpt.text import read_record, remove

    if not text_id:
        raise VecgptError("name the text to close: vecgpt texts close TEXT_ID")
    remove(store, text_id, read_record(store, text_id)["version"])
    print(f"closed text {text_id}")


def show(texts: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps(texts))
        return
    print(f"{'text':12}  {'model':24}  {'tokens':>6}  {'age':>8}  {'bytes':>12}")
    for t in texts:
        print(f"{t['id']:12}  {t['model'][:24]:24}  {t['tokens']:>6}  {t['age_s']:>7.0f}s  {t['bytes']:>12,}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p)
    p.add_argument("action", nargs="?", choices=["list", "gc", "close"], default="list")
    p.add_argument("text_id", nargs="?", help="the text to close")
    p.add_argument("--older-than", default="1h", help="gc: remove texts not written for this long (default 1h)")
    p.add_argument("--json", action="store_true")
