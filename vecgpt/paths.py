"""Paths given by a user, and the small JSON files vecgpt keeps in its cache."""

from __future__ import annotations

import json
from pathlib import Path

from vecgpt.errors import VecgptError


def expand(path: str | Path) -> Path:
    """The path with ~ or ~user expanded; a one-line error when there is no such user."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise VecgptError(f"cannot expand {str(path)!r}: no such user's home; give the full path") from None


def read_cache(path: Path) -> dict:
    """A cache file's JSON object: {} when it is missing, unreadable or not an object (it is only ever a cache)."""
    try:
        held = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return held if isinstance(held, dict) else {}
