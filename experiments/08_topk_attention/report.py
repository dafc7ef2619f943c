"""The experiment's tables (markdown) and its plot: keys read a token against greedy agreement, a curve a policy."""

from __future__ import annotations

import numpy as np

from common.plots import pyplot, save_plot
from common.record import markdown_table


def fmt(v, spec=".3f") -> str:
    return "-" if v is None else format(v, spec)


def report(result: dict) -> str:
    parts = [f"model: {result['model']['label']}", ""]
    if result.get("rows"):
        s = result["settings"]
        parts += [settings_line(result), "", answer_line(result), ""]
        parts += ["Fewest keys a token at >= 99% greedy agreement, per policy:", "", fewest_table(result), ""]
        for context in s["contexts"]:
            full = result["full_accuracy"][str(context)]
            parts += [f"context {context} (full attention's greedy token is the text's next on {full:.1%}):", ""]
            parts += [context_table(result, context), ""]
        if any(r["search"] == "hnsw" for r in result["rows"]):
            parts += ["numpy's hnswlib top-K (first windows only) beside exact top-K on the same steps:", ""]
            parts += [hnsw_table(result), ""]
    if result.get("stores"):
        parts += ["Through the stores (the engine with the policy; a decode token's figures):", "", store_table(result)]
    for store, reason in dict.fromkeys((s["store"], s["reason"]) for s in result.get("stores_skipped", [])):
        parts.append(f"- {store}: {reason}")
    return "\n".join(parts).rstrip() + "\n"


def settings_line(result) -> str:
    s = result["settings"]
    n = s["passages"] * s["steps"]
    return (
        f"{s['passages']} held-out passages x {s['steps']} windows = {n} windows; context C's steps: the queries at "
        f"positions C - {s['span']} .. C - 1 of each ({n * s['span']} steps; KL at C - 1: {n}); float64"
    )


def answer_line(result) -> str:
    parts = []
    for c, a in result["answer"].items():
        if a is None:
            parts.append(f"{c}: no policy reaches 99%")
        else:
            share = a["keys_returned"] / a["every_key"]
            parts.append(f"{c}: {a['family']} ({a['label']}), {a['keys_returned']:.0f} keys a token ({share:.0%})")
    return "Fewest keys at 99% agreement, by context: " + "; ".join(parts)


def fewest_table(result) -> str:
    rows = []
    for c, best in result["fewest"].items():
        for family, r in sorted(best.items(), key=lambda fr: fr[1]["per_token"]["keys_returned"]):
            rows.append(
                {
                    "context": c,
                    "policy": f"{family}: {r['label']}",
                    "agreement": fmt(r["agreement"], ".4f"),
                    "keys returned / values read / scored a token": per_token(r),
                    "mass held": fmt(r["mass_mean"]),
                }
            )
    return markdown_table(rows)


def per_token(r) -> str:
    t = r["per_token"]
    return f"{t['keys_returned']:.0f} / {t['values_read']:.0f} / {t['keys_scored']:.0f}"


def context_table(result, context) -> str:
    rows = []
    mine = [r for r in result["rows"] if r["context"] == context and r["search"] == "exact"]
    for r in sorted(mine, key=lambda r: (r["family"], r["value"])):
        rows.append(
            {
                "policy": f"{r['family']}: {r['label']}" + (" (bisection)" if r["probe"] else ""),
                "agreement": fmt(r["agreement"], ".4f"),
                "differ / steps": f"{r['disagreements']} / {r['steps']}",
                "KL mean (nats)": fmt(r["kl_mean"], ".2e"),
                "mass held mean / min head": f"{r['mass_mean']:.3f} / {r['mass_min_head']:.3f}",
                "returned / values / scored a token": per_token(r),
                "threshold: most dropped / bound": "-"
                if "dropped_bound" not in r
                else f"{r['dropped_max']} / {r['dropped_bound']:.3f}",
            }
        )
    return markdown_table(rows)


def hnsw_table(result) -> str:
    rows = [
        {
            "context": r["context"],
            "K": r["value"],
            "recall": fmt(r["recall"]),
            "agreement (exact, same steps)": f"{r['agreement']:.4f} ({r['exact_agreement_same_steps']:.4f}, "
            f"{r['steps']} steps)",
            "KL mean": fmt(r["kl_mean"], ".2e"),
            "keys returned a token": f"{r['per_token']['keys_returned']:.0f}",
        }
        for r in result["rows"]
        if r["search"] == "hnsw"
    ]
    return markdown_table(rows)


def store_table(result) -> str:
    rows = []
    for s in result["stores"]:
        m = s["meter"]
        rows.append(
            {
                "store": s["label"],
                "context": s["context"],
                "policy": s["policy_label"],
                "returned / values a token": f"{m['returned']:.0f} / {m['values']:.0f}",
                "requests / round trips a token": f"{m['requests']:.1f} / {m['round_trips']:.1f}",
                "key searches: requests / round trips / ms": f"{m['key_search_requests']:.1f} / "
                f"{m['key_search_round_trips']:.1f} / {m['key_search_ms']:.1f}",
                "store ms a token": f"{m['store_ms']:.1f}",
                "ms a token": f"{s['ms_per_token']:.1f}",
                "$ a token": "-" if s.get("dollars_per_token") is None else f"{s['dollars_per_token']:.3g}",
                "tokens = numpy's": s["same_tokens_as_numpy"],
            }
        )
    return markdown_table(rows)


def curves(result, context):
    """(name, keys a token [n], agreement [n]) per policy family at one context, in order of keys."""
    out = []
    names = sorted({(r["family"], r["search"]) for r in result["rows"]})
    for family, search in names:
        rows = [r for r in result["rows"] if r["context"] == context and (r["family"], r["search"]) == (family, search)]
        rows.sort(key=lambda r: r["per_token"]["keys_returned"])
        if rows:
            x = np.array([r["per_token"]["keys_returned"] for r in rows])
            out.append(
                (family if search == "exact" else f"{family} (hnsw, fewer steps)", x, [r["agreement"] for r in rows])
            )
    return out


def plot(result: dict, path) -> None:
    """Keys returned a token against greedy agreement, one panel a context, one curve a policy."""
    plt = pyplot()
    contexts = result["settings"]["contexts"]
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts), 4.2), squeeze=False, sharey=True)
    for ax, context in zip(axes[0], contexts):
        for i, (name, x, y) in enumerate(curves(result, context)):
            ax.plot(x, y, "--" if "hnsw" in name else "-", marker="o", ms=3, color=f"C{i}", label=name)
        ax.axhline(0.99, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel("keys returned a token (all layers and heads)")
        ax.set_title(f"context {context} tokens", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("greedy agreement with full attention")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(result["model"]["label"], fontsize=9)
    save_plot(fig, path)
