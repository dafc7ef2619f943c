"""`vecgpt tpuf-gc`: list (and remove) the texts a store holds: key namespaces that runs left behind, and kept
texts (those with a record), each aged by its newest write (docs/turbopuffer.md)."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

from vecgpt.errors import TextConflict, VecgptError


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
        print("no texts")
        return 0
    removed = sum(_one(store, t, args) for t in texts)
    if args.remove:
        print(f"removed {removed} of {len(texts)} texts")
    else:
        print(f"{len(texts)} texts; pass --remove to delete those idle for --older-than minutes (default 60)")
    store.close()
    return 0


def _one(store, t: dict, args) -> bool:
    """Print one text (its key namespaces and its record: a kept text has one, a crashed run's has none);
    remove it if asked and idle long enough. Whether it was removed."""
    age = _age_minutes(t["updated_at"]) if t["updated_at"] else None
    old = age is None or age >= args.older_than
    mark = "remove" if args.remove and old else ("keep (recent)" if args.remove else "")
    age_s = f"{age:,.0f} min ago" if age is not None else "no data"
    kept = "no record" if t["record"] is None else f"record v{t['record']}"
    print(
        f"{t['text']:20s} {t['namespaces']:>3} ns {t['documents']:>8,} docs {t['bytes'] / 1e6:>9.2f} MB  "
        f"{kept:>12s}  updated {age_s:>14s}  {mark}".rstrip()
    )
    if not (args.remove and old):
        return False
    try:
        store.remove_text(t)
    except TextConflict:
        print(f"{t['text']}: written by another process meanwhile; kept")
        return False
    return True


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
