"""Experiment 4: what the engine asks of each store per generated token.

The engine's Meter counts, per token and by kind (open, lookup, matrix, key_write, key_search,
token_search): requests (what the adapter reports sending), subqueries (query vectors inside
them) and round trips (groups of requests the engine sends together: one round trip each).
"With the engine's batching" is that count. "Without" is a client that sends every request on
its own and waits for it: one round trip per request, so the sequential round trips equal the
requests. The first token (opening the text, reading the prompt, the first token search) is
given apart; the prompt is read either as one block (the default) or token by token.
The puffergpt write-up: 76 requests per generated token, 52 for the first, one after another.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common/

import numpy as np  # noqa: E402

from common.plots import pyplot
from common.subjects import add_common_arguments, describe_variant, load_model, model_label, open_engine, variants

NAME = "requests"
HELP = "requests, subqueries and round trips per generated token by kind, with and without batching"
WRITEUP = {"requests_per_token": 76, "first_token": 52}
KINDS = ("open", "lookup", "matrix", "key_write", "key_search", "token_search")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, NAME)
    p.add_argument("--prompt", default="The history of the vector database begins")
    p.add_argument("-n", type=int, default=8, help="tokens generated (the first and n-1 more)")


def per_token_counts(summary: dict) -> dict:
    """Meter.summary() -> the first token and the mean over the generated tokens after it, with the
    sequential round trips (one per request) beside the engine's batched ones."""
    tokens = summary["per_token"]

    def counts(t):
        return {
            "requests": t["total"],
            "subqueries": t["subqueries"],
            "round_trips": t["round_trips"],
            "round_trips_sequential": t["total"],
            "requests_by_kind": t["by_kind"],
            "subqueries_by_kind": t["subqueries_by_kind"],
            "round_trips_by_kind": t["round_trips_by_kind"],
            "seconds": t["seconds"],
        }

    first = counts(tokens[0])
    rest = [counts(t) for t in tokens[1:]]
    mean = None
    if rest:
        mean = {
            key: float(np.mean([r[key] for r in rest]))
            for key in ("requests", "subqueries", "round_trips", "round_trips_sequential", "seconds")
        }
        for key in ("requests_by_kind", "subqueries_by_kind", "round_trips_by_kind"):
            mean[key] = {
                k: float(np.mean([r[key].get(k, 0) for r in rest])) for k in KINDS if any(k in r[key] for r in rest)
            }
    return {"first_token": first, "per_generated_token": mean, "generated_tokens": len(rest)}


def plot(results, path: Path, title: str) -> Path:
    plt = pyplot()
    rows = [r for r in results if r["per_generated_token"]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.5 * len(rows) + 2.2), sharey=True)
    labels = [f"{r['subject']}, {r['prompt_mode']}" for r in rows]
    colors = dict(zip(KINDS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, which, name in (
        (axes[0], "first_token", "first token"),
        (axes[1], "per_generated_token", "per generated token"),
    ):
        left = np.zeros(len(rows))
        for kind in KINDS:
            v = np.array([r[which]["requests_by_kind"].get(kind, 0) for r in rows], float)
            if v.any():
                ax.barh(labels, v, left=left, label=kind, color=colors[kind])
                left += v
        ax.scatter(
            [r[which]["round_trips"] for r in rows],
            labels,
            marker="|",
            s=300,
            c="k",
            label="round trips, batched",
            zorder=3,
        )
        ax.set_title(f"{name}: requests by kind (bars)", fontsize=9)
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    fig.legend(handles.values(), handles.keys(), fontsize=7, ncol=7, loc="lower center")
    axes[0].invert_yaxis()
    fig.suptitle(title + "\nsequential round trips (no batching) = requests = bar length", fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(args) -> int:
    from vecgpt import tokenizer
    from vecgpt.api import check_request
    from vecgpt.errors import VecgptError

    from common.record import new_run

    model = load_model(args.model)
    ids = tokenizer.encode(args.prompt)
    if not ids or args.n < 2:
        raise VecgptError("the prompt needs tokens and -n must be at least 2 (a first token and one more)")
    check_request(model.hparams, ids, args.n, 40)
    out = new_run(NAME, args.out)
    vs = variants(args.configs, args.store_root, not args.no_swap)
    results = [r for v in vs for r in count(v, model, ids, args)]
    write(out, args, model, vs, ids, results)
    return 0


def count(v, model, ids, args) -> list[dict]:
    """One store variant, the prompt as a block and token by token: requests and round trips per token."""
    from vecgpt.api import generate
    from vecgpt.engine import Engine

    print(f"{v.label} [{v.config_path}{', ' + v.note if v.note else ''}]", file=sys.stderr)
    engine, results = open_engine(v, model, progress=not args.quiet), []
    try:
        for block in (True, False):
            session = Engine(engine.store, top_k=engine.top_k, prompt_block=block).open()
            try:
                gen = generate(session, ids, args.n, top_k=engine.top_k, stop=False)
            finally:
                session.close()
            results.append(
                {
                    "subject": v.label,
                    "config": v.config_path,
                    "metric": v.config.metric,
                    "layout": v.config.layout,
                    "prompt_mode": "prompt as a block" if block else "prompt token by token",
                    "tokens": gen.tokens,
                    **per_token_counts(session.meter.summary()),
                }
            )
    finally:
        engine.store.close()
    return results


def number(x) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def table_rows(results) -> list[dict]:
    f = number
    return [
        {
            "subject": r["subject"],
            "prompt": r["prompt_mode"].replace("prompt ", ""),
            "first token: requests / subqueries": f"{r['first_token']['requests']} / {r['first_token']['subqueries']}",
            "first token: round trips batched / sequential": f"{r['first_token']['round_trips']} / {r['first_token']['round_trips_sequential']}",
            "per token: requests / subqueries": f"{f(r['per_generated_token']['requests'])} / {f(r['per_generated_token']['subqueries'])}",
            "per token: round trips batched / sequential": f"{f(r['per_generated_token']['round_trips'])} / {f(r['per_generated_token']['round_trips_sequential'])}",
        }
        for r in results
    ]


def kind_table(results) -> list[dict]:
    f, block_rows = number, [r for r in results if r["prompt_mode"] == "prompt as a block"]
    return [
        {
            "kind": kind,
            **{
                r["subject"]: "{} / {} / {}".format(
                    f(r["per_generated_token"]["requests_by_kind"].get(kind, 0)),
                    f(r["per_generated_token"]["subqueries_by_kind"].get(kind, 0)),
                    f(r["per_generated_token"]["round_trips_by_kind"].get(kind, 0)),
                )
                for r in block_rows
            },
        }
        for kind in KINDS
        if any(kind in r["per_generated_token"]["requests_by_kind"] for r in block_rows)
    ]


def write(out, args, model, vs, ids, results) -> None:
    """requests.json, .md and .png in out; the tables on stdout."""
    from common.record import markdown_table, provenance, publish

    rows, kind_rows = table_rows(results), kind_table(results)
    what = model_label(model, args.model)
    data = {
        "experiment": NAME,
        "provenance": provenance(seed=args.seed, model=model, model_name=args.model),
        "settings": {
            "prompt": args.prompt,
            "prompt_ids": ids,
            "n": args.n,
            "sequential": "one round trip per request (a client without the engine's batching)",
        },
        "writeup": WRITEUP,
        "variants": [describe_variant(v) for v in vs],
        "results": results,
        "table": rows,
        "by_kind_table": kind_rows,
    }
    md = (
        f"Prompt {args.prompt!r} ({len(ids)} tokens), {args.n} tokens generated; per token = mean over the "
        f"{args.n - 1} after the first; model {what}. The write-up: {WRITEUP['requests_per_token']} requests per "
        f"token, {WRITEUP['first_token']} for the first, one after another.\n\n"
        + markdown_table(rows)
        + "\n\nPer generated token by kind (requests / subqueries / round trips batched):\n\n"
        + markdown_table(kind_rows)
    )
    publish(out, "requests", data, md, lambda path: plot(results, path, f"requests per token\n{what}"))


if __name__ == "__main__":
    import common

    sys.exit(common.main(sys.modules[__name__]))
