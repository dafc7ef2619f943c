"""Draws vecgpt's layers into docs/img/architecture.png: who calls whom, from the command line down to the stores.
    python scripts/architecture.py [--out docs/img/architecture.png]
Needs matplotlib (`pip install -e '.[plots]'`)."""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name: (x, y, width, height, title, detail, colour); x, y the lower left corner, in a 16 x 10 frame
ENTRY, TEXT, ENGINE, STORE, SIDE = "#dbe9f6", "#e3f1df", "#fbe7c6", "#ece2f3", "#eeeeee"
BOXES = {
    "cli": (0.3, 8.7, 3.6, 1.0, "vecgpt/cli/", "the `vecgpt` subcommands", ENTRY),
    "playground": (4.3, 8.7, 3.6, 1.0, "vecgpt/playground/", "`vecgpt serve`: the browser pages", ENTRY),
    "experiments": (8.3, 8.7, 3.6, 1.0, "experiments/NN_name/", "agreement, storage, requests, ...", ENTRY),
    "benchmarks": (12.3, 8.7, 3.4, 1.0, "benchmarks/", "speed table, round trips, ...", ENTRY),
    "api": (
        0.3,
        7.3,
        11.6,
        0.9,
        "api.py",
        "generate, compare, load: what the CLI, the playground and the experiments call",
        TEXT,
    ),
    "loading": (12.3, 7.3, 3.4, 0.9, "loading.py", "a model into a store", TEXT),
    "text": (4.3, 5.9, 7.6, 0.9, "text.py", "a text kept in the store: resume, step back, retry, branch", TEXT),
    "writer": (12.3, 5.9, 2.6, 0.9, "writer.py", "writes in order,\noff the critical path", TEXT),
    "reference": (
        0.3,
        3.2,
        3.6,
        3.6,
        "reference.py",
        "numpy GPT-2 with a KV cache:\nthe yardstick,\nx @ w + b in numpy\n\nthe same functions\nin the same order\nas engine.py",
        SIDE,
    ),
    "engine": (
        4.3,
        3.2,
        7.6,
        2.3,
        "engine.py",
        "one Session per text: each x @ w + b is one exact search",
        ENGINE,
    ),
    "meter": (
        12.3,
        3.2,
        2.7,
        2.3,
        "meter.py",
        "wraps the store:\nrequests, subqueries,\nround trips, seconds,\nq.k products",
        TEXT,
    ),
    "protocol": (
        0.3,
        1.8,
        15.4,
        0.9,
        "backends/base.py: the Store protocol",
        "search (filtered, exact: every row or top k) | upsert | fetch | clone | text records",
        STORE,
    ),
}
LAYOUTS = [  # inside the engine's box
    ("four", "engine.Session:\nc_attn | keys, per-head\nc_proj | c_fc | c_proj"),
    ("three", "three_rounds.py\nproducts made at load;\nauto's behind a network"),
    ("five", "five_rounds.py, the textbook\norder; auto's in process"),
]
STORES = [
    ("memory", "numpy, float64\ndistances"),
    ("faiss", "flat indexes,\nthe default"),
    ("pgvector", "PostgreSQL,\nsequential scans"),
    ("lancedb", "embedded,\nflat search"),
    ("turbopuffer", "official client;\ntpuf-local server"),
]
ARROWS = [  # (from, to): "from calls to"
    ("cli", "api"),
    ("playground", "api"),
    ("experiments", "api"),
    ("benchmarks", "loading"),
    ("api", "loading"),
    ("api", "reference"),
    ("text", "engine"),
    ("engine", "meter"),
    ("writer", "meter"),
]


def box(ax, x, y, w, h, title, detail, colour, size=11):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.12", fc=colour, ec="#444"))
    top = y + h - 0.28 if detail else y + h / 2
    ax.text(x + w / 2, top, title, ha="center", va="center", fontsize=size, weight="bold", family="monospace")
    if detail:
        ax.text(x + w / 2, top - 0.25, detail, ha="center", va="top", fontsize=size - 2, linespacing=1.25)


def arrow(ax, a, b, colour="#555"):
    ax.annotate("", xy=b, xytext=a, arrowprops=dict(arrowstyle="-|>", color=colour, lw=1.3, shrinkA=2, shrinkB=2))


def ends(a, b):
    """Where an arrow from box a to box b starts and ends: straight down when b is below a, else side to side."""
    (ax_, ay, aw, ah), (bx, by, bw, bh) = BOXES[a][:4], BOXES[b][:4]
    if ay >= by + bh - 0.01:
        x = ax_ + aw / 2 if bx <= ax_ + aw / 2 <= bx + bw else bx + bw / 2
        return (x, ay), (x, by + bh)
    return (ax_ + aw, ay + ah / 2), (bx, by + bh / 2)


def draw(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(16, 10.2))
    ax.set_xlim(0, 16)
    ax.set_ylim(-0.1, 10.2)
    ax.axis("off")
    for spec in BOXES.values():
        box(ax, *spec)
    for i, (title, detail) in enumerate(LAYOUTS):  # the engine's layouts, inside its box
        box(ax, 4.5 + i * 2.5, 3.35, 2.2, 1.4, f"layout {title}", detail, "#fff6e6", size=10)
    for i, (name, detail) in enumerate(STORES):
        x = 0.3 + i * 3.1
        box(ax, x, 0.0, 2.9, 1.3, name, detail, STORE)
        arrow(ax, (x + 1.45, 1.8), (x + 1.45, 1.3))
    for a, b in ARROWS:
        arrow(ax, *ends(a, b))
    arrow(ax, (8.1, 7.3), (8.1, 6.8))  # api -> text
    arrow(ax, (11.9, 5.3), (12.3, 6.1))  # engine -> writer
    arrow(ax, (13.6, 3.2), (13.6, 2.7))  # meter -> the store
    arrow(ax, (15.35, 7.3), (15.35, 2.7), colour="#888")  # loading -> the store
    ax.text(0.3, 9.95, "vecgpt's layers (an arrow: calls)", fontsize=14, weight="bold")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "architecture.png")
    draw(parser.parse_args().out)


if __name__ == "__main__":
    main()
