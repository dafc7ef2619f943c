"""matplotlib for the experiments: headless pyplot, saving a figure, the shared log-scale error plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def save_plot(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def require() -> None:
    """Stop before the work, with an install hint, where matplotlib is missing."""
    import importlib.util

    from vecgpt.errors import VecgptError

    if importlib.util.find_spec("matplotlib") is None:
        raise VecgptError("the plots need matplotlib: pip install 'vecgpt[plots]'")


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
