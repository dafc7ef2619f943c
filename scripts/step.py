"""Draws docs/img/step.png: one step of the batched engine (vecgpt/stepper.py, engine.Step) in layout five.
    python scripts/step.py [--out docs/img/step.png]
Four texts in flight stack their new rows into one block; each of a layer's five rounds is one search of a model
matrix with every row, except the key search, where each text searches its own collection in the same round.
Needs matplotlib (`pip install -e '.[plots]'`)."""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYER, N_LAYER = 3, 12
# (text, the positions it reads in this step): A, B and D decode one; C reads the last chunk of its prompt
TEXTS = [("A", [17]), ("B", [5]), ("C", [64, 65, 66, 67]), ("D", [30])]
N_ROWS = sum(len(positions) for _, positions in TEXTS)
COLOUR = {"A": "#f9d9a6", "B": "#cde8c4", "C": "#c4dcf2", "D": "#f4c6cc"}
MATRIX, NUMPY, EDGE = "#e4d6f0", "#eeeeee", "#444"
RH, GAP, TOP = 0.88, 0.22, 9.0  # a row's height, the gap between texts, the block's top
# the columns left to right: (kind, width, what); kinds: block, numpy (all rows), search (all rows), keys, attend, token
COLUMNS = [
    ("block", 2.5, ""),
    ("numpy", 0.42, "ln_1: numpy, all rows"),
    ("search", 2.2, ("round 1", "attn.c_attn")),
    ("keys", 3.8, ""),
    ("attend", 1.85, ""),
    ("search", 2.2, ("round 3", "attn.c_proj")),
    ("numpy", 0.42, "+ residual, ln_2: numpy"),
    ("search", 2.2, ("round 4", "mlp.c_fc")),
    ("numpy", 0.42, "GELU: numpy, all rows"),
    ("search", 2.2, ("round 5", "mlp.c_proj")),
    ("numpy", 0.42, "+ residual: numpy"),
    ("numpy", 0.42, "ln_f: numpy, all rows"),
    ("token", 2.75, ""),
]
COL_GAP = 0.22


def rows() -> dict:
    """Each text's rows: {text: [(y of the row's bottom, position)]}, top to bottom, a gap between texts."""
    out, y = {}, TOP
    for text, positions in TEXTS:
        out[text] = []
        for p in positions:
            y -= RH
            out[text].append((y, p))
        y -= GAP
    return out


def span(rs) -> tuple[float, float]:  # rows [(y, p)] -> (bottom, height) of a box covering them
    return rs[-1][0] + 0.04, rs[0][0] + RH - rs[-1][0] - 0.08


def box(ax, x, y, w, h, colour, lines):
    """A rounded box with lines [(text, size, bold, mono)] centred in it."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.0,rounding_size=0.08", fc=colour, ec=EDGE, lw=1))
    step = 0.31
    top = y + h / 2 + step * (len(lines) - 1) / 2
    for j, (text, size, bold, mono) in enumerate(lines):
        ax.text(
            x + w / 2,
            top - j * step,
            text,
            ha="center",
            va="center",
            fontsize=size,
            weight="bold" if bold else "normal",
            family="monospace" if mono else "sans-serif",
        )


def block(ax, x, w, rs):
    """The step's block: a cell per row, coloured by text, with its position."""
    ax.text(x + w / 2, TOP + 0.35, f"the block: {N_ROWS} rows", ha="center", fontsize=11, weight="bold")
    for text, _ in TEXTS:
        for y, p in rs[text]:
            box(ax, x, y + 0.04, w, RH - 0.08, COLOUR[text], [(f"position {p}", 10, False, False)])
        bottom = rs[text][-1][0]
        ax.text(
            x - 0.12,
            bottom + (rs[text][0][0] + RH - bottom) / 2,
            text,
            ha="right",
            va="center",
            fontsize=12,
            weight="bold",
        )
    note(
        ax,
        x + w / 2,
        rs["D"][-1][0],
        "A, B, D decode a row each;\nC reads its prompt's last chunk.\nx = wte + wpe rows: one fetch\n(a decode's came along with\nits last token search)",
    )


def note(ax, x, y, text):  # a note centred at x under a column whose boxes end at y
    ax.text(x, y - 0.22, text, ha="center", va="top", fontsize=9.5, linespacing=1.3)


def numpy_strip(ax, x, w, label, bottom, height):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, bottom), w, height, fc=NUMPY, ec="#888", lw=0.8))
    ax.text(x + w / 2, bottom + height / 2, label, rotation=90, ha="center", va="center", fontsize=10)


def shared(ax, x, w, what, bottom, height):
    """One search of a model matrix with every row of the block."""
    round_, matrix = what
    header(ax, x, w, round_, "shared")
    box(
        ax,
        x,
        bottom,
        w,
        height,
        MATRIX,
        [
            (f"h.{LAYER}.{matrix}", 9.5, True, True),
            ("", 6, False, False),
            (f"{N_ROWS} queries,", 10, False, False),
            ("one search", 10, False, False),
        ],
    )


def header(ax, x, w, title, sub):
    ax.text(x + w / 2, TOP + 0.55, title, ha="center", fontsize=11.5, weight="bold")
    ax.text(x + w / 2, TOP + 0.2, sub, ha="center", fontsize=9.5, style="italic")


def keys(ax, x, w, rs):
    """Round 2: each text's key search in its own collection, all in the same round."""
    header(ax, x, w, "round 2", "per text, one round")
    for text, positions in TEXTS:
        bottom, height = span(rs[text])
        end = positions[-1]  # each query sees the keys before its own; its own key is scored in numpy
        where = f"layer == {LAYER}, position < {end}"
        lines = [(f"text-{text}", 10, True, True), (where, 9, False, True)]
        if len(positions) > 1:
            first = [
                (f"1. writes rows {positions[0]}-{positions[-1]}", 9, False, False),
                ("2. key search:", 9, False, False),
            ]
            lines = [lines[0], ("", 6, False, False), *first, lines[1]]
        box(ax, x, bottom, w, height, COLOUR[text], lines)


def attend(ax, x, w, rs):
    """Attention per text in numpy: softmax over its scores, the weighted sum of its values."""
    header(ax, x, w, "attention", "numpy, per text")
    for text, _ in TEXTS:
        bottom, height = span(rs[text])
        box(ax, x, bottom, w, height, NUMPY, [("softmax(q·k)·v", 9.5, False, False)])


def token(ax, x, w, rs):
    """After the last layer: one top-k search of wte with the last row of each text that wants a token."""
    header(ax, x, w, "after the last layer", "shared, top k")
    bottom, height = span([*rs["A"], *rs["D"]])
    box(
        ax,
        x,
        bottom,
        w,
        height,
        MATRIX,
        [
            ("wte", 10, True, True),
            (f"{len(TEXTS)} queries, one", 10, False, False),
            ("top-k search:", 10, False, False),
            ("each text's", 10, False, False),
            ("next token", 10, False, False),
        ],
    )
    for text, positions in TEXTS:
        for j, (y, _) in enumerate(rs[text]):
            last = j == len(positions) - 1  # C's earlier rows ask for no token
            ax.annotate(
                "",
                xy=(x, y + RH / 2),
                xytext=(x - COL_GAP - 0.02, y + RH / 2),
                arrowprops=dict(arrowstyle="-|>", color="#333" if last else "#bbb", lw=1.4 if last else 0.8),
            )


def layer_bracket(ax, x0, x1):
    y = TOP + 1.05
    ax.plot([x0, x0, x1, x1], [y - 0.12, y, y, y - 0.12], color="#555", lw=1.2)
    ax.text(
        (x0 + x1) / 2,
        y + 0.12,
        f"layer {LAYER} (each of the {N_LAYER} layers the same), left to right",
        ha="center",
        fontsize=11.5,
        weight="bold",
    )


def legend(ax, y):
    from matplotlib.patches import Rectangle

    entries = [
        (MATRIX, f"a search of a model's matrix (collections <model>.h.{LAYER}.…, <model>.wte)"),
        (COLOUR["C"], "a text's own collection text-<id>: its keys and values"),
        (NUMPY, "numpy in the engine's process"),
    ]
    x, renderer = 0.3, ax.figure.canvas.get_renderer()
    for colour, what in entries:
        ax.add_patch(Rectangle((x, y), 0.5, 0.28, fc=colour, ec="#888"))
        label = ax.text(x + 0.65, y + 0.14, what, va="center", fontsize=10)
        x = ax.transData.inverted().transform(label.get_window_extent(renderer).corners()[-1])[0] + 1.2


def draw(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 0.6 + sum(w for _, w, _ in COLUMNS) + COL_GAP * (len(COLUMNS) - 1)
    fig = plt.figure(figsize=(15, 15 * 11.9 / width))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(-0.5, 11.4)
    ax.axis("off")
    rs = rows()
    bottom, height = span([*rs["A"], *rs["D"]])
    x, xs = 0.6, []
    for kind, w, what in COLUMNS:
        xs.append(x)
        if kind == "block":
            block(ax, x, w, rs)
        elif kind == "numpy":
            numpy_strip(ax, x, w, what, bottom, height)
        elif kind == "search":
            shared(ax, x, w, what, bottom, height)
        else:
            {"keys": keys, "attend": attend, "token": token}[kind](ax, x, w, rs)
        x += w + COL_GAP
    layer_bracket(ax, xs[1], xs[-3] + COLUMNS[-3][1])
    ax.text(
        0.2,
        11.2,
        "One step of the batched engine (layout five): four texts in flight, one block of rows",
        fontsize=14,
        weight="bold",
    )
    centre = [x + w / 2 for x, (_, w, _) in zip(xs, COLUMNS)]
    note(
        ax,
        centre[3],
        bottom,
        "C's rows are written before its search\n(so row 67's query finds rows 64-66);\na decode row's after, with a later round.\nA row's own key is scored in numpy",
    )
    note(ax, centre[-1], bottom, "the last row of each text\nthat wants its next token\n(C's chunk ends its prompt)")
    legend(ax, -0.3)
    ax.text(
        0.2,
        10.75,
        "Texts join and leave between steps; each step takes every text's next rows.",
        fontsize=11,
        style="italic",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "step.png")
    draw(parser.parse_args().out)


if __name__ == "__main__":
    main()
