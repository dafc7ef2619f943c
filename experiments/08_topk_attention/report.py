"""The experiment's tables (markdown) and plots: agreement and KL against K, smallest K against context, mass heatmap."""

from __future__ import annotations

import numpy as np
from measure import k_value

from common.plots import pyplot, save_plot
from common.record import markdown_table


def k_label(k, context=None) -> str:
    """A K as run; where it reaches every earlier key of the step's query, that said."""
    if k is None:
        return "none of those run"
    return f"{k} (= all)" if context and k != "all" and k_value(k, context) == context - 1 else str(k)


def fmt(v, spec=".3f") -> str:
    return "-" if v is None else format(v, spec)


def report(result: dict) -> str:
    parts = [f"model: {result['model']['label']}", ""]
    if result["rows"]:
        parts += [settings_line(result), ""]
        parts += ["Smallest K with greedy agreement >= 99% (exact key search):", "", smallest_table(result), ""]
    for context in result["settings"]["contexts"] if result["rows"] else []:
        full = result["full_accuracy"][str(context)]
        parts += [f"context {context} tokens (full attention's greedy token is the passage's next on {full:.1%}):", ""]
        parts += [context_table(result, context), ""]
    if result.get("stores"):
        parts += ["Through the stores (the engine, `attention_top_k`):", "", store_table(result), ""]
    for store, reason in dict.fromkeys((s["store"], s["reason"]) for s in result.get("stores_skipped", [])):
        parts.append(f"- {store}: {reason}")
    if result.get("turbopuffer_dollars"):
        parts += [
            "",
            "turbopuffer, a generated token by the price list (key searches top-K):",
            "",
            dollar_table(result),
        ]
    return "\n".join(parts).rstrip() + "\n"


def settings_line(result) -> str:
    s = result["settings"]
    approx = s["approx_passages"]  # a merged run: per context
    approx = ", ".join(f"{n} at {c}" for c, n in approx.items()) if isinstance(approx, dict) else approx
    return (
        f"{s['passages']} held-out passages x {s['steps']} teacher-forced steps per context length "
        f"({s['passages'] * s['steps']} steps); hnsw on the first {approx} passages "
        f"(hnswlib M={s['hnsw']['m']}, ef_construction={s['hnsw']['ef_construction']}, ef=max({s['hnsw']['ef']}, K))"
    )


def smallest_table(result) -> str:
    rows = []
    for context in result["settings"]["contexts"]:
        k, ref = result["smallest_k"][str(context)], result.get("refined", {}).get(str(context))
        share = None if k is None else k_value(k, context) / (context - 1)
        rows.append(
            {
                "context": context,
                "smallest K (exact)": k_label(k, context),
                "share of earlier keys": fmt(share, ".1%"),
                "bisected: not at / at": "-"
                if not ref
                else f"{ref['lo']} / {ref['hi']} ({ref['hi'] / (context - 1):.1%})",
                "smallest K (hnsw)": k_label(result["smallest_k_hnsw"].get(str(context))),
            }
        )
    return markdown_table(rows)


def context_table(result, context) -> str:
    approx = {r["k"]: r for r in result["rows"] if r["context"] == context and r["search"] == "hnsw"}
    rows = []
    for r in result["rows"]:
        if r["context"] != context or r["search"] != "exact":
            continue
        a = approx.get(r["k"], {})
        rows.append(
            {
                "K": k_label(r["k"], context),
                "agreement": fmt(r["agreement"], ".4f"),
                "differ / steps": f"{r['disagreements']} / {r['steps']}",
                "KL mean (nats)": fmt(r["kl_mean"], ".2e"),
                "mass held mean / min head": f"{r['mass_mean']:.3f} / {r['mass_min_head']:.3f}",
                "returned / values a token": f"{r['per_token']['keys_returned']} / {r['per_token']['values_read']}",
                "bytes returned / of values a token": f"{r['per_token']['bytes_returned']:,} / "
                f"{r['per_token']['value_bytes']:,}",
                "hnsw recall": fmt(a.get("recall"), ".3f"),
                "hnsw agreement (exact, same steps)": "-"
                if not a
                else f"{a['agreement']:.4f} ({a['exact_agreement_same_steps']:.4f})",
                "hnsw KL mean": fmt(a.get("kl_mean"), ".2e"),
            }
        )
    return markdown_table(rows)


def store_table(result) -> str:
    rows = [
        {
            "store": s["label"],
            "context": s["context"],
            "K": k_label(s["k"]),
            "ms a token": f"{s['ms_per_token']:.1f}",
            "meter: scored / returned / values a token": s.get("meter_line", "-"),
            "formula (exact search)": "/".join(
                f"{s['formula'][key]:g}" for key in ("keys_scored", "keys_returned", "values_read")
            ),
            "free-running tokens = numpy top-K": s.get("same_tokens_as_numpy", "-"),
            "steps: agree with full / with numpy top-K": "-"
            if "agreement" not in s
            else f"{s['agreement']['with_full']:.3f} / {s['agreement']['with_numpy_top_k']:.3f} "
            f"({s['agreement']['steps']} steps)",
        }
        for s in result["stores"]
    ]
    return markdown_table(rows)


def dollar_table(result) -> str:
    rows = [
        {
            "context": d["context"],
            "K": k_label(d["k"]),
            "key bytes returned": f"{d['key_bytes_returned']:,}",
            "$ a token": f"{d['dollars']:.8f}",
        }
        for d in result["turbopuffer_dollars"]
    ]
    return markdown_table(rows)


def plot(result: dict, path) -> None:
    """Agreement and KL against K (one line per context length), and the smallest K against context length."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    contexts, ks = result["settings"]["contexts"], result["settings"]["ks"]
    xs = np.arange(len(ks))
    for context in contexts:
        for search, style in (("exact", "-"), ("hnsw", "--")):
            rows = {r["k"]: r for r in result["rows"] if r["context"] == context and r["search"] == search}
            if not rows:
                continue
            x = [i for i, k in enumerate(ks) if k in rows]
            agree = [rows[ks[i]]["agreement"] for i in x]
            kl = [rows[ks[i]]["kl_mean"] or np.nan for i in x]  # KL 0 (K = all) has no place on a log scale
            label = f"{context} tokens" + ("" if search == "exact" else " (hnsw, fewer steps)")
            color = f"C{contexts.index(context)}"
            axes[0].plot(x, agree, style, marker="o", ms=3, color=color, label=label)
            axes[1].plot(x, kl, style, marker="o", ms=3, color=color, label=label)
    axes[0].axhline(0.99, color="grey", lw=0.8, ls=":")
    for ax, title in ((axes[0], "greedy agreement with full attention"), (axes[1], "mean KL(full || top-K), nats")):
        ax.set_xticks(xs, [str(k) for k in ks])
        ax.set_xlabel("K (earlier keys kept a query)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")
    if not result["rows"]:
        return save_plot(fig, path)
    smallest = [result["smallest_k"][str(c)] for c in contexts]
    y = [np.nan if k is None else k_value(k, c) for c, k in zip(contexts, smallest)]
    axes[2].plot(contexts, y, marker="o", label="smallest K of the sweep, 99% agreement")
    refined = result.get("refined", {})
    if refined:
        cs = [c for c in contexts if str(c) in refined]
        hi = np.array([refined[str(c)]["hi"] for c in cs])
        lo = np.array([refined[str(c)]["lo"] for c in cs])
        axes[2].errorbar(
            cs,
            hi,
            yerr=[hi - lo - 1, 0 * hi],
            marker="s",
            capsize=3,
            label="bisected: reaches 99% (bar: above the last K below)",
        )
    axes[2].plot(contexts, [c - 1 for c in contexts], ls=":", color="grey", label="every earlier key")
    axes[2].set_xlabel("context (tokens)")
    axes[2].set_ylabel("K")
    axes[2].set_title("smallest K for 99% greedy agreement", fontsize=9)
    axes[2].grid(alpha=0.3)
    axes[2].legend(fontsize=7)
    fig.suptitle(result["model"]["label"], fontsize=9)
    save_plot(fig, path)


def mass_plot(result: dict, path) -> None:
    """Per context length, the mass each head's own key and K best earlier keys hold under full attention."""
    if not result["mass"]:
        return
    plt = pyplot()
    contexts = result["settings"]["contexts"]
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts) + 1, 4.6), squeeze=False)
    for ax, context in zip(axes[0], contexts):
        m, ks = np.asarray(result["mass"][str(context)]), result["ks_run"][str(context)]  # [K, L, H]
        grid = m.reshape(len(ks), -1).T  # rows: layer.head
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        n_layer, n_head = m.shape[1:]
        names = [f"L{i} H{j}" for i in range(n_layer) for j in range(n_head)]
        ax.set_yticks(range(n_layer * n_head), names if ax is axes[0][0] else [""] * len(names))
        ax.set_xticks(range(len(ks)), [str(k) for k in ks])
        ax.set_xlabel("K")
        ax.set_title(f"{context} tokens", fontsize=9)
        if n_layer * n_head <= 32:
            for (i, j), v in np.ndenumerate(grid):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="w" if v < 0.6 else "k")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="share of full attention held")
    fig.suptitle("attention mass on a query's own key and its K best earlier keys (full attention)", fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
