"""The policies swept (vecgpt.policy), their grids, the 99%-agreement bisection and the fewest keys at 99%.

Families: top-k (K), a threshold (beta), sinks and a window (W, sinks S), and sinks, a window and top-k (W, with
S and K fixed). Each family's keys grow with its value, so the value where agreement first reaches 99% is found by
bisection between the grid's last value below it and its first reaching it, at each context on windows cut to it.
"""

from __future__ import annotations

import sys

import numpy as np
from measure import ALL, evaluate

from vecgpt.policy import Policy

FAMILIES = ("top-k", "threshold", "sinks+window", "sinks+window+top-k")
TARGET = 0.99


def policy_of(family: str, value, s) -> Policy:
    if family == "top-k":
        return Policy(top_k=int(value))
    if family == "threshold":
        return Policy(threshold=float(value))
    if family == "sinks+window":
        return Policy(sinks=s["sinks"], window=int(value))
    return Policy(top_k=s["window_k"], sinks=s["sinks"], window=int(value))


def grids(s) -> dict:
    """Each family's values (top-k's `all`: every earlier key of the longest context); only s["families"] where
    given."""
    longest = max(s["contexts"])
    every = {
        "top-k": [longest - 1 if k == ALL else k for k in s["ks"]],
        "threshold": s["thresholds"],
        "sinks+window": s["windows"],
        "sinks+window+top-k": s["windows"],
    }
    return {f: v for f, v in every.items() if f in s.get("families", FAMILIES)}


def label(family: str, value, s) -> str:
    return {
        "top-k": f"K {value}",
        "threshold": f"beta {value:g}",
        "sinks+window": f"S {s['sinks']} W {value}",
        "sinks+window+top-k": f"S {s['sinks']} W {value} K {s['window_k']}",
    }[family]


def row(family, value, s, context, got, search="exact", probe=False) -> dict:
    policy = policy_of(family, value, s)
    head = {"context": context, "family": family, "value": value, "label": label(family, value, s)}
    return {**head, "policy": policy._asdict(), "search": search, "probe": probe, **got}


def sweep(model, steps, full, s, quiet=False) -> list[dict]:
    """Every family's grid at every context (one pass over the windows a value)."""
    rows = []
    for family, values in grids(s).items():
        for value in values:
            got = evaluate(model, steps, full, policy_of(family, value, s))
            rows += [row(family, value, s, c, r) for c, r in got.items()]
            if not quiet:
                agree = " ".join(f"{got[c]['agreement']:.3f}" for c in steps.contexts)
                print(f"  {label(family, value, s)}: agreement {agree}", file=sys.stderr)
    return rows


def hnsw_rows(model, steps, full, s, quiet=False) -> list[dict]:
    """numpy's hnswlib search for the K best (ann_keep) on the first approx_windows windows, beside exact top-K."""
    from ann_keep import HnswTopK

    windows, out = np.arange(min(s["approx_windows"], len(steps.windows))), []
    for k in s["hnsw_ks"]:
        sel = HnswTopK(k, **s["hnsw"])
        got = evaluate(model, steps, full, Policy(top_k=k), windows=windows, keep=sel)
        same = evaluate(model, steps, full, Policy(top_k=k), windows=windows)
        for c, r in got.items():
            extra = {"recall": sel.recall, "searches_retried": sel.retries}
            extra.update(exact_agreement_same_steps=same[c]["agreement"], exact_keys_same_steps=same[c]["per_token"])
            out.append(row("top-k", k, s, c, {**r, **extra}, search="hnsw"))
        if not quiet:
            print(f"  hnsw K {k}: recall {sel.recall:.3f}", file=sys.stderr)
    return out


def bounds(rows, family, context):
    """(lo, hi): the largest value below 99% agreement under the smallest reaching it, or None."""
    mine = [r for r in rows if r["family"] == family and r["context"] == context and r["search"] == "exact"]
    reach = [r["value"] for r in mine if r["agreement"] >= TARGET]
    if not reach:
        return None
    below = [r["value"] for r in mine if r["agreement"] < TARGET and r["value"] < min(reach)]
    return (max(below), min(reach)) if below else None


def bisect(model, steps, full, s, rows, quiet=False) -> None:
    """Up to refine_probes more values per family and context between bounds, on windows cut to the context."""
    for family in grids(s):
        for context in steps.contexts:
            found = bounds(rows, family, context)
            for _ in range(s["refine_probes"] if found else 0):
                lo, hi = found
                whole = family != "threshold"
                if whole and hi - lo <= 1:
                    break
                mid = (lo + hi) // 2 if whole else round((lo + hi) / 2, 4)
                got = evaluate(model, steps, full, policy_of(family, mid, s), contexts=[context])[context]
                rows.append(row(family, mid, s, context, got, probe=True))
                found = bounds(rows, family, context)
                if not quiet:
                    print(f"  {context}: {label(family, mid, s)} agreement {got['agreement']:.4f}", file=sys.stderr)


def fewest(rows, context, search="exact"):
    """Per family: the row reading the fewest keys a token among those reaching 99% agreement at this context."""
    out = {}
    for r in rows:
        if r["context"] != context or r["search"] != search or r["agreement"] < TARGET:
            continue
        name = r["family"] if search == "exact" else "hnsw"
        if name not in out or r["per_token"]["keys_returned"] < out[name]["per_token"]["keys_returned"]:
            out[name] = r
    return out
