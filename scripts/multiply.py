"""Draws docs/img/multiply.png: a small `x @ W + b` done as one exact search, as vecgpt/encoding.py does it.
    python scripts/multiply.py [--out docs/img/multiply.png]
Output j's weights w_j (a column of W) and bias b_j are the document (w_j, b_j, p_j), padded by
p_j = sqrt(M^2 - |w_j|^2 - b_j^2) so every document has length M; x is the query (x, 1, 0), and
w_j . x + b_j = (M^2 + |q|^2 - dist_j) / 2 with dist_j the squared distance. Needs matplotlib."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
W = np.array([[0.5, 1.5, -0.5], [-1.0, 0.5, 1.0]])  # [in 2, out 3], GPT-2's Conv1D layout: x @ W + b
B = np.array([0.5, -1.0, 0.5])
X = np.array([1.0, 2.0])
DOC, PAD, QUERY = "#dbe9f6", "#fbe7c6", "#e3f1df"


def encode(w, b, x):
    """Documents [out, in + 2], the query [in + 2], M^2: the padded form (vecgpt.encoding, without its scaling)."""
    norms = (w * w).sum(0) + b * b
    m2 = norms.max()
    docs = np.column_stack([w.T, b, np.sqrt(m2 - norms)])
    return docs, np.concatenate([x, [1.0, 0.0]]), m2


def cell(ax, x, y, text, colour, w=1.0, bold=False):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, 0.8, fc=colour, ec="#666", lw=0.8))
    ax.text(x + w / 2, y + 0.4, text, ha="center", va="center", fontsize=12, weight="bold" if bold else "normal")


CW = 1.2  # a cell's width


def grid(ax, docs, q):
    for col, (doc_head, query_head) in enumerate([("w₁", "x₁"), ("w₂", "x₂"), ("b", "1"), ("pad p", "0")]):
        x = 1.6 + col * CW + CW / 2
        ax.text(x, 3.95, doc_head, ha="center", fontsize=12, weight="bold")
        ax.text(x, -1.45, query_head, ha="center", fontsize=12, weight="bold")
    ax.text(1.6 + 4 * CW + 0.2 + 0.5, 3.95, "length", ha="center", fontsize=11, weight="bold")
    for j, doc in enumerate(docs):
        y = 3.0 - j
        ax.text(1.45, y + 0.4, f"document {j + 1}", ha="right", va="center", fontsize=11.5)
        for col, v in enumerate(doc):
            cell(ax, 1.6 + col * CW, y, f"{v:.2f}", PAD if col == 3 else DOC, w=CW)
        cell(ax, 1.6 + 4 * CW + 0.2, y, f"{np.linalg.norm(doc):.2f}", "#f4f4f4")
    ax.text(1.45, -0.6, "query q", ha="right", va="center", fontsize=11.5, weight="bold")
    for col, v in enumerate(q):
        cell(ax, 1.6 + col * CW, -1.0, f"{v:.2f}", QUERY, w=CW, bold=True)
    cell(ax, 1.6 + 4 * CW + 0.2, -1.0, f"{np.linalg.norm(q):.2f}", "#f4f4f4")


def bars(ax, docs, q, m2, y_true):
    from matplotlib.patches import Rectangle

    dist = ((docs - q) ** 2).sum(1)
    for j, d in enumerate(dist):
        y = 3.0 - j
        ax.add_patch(Rectangle((8.6, y + 0.1), d * 0.3, 0.6, fc="#b9a3d3"))
        found = (m2 + q @ q - d) / 2
        ax.text(8.6 + d * 0.3 + 0.15, y + 0.4, f"dist {d:.2f}  →  y = {found:.2f}", va="center", fontsize=12)
        ax.text(17.3, y + 0.4, f"x·w + b = {y_true[j]:.2f}", va="center", fontsize=12, color="#2a6b2a")
    ax.text(8.6, 3.95, "squared distance from q: one exact search returns all three", fontsize=11, weight="bold")


def draw(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs, q, m2 = encode(W, B, X)
    fig, ax = plt.subplots(figsize=(16, 6))
    ax.set_xlim(-0.3, 19.8)
    ax.set_ylim(-1.8, 5.2)
    ax.axis("off")
    ax.text(-0.2, 4.85, "A multiply as a search:  y = x @ W + b", fontsize=15, weight="bold")
    grid(ax, docs, q)
    bars(ax, docs, q, m2, X @ W + B)
    ax.text(
        8.6,
        -0.6,
        f"every document has length M = {np.sqrt(m2):.2f} (the pad p fills it up), so\n"
        f"y = (M² + |q|² − dist) / 2 = ({m2:.2f} + {q @ q:.2f} − dist) / 2:\nthe nearest document is the largest output",
        va="center",
        fontsize=11,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "multiply.png")
    draw(parser.parse_args().out)


if __name__ == "__main__":
    main()
