"""matplotlib for the experiments: headless pyplot, saving a figure, the shared log-scale error plot."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np


def save_plot(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


EXTRA = "pip install 'vecgpt[plots]'"


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def draw(figures: dict[str, Callable[[], object]]) -> list[str]:
    """Each figure drawn (its file name -> a function drawing it), and their names; without matplotlib none, said
    once on stderr with the extra that brings them: the JSON and tables are the results, the plots a view of them."""
    if not figures:
        return []
    if not available():
        print(f"no plots ({', '.join(figures)}): they need matplotlib: {EXTRA}", file=sys.stderr)
        return []
    for make in figures.values():
        make()
    return list(figures)


def require() -> None:
    """Stop with an install hint where matplotlib is missing (drawing without `draw`)."""
    from vecgpt.errors import VecgptError

    if not available():
        raise VecgptError(f"the plots need matplotlib: {EXTRA}")


def pyplot():
    require()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def log_error_plot(curves, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    """One line per (label, x, errors) of curves on a log scale (zero errors left out), saved to path."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, x, e in curves:
        e = np.asarray(e, float)
        ax.plot(x, np.where(e > 0, e, np.nan), marker="o", ms=3, label=label)
    ax.set_yscale("log")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_plot(fig, path)
