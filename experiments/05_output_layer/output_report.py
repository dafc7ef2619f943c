"""The output-layer experiment's report: the markdown tables and the recall-against-speedup plot."""

from __future__ import annotations

from common.plots import pyplot, save_plot

COLUMNS = [
    "label",
    "cand",
    "recall@1",
    "recall@10",
    "recall@40",
    "top1_agreement",
    "identical",
    "ppl_full",
    "ppl_cand",
    "miss",
    "ppl_floor",
    "head_ms",
    "exact_ms",
    "speedup",
    "p10_x",
    "vs_store",
    "token_ms",
    "token_x",
    "build_s",
    "index_MB",
]


def table_rows(rows):
    for r in rows:
        yield {
            "label": r["label"],
            "cand": f"{r['candidates_mean']:.0f}",
            "recall@1": r["recall@1"],
            "recall@10": r["recall@10"],
            "recall@40": r["recall@40"],
            "top1_agreement": f"{100 * r['top1_agreement']:.1f}%",
            "identical": f"{sum(r['identical_steps'])}/{r['greedy_positions']}",
            "ppl_full": r["ppl_full"],
            "ppl_cand": r["ppl_candidates"],
            "miss": f"{100 * r['target_miss']:.1f}%",
            "ppl_floor": r["ppl_floor"],
            "head_ms": r["head_ms"],
            "exact_ms": r["numpy_ms"],
            "speedup": f"{r['speedup']:.1f}x",
            "p10_x": f"{r['speedup_p10']:.1f}x" if "speedup_p10" in r else "",
            "vs_store": f"{r['speedup_vs_store_exact']:.1f}x ({r['store_exact']})",
            "token_ms": r["token_ms"],
            "token_x": f"{r['token_speedup']:.2f}x",
            "build_s": r["build_s"],
            "index_MB": r["index_MB"],
        }


def report(result) -> str:
    from common.record import markdown_table

    prov = result["provenance"]
    lines = [
        "# Output layer as an ANN search",
        "",
        f"Machine: {prov['machine']['system']}, {prov['machine']['cores']} cores; commit {prov['commit']}.",
        "Speedup = exact numpy output layer (`exact_ms`: float32 `h @ wte.T` + top-40, measured in the same "
        "run) / index head (search k + frequent tokens + exact rescoring), both batch 1, medians (`p10_x`: "
        "the same from 10th percentiles, closer to an unloaded machine). `identical` = greedy steps "
        "identical to exact decoding, summed over prompts. ppl_cand: softmax over the candidates only (inf when a target is "
        "missing; `miss` = such positions); ppl_floor: every missing token gets the lowest candidate logit.",
        "",
    ]
    for name in dict.fromkeys(m["name"] for m in result["models"]):
        runs = [m for m in result["models"] if m["name"] == name]
        rows = [r for r in result["rows"] if r["model"] == name]
        lines += [f"## {runs[0]['description']}", ""]
        for m in runs:
            lines += [
                f"{m['output_vectors']} x {m['hparams']['n_embd']} token vectors; {m['text_positions']} held-out "
                f"positions, {m['greedy_positions']} greedy positions; exact numpy output layer {m['numpy_ms']:.2f} ms, "
                f"rest of the token {m['body_ms']:.1f} ms, exact whole token {m['token_exact_ms']:.1f} ms; "
                f"BLAS threads {m.get('blas_threads')}."
                + (
                    f" The exact top-1 is an always-scored token at {100 * m['top1_frequent']:.0f}% of greedy positions."
                    if m.get("top1_frequent") is not None
                    else ""
                ),
                "",
            ]
        if rows:
            lines += [markdown_table(list(table_rows(rows)), COLUMNS), ""]
    if result["skipped"]:
        lines += ["## Skipped", ""] + [f"- {s['model']}: {s['what']}: {s['reason']}" for s in result["skipped"]] + [""]
    lines += ["## Published figures (not measured here)", "", markdown_table(result["published"]), ""]
    return "\n".join(lines)


def pareto(points):
    """Indices of points (x, y) no other point beats on both (higher is better on both)."""
    return [
        i
        for i, (x, y) in enumerate(points)
        if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for x2, y2 in points)
    ]


def plot(rows, path):
    plt = pyplot()
    names = list(dict.fromkeys(r["model"] for r in rows))
    if not names:
        return
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 4.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        rs = [r for r in rows if r["model"] == name]
        for kind in dict.fromkeys(r["kind"] for r in rs):
            ks = [r for r in rs if r["kind"] == kind]
            ax.scatter([r["speedup"] for r in ks], [r["recall@10"] for r in ks], label=kind, alpha=0.8)
        pts = [(r["speedup"], r["recall@10"]) for r in rs]
        front = sorted(pts[i] for i in pareto(pts))
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=1, label="Pareto front")
        ax.scatter([p[0] for p in front], [p[1] for p in front], s=120, facecolors="none", edgecolors="k")
        ax.axvline(1, color="grey", lw=0.5)
        ax.set_xscale("log")
        ax.set_xlabel("output-layer speedup over exact numpy (batch 1)")
        ax.set_ylabel("recall@10 vs exact top-10")
        ax.set_title(f"model: {name}")
        ax.legend(fontsize=8)
    save_plot(fig, path)
