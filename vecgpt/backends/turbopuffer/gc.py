"""`vecgpt tpuf-gc`: list (and remove) the text namespaces that runs left behind (docs/turbopuffer.md)."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

from vecgpt.errors import VecgptError


def _age_minutes(stamp: str) -> float | None:
    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (datetime.now(timezone.utc) - then).total_seconds() / 60


def run(args) -> int:
    from vecgpt.config import load_config, open_store

    if not 0 <= args.older_than < float("inf"):  # NaN too: it would keep everything
        raise VecgptError(f"--older-than must be 0 or more minutes, not {args.older_than}")
    config = load_config(args.config) if args.config else load_config(backend="turbopuffer")
    if config.backend != "turbopuffer":
        raise VecgptError(
            f'tpuf-gc needs a turbopuffer config (backend = "turbopuffer"); {args.config} says '
            f"backend = {config.backend!r} (see configs/turbopuffer.toml)"
        )
    if getattr(args, "store", None) is not None:
        config.store["prefix"] = args.store
    store = open_store(config)
    texts = store.leftover_texts()
    if not texts:
        print("no text namespaces")
        return 0
    removed = 0
    for t in texts:
        age = _age_minutes(t["updated_at"]) if t["updated_at"] else None
        old = age is None or age >= args.older_than
        mark = "remove" if args.remove and old else ("keep (recent)" if args.remove else "")
        age_s = f"{age:,.0f} min ago" if age is not None else "no data"
        print(
            f"{t['text']:20s} {t['namespaces']:>3} ns {t['documents']:>8,} docs {t['bytes'] / 1e6:>9.2f} MB  "
            f"updated {age_s:>14s}  {mark}".rstrip()
        )
        if args.remove and old:
            store.drop(t["text"])
            removed += 1
    if args.remove:
        print(f"removed {removed} of {len(texts)} texts")
    else:
        print(f"{len(texts)} texts; pass --remove to delete those idle for --older-than minutes (default 60)")
    store.close()
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help='TOML file with backend = "turbopuffer" and its [store] options')
    p.add_argument("--store", metavar="PREFIX", help="the namespace prefix (overrides [store] prefix)")
    p.add_argument("--remove", action="store_true", help="delete them (they are billed for storage)")
    p.add_argument(
        "--older-than",
        type=float,
        default=60.0,
        metavar="MINUTES",
        help="only texts not written for this long (a running generation keeps writing); default 60",
    )
