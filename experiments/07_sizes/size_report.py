"""The size experiment's figures from its rows: a flat row a (size, store), the fitted exponents, the tables, the
log-log plot, the JSON."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from size_fit import exponent

EXPONENTS = (
    ("ms_per_token", "ms a token"),
    ("load_s", "load s"),
    ("first_read_s", "first read s"),
    ("x_numpy", "x numpy (0: as numpy)"),  # against numpy timed in the same process: robust to a busy machine
)


def flat(row: dict) -> dict:
    """One (size, store)'s figures, read from its processes' results (a reference's load is its checkpoint read)."""
    out = {k: row.get(k) for k in ("size", "store", "parameters", "model_mb", "layout", "skipped", "commit")}
    made = row.get("generate", row if row["store"] in ("numpy", "transformers") else {})
    loaded = row.get("load", {})
    out["error"] = row.get("load_error") or made.get("error") or made.get("missing") or loaded.get("error")
    times = made.get("token_s") or []
    out["ms_per_token"] = 1e3 * float(np.median(times)) if times else None
    out["tokens"] = made.get("tokens")
    if row["store"] in ("numpy", "transformers"):
        out.update(load_s=made.get("checkpoint_read_s"), peak_mb=made.get("peak_mb"))
        out["first_read_s"] = made.get("first_read_s")
        return out
    load_s = loaded.get("load_s")
    peak = made.get("peak_mb") if made.get("peak_before_numpy") or not made.get("numpy_beside") else None
    out.update(load_s=load_s, peak_mb_load=loaded.get("peak_mb"), peak_mb=peak)
    if load_s and loaded.get("float32_bytes"):
        out["mb_per_s"] = loaded["float32_bytes"] / 1e6 / load_s
    out["documents"], out["stored_mb"] = loaded.get("documents"), mb(loaded.get("stored_bytes"))
    out["disk_mb"] = mb(row.get("disk_bytes"))
    out["server_peak_mb"] = row.get("server_peak_mb") or max_of(
        loaded.get("server_peak_mb"), made.get("server_peak_mb")
    )
    keys = ("open_s", "find_model_s", "checkpoint_read_s", "fingerprint_s", "engine_s", "open_text_s", "whole_read_s")
    for key in (*keys, "whole_hash_s", "whole_same_fingerprint", "store_s_by_kind_per_token", "profile"):
        out[key] = made.get(key)
    if made.get("engine_s") is not None:
        out["engine_text_s"] = made["engine_s"] + made["open_text_s"]
    out["first_read_s"], out["first_token_s"] = made.get("first_read_s"), made.get("first_token_s")
    for key in ("requests_per_token", "round_trips_per_token", "subqueries_per_token", "dollars_per_token"):
        out[key] = made.get(key)
    out["load_dollars"] = loaded.get("load_dollars")
    beside = made.get("numpy_beside") or {}
    if beside.get("token_s"):
        out["numpy_beside_ms"] = 1e3 * float(np.median(beside["token_s"]))
        out["numpy_beside_tokens"] = beside["tokens"]
    return out


def mb(n) -> float | None:
    return None if n is None else n / 1e6


def max_of(*values):
    found = [v for v in values if v is not None]
    return max(found) if found else None


def against_numpy(rows: list[dict]) -> None:
    """Each row's time a token over numpy's at its size, and how many of its tokens numpy's greedy run shares."""
    numpy = {r["size"]: r for r in rows if r["store"] == "numpy" and r.get("ms_per_token")}
    for r in rows:
        ref = numpy.get(r["size"])
        if r.get("numpy_beside_ms") and ref is None:
            ref = {"ms_per_token": r["numpy_beside_ms"], "tokens": r["numpy_beside_tokens"]}
        if ref is None or r["store"] == "numpy" or not r.get("ms_per_token"):
            continue
        r["x_numpy"] = r["ms_per_token"] / r.get("numpy_beside_ms", ref["ms_per_token"])
        if r.get("tokens") and ref.get("tokens"):
            same = 0
            for a, b in zip(r["tokens"], ref["tokens"]):
                if a != b:
                    break
                same += 1
            r["tokens_as_numpy"] = f"{same}/{len(r['tokens'])}"


def fits(rows: list[dict]) -> list[dict]:
    """Each store's exponent b of y = c * parameters^b for each figure in EXPONENTS."""
    out = []
    for store in dict.fromkeys(r["store"] for r in rows):
        mine = [r for r in rows if r["store"] == store]
        found = {"store": store, "sizes": len([r for r in mine if r.get("ms_per_token")])}
        for key, _ in EXPONENTS:
            found[key] = exponent([r["parameters"] for r in mine], [r.get(key) for r in mine])
        out.append(found)
    return out


def millions(n: int) -> str:
    return format(n / 1e6, ",.0f" if n >= 1e7 else ".3g")


def num(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def table(rows: list[dict]) -> list[dict]:
    return [
        {
            "size": r["size"],
            "params (M)": millions(r["parameters"]),
            "store": r["store"],
            "layout": r.get("layout") or "",
            "load s": num(r.get("load_s"), ",.1f"),
            "MB/s": num(r.get("mb_per_s"), ",.0f"),
            "MB held": num(r.get("stored_mb"), ",.0f"),
            "MB on disk": num(r.get("disk_mb"), ",.0f"),
            "peak MB load / generate": "/".join(num(r.get(k), ",.0f") for k in ("peak_mb_load", "peak_mb") if r.get(k))
            or num(r.get("peak_mb"), ",.0f"),
            "server peak MB": num(r.get("server_peak_mb"), ",.0f"),
            "ms a token": num(r.get("ms_per_token"), ",.1f"),
            "numpy ms (same process)": num(r.get("numpy_beside_ms"), ",.1f"),
            "x numpy": num(r.get("x_numpy"), ".2f"),
            "round trips / requests a token": f"{num(r.get('round_trips_per_token'), '.0f')} / "
            f"{num(r.get('requests_per_token'), ',.0f')}"
            if r.get("requests_per_token") is not None
            else "",
            "$ a token": num(r.get("dollars_per_token"), ".5f"),
            "first read: open / find model / engine+text / prompt s": " / ".join(
                num(r.get(k), ".2f") for k in ("open_s", "find_model_s", "engine_text_s", "first_read_s")
            )
            if r.get("open_s") is not None
            else "",
            "to the first token s": num(r.get("first_token_s"), ".2f"),
            "whole checkpoint read + hash s": f"{r['whole_read_s']:.2f} + {r['whole_hash_s']:.2f}"
            if r.get("whole_read_s") is not None
            else "",
            "tokens as numpy": r.get("tokens_as_numpy", ""),
            "note": r.get("skipped") or r.get("error") or "",
        }
        for r in rows
    ]


def cost_table(costs: list[dict]) -> list[dict]:
    out = []
    for size in dict.fromkeys(c["size"] for c in costs):
        mine = {c["layout"]: c for c in costs if c["size"] == size}
        row = {"size": size, "params (M)": millions(next(iter(mine.values()))["parameters"])}
        for layout, c in mine.items():
            row[f"{layout}: documents / GB"] = f"{c['documents']:,.0f} / {c['gb']:,.2f}"
            row[f"{layout}: subqueries, $ a token"] = f"{c['subqueries_per_token']:.0f}, ${c['dollars_per_token']:.5f}"
        out.append(row)
    return out


def fit_table(found: list[dict]) -> list[dict]:
    return [
        {"store": f["store"], "sizes": f["sizes"], **{name: num(f[key], ".2f") for key, name in EXPONENTS}}
        for f in found
    ]


def plot(rows: list[dict], found: list[dict], path: Path, title: str) -> Path:
    from common.plots import pyplot, save_plot

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    slopes = {f["store"]: f for f in found}
    stores = list(dict.fromkeys(r["store"] for r in rows))
    colors = dict(zip(stores, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 2))
    for ax, (key, name) in zip(axes, EXPONENTS[:2]):
        for store in stores:
            mine = [r for r in rows if r["store"] == store and r.get(key)]
            if not mine:
                continue
            b = slopes[store][key]
            label = f"{store} ({'b = ' + format(b, '.2f') if b is not None else 'one size'})"
            style = ":" if store in ("numpy", "transformers") else "-"
            x = [r["parameters"] for r in mine]
            ax.plot(x, [r[key] for r in mine], style, marker="o", ms=4, label=label, color=colors[store])
        guide(ax, rows, key)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel(name)
        ax.set_title(f"{name} against parameters (b: fitted exponent)", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return save_plot(fig, path)


def guide(ax, rows: list[dict], key: str) -> None:
    """A grey line of slope 1 through the smallest size's median: time that follows the bytes."""
    first = min((r["parameters"] for r in rows if r.get(key)), default=None)
    if first is None:
        return
    y0 = float(np.median([r[key] for r in rows if r["parameters"] == first and r.get(key)]))
    x = np.array(sorted({r["parameters"] for r in rows}), float)
    ax.plot(x, y0 * x / first, color="grey", lw=0.8, alpha=0.6, label="slope 1")


def merge(results: list[dict]) -> list[dict]:
    """The raw rows of several runs' JSON in size order, a later run's (size, store) winning."""
    from vecgpt.weights import SIZES

    rows = {}
    for data in results:
        for r in data["raw"]:
            rows[(r["size"], r["store"])] = r
    return sorted(rows.values(), key=lambda r: list(SIZES).index(r["size"]))


def assemble(args, raw: list[dict], costs: list[dict], settings: dict) -> dict:
    from common.record import provenance

    rows = [flat(r) for r in raw]
    against_numpy(rows)
    found = fits(rows)
    return {
        "experiment": "sizes",
        "provenance": provenance(seed=getattr(args, "seed", None)),
        "settings": settings,
        "rows": rows,
        "fits": found,
        "layout_costs": costs,
        "raw": raw,
        "table": table(rows),
    }


def markdown(data: dict) -> str:
    from common.record import markdown_table

    s = data["settings"]
    head = (
        f"Random checkpoints of each size{' at scale 1/' + str(s['scale']) if s.get('scale', 1) > 1 else ''}; "
        f"a two-token prompt, then {s.get('n', '?')} greedy tokens (ms a token: their median); each store loaded "
        "and read in processes of their own; peak MB: resident high-water mark (generate: after finding the model); "
        f"turbopuffer on the local server, layout {s.get('tpuf_layout', '?')}, {s.get('tpuf_replicas', '?')} "
        f"cop{'y' if s.get('tpuf_replicas') == 1 else 'ies'}, {s.get('latency_ms', 0):g} ms a request."
    )
    return (
        head
        + "\n\n"
        + markdown_table(data["table"])
        + "\n\nFitted exponents b of y = c * parameters^b (least squares on logs):\n\n"
        + markdown_table(fit_table(data["fits"]))
        + "\n\nturbopuffer: a token in each layout, one copy of the matrices (`load --dry-run`'s estimate_cost):\n\n"
        + markdown_table(cost_table(data["layout_costs"]))
    )


def partial(out: Path, args, raw: list[dict], costs: list[dict]) -> None:
    """The rows so far, so a run stopped part way keeps them (sizes.partial.json)."""
    from common.record import write_json

    write_json(out / "sizes.partial.json", assemble(args, raw, costs, settings_of(args)))


def settings_of(args) -> dict:
    return {k: v for k, v in vars(args).items() if k not in ("func", "render")}


def write(out: Path, args, raw: list[dict], costs: list[dict], settings: dict) -> None:
    """sizes.json, .md and .png; `settings`: the run's options (a render: the first run's, with every run's)."""
    from common.record import publish

    data = assemble(args, raw, costs, settings)
    title = (
        f"GPT-2 sizes, random weights; {os.cpu_count()} cores, {settings.get('threads', '?')} BLAS thread(s); "
        "a two-token prompt, greedy tokens; turbopuffer: the local server"
    )
    publish(out, "sizes", data, markdown(data), lambda path: plot(data["rows"], data["fits"], path, title))
    (out / "sizes.partial.json").unlink(missing_ok=True)
