"""Paths given by a user."""

from __future__ import annotations

from pathlib import Path

from vecgpt.errors import VecgptError


def expand(path: str | Path) -> Path:
    """The path with ~ or ~user expanded; a one-line error when there is no such user."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise VecgptError(f"cannot expand {str(path)!r}: no such user's home; give the full path") from None
