"""The comparison's tables (markdown) and plot: keys a query head needs at 99% agreement per model and context, the
curves behind them, and the weight each model's heads put on the first positions."""

from __future__ import annotations

from compare import COMPARED
from report import context_table, fmt, store_table

from common.plots import pyplot, save_plot
from common.record import markdown_table


def report(result: dict) -> str:
    s = result["settings"]
    parts = [f"models: {'; '.join(m['label'] for m in result['models'])}", ""]
    n = s["passages"] * s["steps"]
    parts += [
        f"{s['passages']} held-out passages x {s['steps']} windows = {n} windows, the same tokens for every model; "
        f"context C's steps: the queries at positions C - {s['span']} .. C - 1 ({n * s['span']} steps); float64; "
        "keys counted per query head (a GQA key head's keys serve each of its group's query heads)",
        "",
        "Fewest keys at >= 99% greedy agreement with full attention:",
        "",
        keys_table(result),
        "",
        f"Weight on positions 0..{s['sinks_measured'] - 1} under full attention (mean over heads / the largest head; "
        "uniform: what an even spread over the query's keys puts there):",
        "",
        sinks_table(result),
        "",
    ]
    longest = str(max(s["contexts"]))
    for m in result["models"]:
        parts += [f"{m['name']}: weight on the first positions by layer and head at context {longest}:", ""]
        parts += [head_table(m, longest), ""]
    for m in result["models"]:
        for c in s["contexts"]:
            parts += [f"{m['name']}, context {c}:", "", context_table(m, c), ""]
        if m.get("stores"):
            parts += [f"{m['name']} through the stores (a decode token's figures):", "", store_table(m), ""]
        parts += [f"- {x['store']}: {x['reason']}" for x in m.get("stores_skipped", [])]
    return "\n".join(parts).rstrip() + "\n"


def keys_table(result) -> str:
    rows = []
    for c, per in result["comparison"].items():
        for name, row in per.items():
            out = {"context": c, "model": name, "every key a token": fmt(row["every_key"], ".0f")}
            for family in COMPARED:
                p = row[family]
                out[family] = "not reached" if p is None else keys_cell(p, row["every_key"])
            rows.append(out)
    return markdown_table(rows)


def keys_cell(p, every) -> str:
    share = p["keys_a_token"] / every if every else 0
    group = p["keys_a_key_head_group"]
    return (
        f"{p['label']}: {p['keys_a_token']:.0f} a token, {p['keys_a_query_head']:.1f} a query head ({share:.0%}); "
        f"a key head's group {group:.1f}; agreement {p['agreement']:.4f}, mass {p['mass_held']:.3f}"
    )


def sinks_table(result) -> str:
    rows = []
    for c in map(str, result["settings"]["contexts"]):
        for m in result["models"]:
            k = m["sinks"][c]
            rows.append(
                {
                    "context": c,
                    "model": m["name"],
                    "mean / largest head": f"{k['mean']:.3f} / {k['max_head']:.3f}",
                    "uniform": f"{k['uniform']:.3f}",
                    "heads over 10x uniform / over half the weight": f"{k['heads_over_10x']} / {k['heads_over_half']} "
                    f"of {len(k['weight']) * len(k['weight'][0])}",
                }
            )
    return markdown_table(rows)


def head_table(m, context) -> str:
    k = m["sinks"][context]
    return markdown_table(
        [
            {"layer": layer + 1, **{f"head {h}": f"{w:.3f} (pos 0: {z:.3f})" for h, (w, z) in enumerate(zip(ws, zs))}}
            for layer, (ws, zs) in enumerate(zip(k["weight"], k["weight_position_0"]))
        ]
    )


def plot(result: dict, path) -> None:
    """Keys a query head at 99% against context; agreement against keys at the longest context; sink weight by
    layer."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.3))
    contexts = result["settings"]["contexts"]
    for i, m in enumerate(result["models"]):
        for j, family in enumerate(COMPARED):
            style = dict(color=f"C{i}", ls="-" if j == 0 else "--", marker="o", ms=3, label=f"{m['name']} {family}")
            points = [result["comparison"][str(c)][m["name"]][family] for c in contexts]
            xs = [c for c, p in zip(contexts, points) if p]
            axes[0].plot(xs, [p["keys_a_query_head"] for p in points if p], **style)
            rows = [r for r in m["rows"] if r["context"] == max(contexts) and r["family"] == family]
            rows.sort(key=lambda r: r["per_token"]["keys_returned"])
            x = [r["per_token"]["keys_returned"] / m["query_heads"] for r in rows]
            axes[1].plot(x, [r["agreement"] for r in rows], **style)
        sink_curves(axes[2], m, str(max(contexts)), f"C{i}")
    label(axes, result, contexts)
    save_plot(fig, path)


def sink_curves(ax, m, context, color) -> None:
    """Each layer's weight on the first positions over uniform's: the mean head's and the largest head's."""
    k = m["sinks"][context]
    layers, ratio = range(1, len(k["weight"]) + 1), k["over_uniform"]
    ax.plot(layers, [sum(r) / len(r) for r in ratio], color=color, marker="o", label=f"{m['name']} mean head")
    ax.plot(layers, [max(r) for r in ratio], color=color, ls="--", marker="^", label=f"{m['name']} largest head")


def label(axes, result, contexts) -> None:
    s = result["settings"]
    axes[0].set(xlabel="context (tokens)", ylabel="earlier keys a query head keeps", title="at 99% greedy agreement")
    axes[1].axhline(0.99, color="grey", lw=0.8, ls=":")
    axes[1].set(xscale="log", xlabel="earlier keys a query head keeps", ylabel="greedy agreement with full attention")
    axes[1].set_title(f"context {max(contexts)}")
    axes[2].axhline(1, color="grey", lw=0.8, ls=":")
    axes[2].set(xlabel="layer", ylabel=f"weight on positions 0..{s['sinks_measured'] - 1} / uniform's", ylim=(0, None))
    axes[2].set_title(f"sinks? context {max(contexts)} (1: an even spread; a sink is many times that)")
    axes[2].xaxis.get_major_locator().set_params(integer=True)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.title.set_fontsize(9)
