"""The Llama shapes' table (markdown) and plot (`run.py --llama`): a token's cost at each shape beside GPT-2's."""

from __future__ import annotations

from common.plots import pyplot, save_plot
from common.record import markdown_table, provenance, publish


def table(rows) -> str:
    return markdown_table(
        [
            {
                "shape": r["shape"],
                "family": r["family"],
                "layers": r["layers"],
                "heads (q / kv)": r["heads"],
                "width": r["width"],
                "parameters": f"{r['parameters'] / 1e6:,.1f}M",
                "documents": f"{r['documents']:,}",
                "float32 GB": f"{r['float32_bytes'] / 1e9:.2f}",
                "rounds / requests a token": f"{r['round_trips']:.0f} / {r['requests']:.0f}",
                "FAISS ms a token, CPU (clock)": f"{r['store_cpu_ms']:,.1f} ({r['store_ms']:,.1f})" + whole(r),
                "numpy f32 ms, CPU (clock)": f"{r['numpy_cpu_ms']:,.1f} ({r['numpy_ms']:,.1f})",
                "x numpy (CPU)": f"{r['store_cpu_ms'] / r['numpy_cpu_ms']:.2f}",
                "turbopuffer: subqueries in requests, $ a token": f"{r['tpuf_subqueries_per_token']:.0f} in "
                f"{r['tpuf_requests_per_token']:.0f}, ${r['tpuf_dollars_per_token']:.5f}",
            }
            for r in rows
        ]
    )


def whole(r) -> str:
    w = r.get("whole")
    return "" if w is None else f"; whole: {w['store_cpu_ms']:,.1f}, numpy {w['numpy_cpu_ms']:,.1f}"


def write(out, args, rows, measured=None) -> None:
    """llama_sizes.json, .md, .png; measured: the provenance of the run that measured rows (--render), else this."""
    layers = sorted(set(args.llama_layers))
    data = {
        "experiment": "sizes --llama",
        "provenance": provenance(seed=args.seed) if measured is None else {**measured, "rendered": provenance()},
        "settings": {"layers_measured": layers, "n": args.n, "scale": args.scale, "full": args.llama_full or []},
        "rows": rows,
    }
    head = (
        f"A token's cost by shape, layout five; measured cut to {' and '.join(map(str, layers))} layers (random "
        f"weights, {args.n} tokens) and read at the shape's depth (a + b x layers); turbopuffer by the cost model\n\n"
    )
    publish(out, "llama_sizes", data, head + table(rows), lambda path: plot(rows, path))


def plot(rows, path) -> None:
    """ms a token, requests and round trips a token, turbopuffer's dollars a token, each against parameters."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for r in rows:
        llama, x = r["family"] != "gpt2", r["parameters"]
        color, mark = ("C1", "o") if llama else ("C0", "s")
        axes[0].plot([x], [r["store_cpu_ms"]], mark, color=color)
        axes[0].plot([x], [r["numpy_cpu_ms"]], mark, color=color, mfc="none")
        axes[1].plot([x], [r["requests"]], mark, color=color)
        axes[1].plot([x], [r["tpuf_subqueries_per_token"]], mark, color=color, mfc="none")
        axes[2].plot([x], [r["tpuf_dollars_per_token"]], mark, color=color)
        for ax, y in zip(axes, (r["store_cpu_ms"], r["requests"], r["tpuf_dollars_per_token"])):
            ax.annotate(r["shape"], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    titles = (
        "CPU ms a token: FAISS (filled), numpy float32 (open)",
        "a token: requests in process (filled), turbopuffer subqueries (open)",
        "turbopuffer $ a token (cost model)",
    )
    for ax, title in zip(axes, titles):
        ax.set(xscale="log", yscale="log", xlabel="parameters (orange: Llama family, blue: GPT-2)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    save_plot(fig, path)
