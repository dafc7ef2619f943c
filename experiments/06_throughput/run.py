"""Experiment 6: texts stepped together (vecgpt.stepper), 1 to 32 at once, on each store, against numpy.

For each store and each number of texts B, B texts with prompts of their own are generated at once, greedily,
`-n` tokens each (never stopped early), in one stepper (vecgpt.batch.Batch, at most B at a time, so every text
reads in every step: one forward pass over all their rows). Per row: aggregate tokens a second (every text's decode tokens over the span from the last
text's first token to the last token made), each text's ms a token (the median over every text's decode steps),
requests, round trips and subqueries a token a text from each text's own meter (a shared request counts as a
fraction), and on turbopuffer the dollars a token a text (the store's billed usage over that span, shared by the
decode tokens in it). The reference is numpy float32 with the B texts' rows in one matrix product per matrix
(`BatchedNumpy`). FAISS runs twice: its invariant kernel (a query's bits never depend on the other rows) and
invariant=False (several queries take FAISS's own BLAS search). turbopuffer runs on the local server
(`vecgpt.backends.turbopuffer.server`) at --latency-ms a request; dollars at the published prices.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time
from pathlib import Path

# BLAS on --threads threads (default 2, as the benchmarks): as a script this runs before numpy loads; under
# `vecgpt experiment` numpy is loaded already and the threads are what the environment said (recorded either way).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv[:-1] else "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common/

import numpy as np  # noqa: E402

from vecgpt.backends.base import available  # noqa: E402

from common.plots import pyplot  # noqa: E402
from common.subjects import CONFIGS, RANDOM_SMALL, load_model, model_label, place  # noqa: E402
from common.tpuf_server import start_server  # noqa: E402

NAME = "throughput"
HELP = "aggregate tokens a second and each text's cost, 1 to 32 texts stepped together, per store and numpy"
STORES = ("numpy", *(s for s in available() if (CONFIGS / f"{s}.toml").is_file()))  # every store with a config
TEXTS = (1, 2, 4, 8, 16, 32)
NUMPY = "numpy float32, batched"
FAISS_BLAS = "invariant=False"
FAISS_PRODUCT = "kernel=blas"
GOAL_TEXTS = 16


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stores", nargs="+", choices=STORES, default=list(STORES), help="faiss: invariant and not")
    p.add_argument("--texts", nargs="+", type=int, default=list(TEXTS), help="texts at once, each a row")
    p.add_argument("--max-texts", nargs="*", default=[], metavar="STORE=N", help="fewer texts on a slow store")
    p.add_argument("-n", type=int, default=8, help="tokens each text generates (at least 2)")
    p.add_argument("--prompt-tokens", type=int, default=10, help="each text's prompt: this many random tokens")
    p.add_argument("--model", default=RANDOM_SMALL, help=f"default {RANDOM_SMALL} (GPT-2 small shape); shakespeare")
    p.add_argument("--latency-ms", type=float, default=25.0, help="the local turbopuffer server's delay a request")
    p.add_argument("--store-root", default=None, help="each store under DIR (default: beside its config's place)")
    p.add_argument("--threads", type=int, default=2, help="BLAS and OpenMP threads (set before numpy loads)")
    p.add_argument("--seed", type=int, default=0, help="the prompts' random tokens")
    p.add_argument("--out", default=None, help=f"results folder (default: a new ./results/{NAME}/<timestamp>)")
    p.add_argument("--quiet", action="store_true", help="no load progress bars")


def run(args) -> int:
    from vecgpt.errors import VecgptError

    from common.record import new_run

    if args.n < 2 or args.prompt_tokens < 1 or min(args.texts) < 1:
        raise VecgptError("-n must be 2 or more, --prompt-tokens 1 or more, and every --texts 1 or more")
    model = load_model(args.model)
    limits = max_texts(args.max_texts)
    prompts = make_prompts(model.hparams, max(args.texts), args.prompt_tokens, args.seed)
    out = new_run(NAME, args.out)
    rows, reference = [], numpy_rows(model, prompts, args)
    if "numpy" in args.stores:
        rows += reference
    for name in [s for s in STORES if s in args.stores and s != "numpy"]:
        sizes = [b for b in args.texts if b <= limits.get(name, b)]
        rows += store_rows(name, model, prompts, sizes, args)
    same_as_numpy(rows, reference)
    write(out, args, model, rows, limits)
    return 0


def max_texts(given: list[str]) -> dict:
    from vecgpt.errors import VecgptError

    limits = {}
    for item in given:
        store, _, n = item.partition("=")
        if store not in STORES or not n.isdigit():
            raise VecgptError(f"--max-texts takes STORE=N with STORE one of {', '.join(STORES)}, not {item!r}")
        limits[store] = int(n)
    return limits


def make_prompts(hp, texts: int, length: int, seed: int) -> list[list[int]]:
    """Each text's prompt: `length` random tokens (never <|endoftext|>), text i's the same whatever the size."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, min(hp.n_vocab, 50256), size=(texts, length)).tolist()


# ------------------------------------------------------------ numpy, the B texts' rows in one product per matrix


class BatchedNumpy:
    """numpy float32 GPT-2 for B texts of one length at once: each matrix one product over the B texts' rows
    ([B * m, d] @ [d, out], BLAS sgemm; one row: sgemv), a KV cache of its own per text ([B, heads, positions, head
    width]) and attention as batched products over it, the output layer [B, d] @ [d, vocab] (the token matrix kept
    transposed: OpenBLAS's sgemm over wte.T's view took up to twice as long) then each row's top k."""

    def __init__(self, hp, params: dict, output: np.ndarray, texts: int):
        self.hp, self.p, self.output = hp, params, output  # params: float32; output: wte.T [d, vocab], contiguous
        hd = self.hp.n_embd // self.hp.n_head
        empty = np.zeros((texts, self.hp.n_head, 0, hd), np.float32)
        self.caches = [{"k": empty, "v": empty} for _ in range(self.hp.n_layer)]

    def read(self, ids: np.ndarray, k: int = 40) -> np.ndarray:
        """ids [B, m] -> each text's best k next tokens [B, k], best first."""
        from vecgpt.reference import layer_norm

        start = self.caches[0]["k"].shape[2]
        x = self.p["wte"]["weight"][ids] + self.p["wpe"]["weight"][start : start + ids.shape[1]]
        for block, cache in zip(self.p["h"], self.caches):
            x = self.block(x, block, cache)
        last = layer_norm(x[:, -1], **self.p["ln_f"], eps=self.hp.eps)
        logits = last @ self.output
        best = np.argpartition(-logits, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(logits, best, 1), axis=1, kind="stable")
        return np.take_along_axis(best, order, 1)

    def block(self, x: np.ndarray, block: dict, cache: dict) -> np.ndarray:  # [B, m, d] -> [B, m, d]
        from vecgpt.reference import causal_mask, gelu, layer_norm, softmax

        B, m, d = x.shape
        H, eps = self.hp.n_head, self.hp.eps
        qkv = product(layer_norm(x, **block["ln_1"], eps=eps), block["attn"]["c_attn"])
        q, k, v = (a.reshape(B, m, H, d // H).transpose(0, 2, 1, 3) for a in np.split(qkv, 3, axis=-1))
        cache["k"], cache["v"] = np.concatenate([cache["k"], k], 2), np.concatenate([cache["v"], v], 2)
        scores = q @ cache["k"].transpose(0, 1, 3, 2) / math.sqrt(d // H)  # [B, H, m, n]
        heads = softmax(scores + causal_mask(m, scores.shape[-1], x.dtype)) @ cache["v"]  # [B, H, m, hd]
        x = x + product(heads.transpose(0, 2, 1, 3).reshape(B, m, d), block["attn"]["c_proj"])
        h = gelu(product(layer_norm(x, **block["ln_2"], eps=eps), block["mlp"]["c_fc"]))
        return x + product(h, block["mlp"]["c_proj"])


def product(x: np.ndarray, linear: dict) -> np.ndarray:
    """x [B, m, in] times a matrix: one product over all B * m rows."""
    return (x.reshape(-1, x.shape[-1]) @ linear["weight"] + linear["bias"]).reshape(*x.shape[:-1], -1)


def numpy_rows(model, prompts, args) -> list[dict]:
    """The batched numpy reference at each size: its rows, each with every text's tokens."""
    from vecgpt.reference import _cast

    params, rows = _cast(model.params, np.float32), []
    output = np.ascontiguousarray(params["wte"]["weight"].T)
    for texts in args.texts:
        reader, times, tokens = BatchedNumpy(model.hparams, params, output, texts), [], []
        ids = np.asarray(prompts[:texts])
        for _ in range(args.n):
            ids = reader.read(ids)[:, :1]
            tokens.append(ids[:, 0])
            times.append(time.perf_counter())
        steps = np.diff(times)
        row = {"store": NUMPY, "texts": texts, "n": args.n, "tokens": np.stack(tokens, 1).tolist()}
        row.update(tokens_counted=texts * args.n, decode_steps=texts * len(steps))
        row["tokens_per_s"] = texts * len(steps) / (times[-1] - times[0])
        rows.append({**row, "ms_per_token": 1e3 * float(np.median(steps)), "ms_per_token_p90": p90(steps)})
        print(f"{NUMPY}: {texts} texts, {rows[-1]['tokens_per_s']:.1f} tokens/s", file=sys.stderr)
    return rows


def p90(seconds) -> float:
    return 1e3 * float(np.percentile(seconds, 90))


# ------------------------------------------------------------ the stores


def variants(name: str, args) -> list[tuple[str, object]]:
    """(label, config) for a store name: its config in its own encoding and layout, placed apart; FAISS three times
    (its default kernel; kernel = "blas", one product checked to keep each row's bits; invariant = false)."""
    from vecgpt.config import load_config

    config = load_config(CONFIGS / f"{name}.toml")
    if name == "turbopuffer":
        config.store["timeout"] = 60.0  # a big round on a busy machine; base_url: set when the server starts
    if args.store_root:
        place(config, f"{name}-{NAME}", args.store_root)
    elif name != "turbopuffer":
        place(config, NAME)  # beside the config's own place: kept between runs, apart from the default store
    found = [(f"{name} ({config.metric})", config)]
    if name == "faiss":
        product, fast = copy.deepcopy(config), copy.deepcopy(config)
        product.store["kernel"], fast.store["invariant"] = "blas", False
        found += [
            (f"faiss ({config.metric}, {FAISS_PRODUCT})", product),
            (f"faiss ({config.metric}, {FAISS_BLAS})", fast),
        ]
    return found


def store_rows(name: str, model, prompts, sizes: list[int], args) -> list[dict]:
    """Every size on each variant of the store (turbopuffer: on a local server started for it)."""
    server = start_server(args.latency_ms) if name == "turbopuffer" else None
    try:
        rows = []
        for label, config in variants(name, args):
            if server is not None:
                config.store["base_url"] = server[1]
            rows += variant_rows(label, config, model, prompts, sizes, args)
        return rows
    finally:
        if server is not None:
            server[0].terminate()
            server[0].wait(10)


def variant_rows(label: str, config, model, prompts, sizes: list[int], args) -> list[dict]:
    from vecgpt.api import open_engine

    print(f"{label}: loading the model", file=sys.stderr)
    t = time.perf_counter()
    engine = open_engine(config, model, progress=not args.quiet)
    load_s, rows = time.perf_counter() - t, []
    try:
        measure(engine, config, prompts[:1], 2)  # warm: the first reads of a store (caches, threads) not timed
        for texts in sizes:
            row = {"store": label, "texts": texts, "n": args.n, "load_s": load_s, "layout": engine.manifest["layout"]}
            rows.append({**row, **measure(engine, config, prompts[:texts], args.n), "load_average": os.getloadavg()})
            print(f"{label}: {texts} texts, {rows[-1]['tokens_per_s']:.2f} tokens/s", file=sys.stderr)
    finally:
        engine.store.close()
    return rows


# ------------------------------------------------------------ one size on one store


class Timed:
    """When each text's every read ends (a token's candidates known; the first read is the prompt's), and the
    store's billed usage as each text's first read ends: a stepper's on_step."""

    def __init__(self, store):
        from collections import defaultdict

        self.store, self.ends, self.firsts = store, defaultdict(list), []  # job -> read end times; [(time, usage)]

    def __call__(self, jobs) -> None:
        now = time.perf_counter()
        for job in jobs:
            self.ends[job].append(now)
            if len(self.ends[job]) == 1:
                self.firsts.append((now, usage(self.store)))


def usage(store) -> dict | None:
    """A copy of the store's billed usage (turbopuffer), None for a store that bills nothing."""
    tally = getattr(store, "usage", None)
    for _ in range(10):  # a request in another thread may add a key while it is copied
        try:
            return None if tally is None else dict(tally)
        except RuntimeError:
            continue
    return dict(tally)


def measure(engine, config, prompts, n: int) -> dict:
    """The texts generated at once in one stepper: the row's figures (see the module's docstring)."""
    from vecgpt.batch import Batch
    from vecgpt.errors import VecgptError

    timed = Timed(engine.store)
    began = time.perf_counter()
    batch = Batch(engine, config, len(prompts), on_step=timed)
    outs = batch.run(prompts, n, 0.0, config.top_k, 0, False)
    wall, end = time.perf_counter() - began, usage(engine.store)
    failed = [o["error"] for o in outs if "error" in o]
    if failed:
        raise VecgptError(f"{len(failed)} of {len(outs)} texts failed: {failed[0]}")
    return figures(outs, wall, timed, batch.stepper.steps, end)


def figures(outs: list[dict], wall: float, timed: Timed, steps_by_texts, end: dict | None) -> dict:
    start, begun = max(timed.firsts)  # the last text's first token: every text decodes from here on
    times = list(timed.ends.values())  # each text's reads: its prompt's, then a read a token
    steps = np.concatenate([np.diff(t) for t in times])
    decode = [t for o in outs for t in o["requests"]["per_token"][1:]]  # per_token[0]: the prompt's read
    row = {
        "tokens": [o["tokens"] for o in outs],
        "tokens_counted": sum(len(o["tokens"]) for o in outs),
        "decode_steps": len(steps),
        "wall_s": wall,
        "tokens_per_s": len(steps) / (max(t[-1] for t in times) - start),
        "tokens_per_s_with_prompt": sum(len(o["tokens"]) for o in outs) / wall,
        "ms_per_token": 1e3 * float(np.median(steps)),
        "ms_per_token_p90": p90(steps),
        "steps_by_texts": {str(k): v for k, v in sorted(steps_by_texts.items())},
    }
    for key, field in (("requests", "total"), ("round_trips", "round_trips"), ("subqueries", "subqueries")):
        row[f"{key}_per_token"] = float(np.mean([t[field] for t in decode]))
    row["store_ms_per_token"] = 1e3 * float(np.median([t["seconds"] for t in decode]))  # the rounds' store calls
    kinds = sorted({k for t in decode for k in t["by_kind"]})
    row["requests_by_kind"] = {k: float(np.mean([t["by_kind"].get(k, 0) for t in decode])) for k in kinds}
    if end is not None:
        from vecgpt.backends.turbopuffer import dollars

        spent = {k: end.get(k, 0) - begun.get(k, 0) for k in end}
        row.update(dollars_per_token=dollars(spent) / len(steps), usage_per_token=per(spent, len(steps)))
    return row


def per(tally: dict, tokens: int) -> dict:
    return {k: v / tokens for k, v in tally.items()}


def same_as_numpy(rows: list[dict], reference: list[dict]) -> None:
    """Each store row: how many of its texts gave numpy's greedy tokens, and whether text 0 gave what it gave
    alone (its row of one text) on that store."""
    if not reference:
        return
    numpy_tokens = max(reference, key=lambda r: r["texts"])["tokens"]
    alone = {r["store"]: r["tokens"][0] for r in rows if r["texts"] == 1}
    for r in rows:
        r["texts_as_numpy"] = sum(list(t) == list(numpy_tokens[i]) for i, t in enumerate(r["tokens"]))
        if r["store"] in alone:
            r["first_text_as_alone"] = list(r["tokens"][0]) == list(alone[r["store"]])


# ------------------------------------------------------------ goals, tables, the plot


def goals(rows: list[dict]) -> list[dict]:
    """The goals at GOAL_TEXTS texts (issue "One step for every text in flight"): FAISS (invariant) against its one
    text and against numpy batched, 32 texts no slower in aggregate than 16, turbopuffer's round trips those of a
    text alone. turbopuffer bills a query vector as a subquery whether packed or not: its dollars are no goal."""
    at = {(r["store"], r["texts"]): r for r in rows}
    faiss = next((s for s, _ in at if s.startswith("faiss") and "=" not in s), None)  # its default config
    product = next((s for s, _ in at if s.startswith("faiss") and FAISS_PRODUCT in s), None)
    tpuf = next((s for s, _ in at if s.startswith("turbopuffer")), None)
    wanted = [
        (faiss, 1, "aggregate tokens/s, x one text's", "tokens_per_s", ">=", 4.0),
        (faiss, NUMPY, "aggregate tokens/s, x numpy batched's", "tokens_per_s", ">=", 0.7),
        (faiss, 2 * GOAL_TEXTS, f"aggregate tokens/s at {2 * GOAL_TEXTS} texts, x", "tokens_per_s", ">=", 1.0),
        (faiss, 1, "each text's ms a token, x alone", "ms_per_token", "<=", 4.0),
        (tpuf, 1, "round trips a token a text, x alone", "round_trips_per_token", "==", 1.0),
        (product, 1, "aggregate tokens/s, x one text's", "tokens_per_s", ">=", 4.0),
        (product, NUMPY, "aggregate tokens/s, x numpy batched's", "tokens_per_s", ">=", 0.7),
        (product, 2 * GOAL_TEXTS, f"aggregate tokens/s at {2 * GOAL_TEXTS} texts, x", "tokens_per_s", ">=", 1.0),
        (product, 1, "each text's ms a token, x alone", "ms_per_token", "<=", 4.0),
    ]
    others = sorted({s for s, _ in at if s not in (faiss, product, tpuf, NUMPY) and not s.startswith("faiss")})
    wanted += [(s, 1, "aggregate tokens/s, x one text's", "tokens_per_s", ">=", 2.0) for s in others]
    return [goal(at, *w) for w in wanted if w[0] is not None]  # a store not run has no goal row


def goal(at: dict, store, base, what: str, key: str, sense: str, target: float) -> dict:
    """One goal: the measure at GOAL_TEXTS texts over the same at `base` (1: one text; NUMPY: numpy batched at
    GOAL_TEXTS; more texts than GOAL_TEXTS: the store at that many over the store at GOAL_TEXTS)."""
    many = at.get((store, GOAL_TEXTS))
    other = at.get((NUMPY, GOAL_TEXTS)) if base == NUMPY else at.get((store, base))
    if isinstance(base, int) and base > GOAL_TEXTS:
        many, other = other, many  # 32 texts' figure over 16's: at least 1 means 32 is no slower
    ratio = many[key] / other[key] if many and other and other.get(key) else None
    met = None if ratio is None else {">=": ratio >= target, "<=": ratio <= target}.get(sense)
    if sense == "==" and ratio is not None:
        met = abs(many[key] - other[key]) < 0.5  # whole round trips: the same count
    row = {"store": store, "goal": f"{what} at {GOAL_TEXTS} texts", "target": f"{sense} {target:g}"}
    return {**row, "measured": ratio, "met": None if met is None else bool(met)}


def table_rows(rows: list[dict]) -> list[dict]:
    def num(r, key, fmt):
        return format(r[key], fmt) if r.get(key) is not None else ""

    return [
        {
            "store": r["store"],
            "texts": r["texts"],
            "tokens/s (all texts)": num(r, "tokens_per_s", ",.1f"),
            "ms a token (each text, median)": num(r, "ms_per_token", ",.1f"),
            "of which in the store's calls": num(r, "store_ms_per_token", ",.1f"),
            "requests a token a text": num(r, "requests_per_token", ",.2f"),
            "round trips a token a text": num(r, "round_trips_per_token", ".1f"),
            "$ a token a text": num(r, "dollars_per_token", ".3g"),
            "texts with numpy's tokens": f"{r['texts_as_numpy']}/{r['texts']}" if "texts_as_numpy" in r else "",
        }
        for r in rows
    ]


def goal_rows(found: list[dict]) -> list[dict]:
    return [
        {
            "store": g["store"],
            "goal": g["goal"],
            "target": g["target"],
            "measured": "" if g["measured"] is None else f"{g['measured']:.3g}",
            "met": {True: "pass", False: "FAIL", None: "not measured"}[g["met"]],
        }
        for g in found
    ]


def plot(rows: list[dict], path: Path, title: str) -> Path:
    """tokens a second, ms a token and requests a token a text against the texts at once, a line per store."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 5))
    panels = (
        ("tokens_per_s", "tokens a second, all texts together"),
        ("ms_per_token", "ms a token, each text (median)"),
        ("requests_per_token", "requests a token a text (round trips dashed)"),
    )
    stores = list(dict.fromkeys(r["store"] for r in rows))
    colors = dict(zip(stores, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 2))
    for ax, (key, name) in zip(axes, panels):
        for store in stores:
            mine = [r for r in rows if r["store"] == store and r.get(key) is not None]
            if mine:
                style = ":" if store == NUMPY else "--" if FAISS_BLAS in store else "-"
                x = [r["texts"] for r in mine]
                ax.plot(x, [r[key] for r in mine], style, marker="o", ms=4, label=store, color=colors[store])
                if key == "requests_per_token":
                    rt = [r["round_trips_per_token"] for r in mine]
                    ax.plot(x, rt, "--", lw=1, color=colors[store], alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["texts"] for r in rows}), [str(t) for t in sorted({r["texts"] for r in rows})])
        ax.set_xlabel("texts at once")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=len(labels), loc="lower center")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(out: Path, args, model, rows: list[dict], limits: dict) -> None:
    from common.record import markdown_table, provenance, publish

    what = model_label(model, args.model)
    found = goals(rows)
    data = {
        "experiment": NAME,
        "provenance": provenance(seed=args.seed, model=model, model_name=args.model),
        "settings": {
            "stores": args.stores,
            "texts": args.texts,
            "max_texts": limits,
            "n": args.n,
            "prompt_tokens": args.prompt_tokens,
            "latency_ms": args.latency_ms,
            "numpy": " ".join(BatchedNumpy.__doc__.split()),
        },
        "rows": rows,
        "goals": found,
        "table": table_rows(rows),
    }
    md = (
        f"{args.n} tokens a text after {args.prompt_tokens}-token prompts of their own, greedy; model {what}; "
        f"turbopuffer on the local server at {args.latency_ms:g} ms a request. tokens/s: every text's decode tokens "
        "over the span they took; ms a token: the median of every text's decode steps.\n\n"
        + markdown_table(table_rows(rows))
        + f"\n\nGoals ({GOAL_TEXTS} texts against one):\n\n"
        + markdown_table(goal_rows(found))
    )
    title = (
        f"texts stepped together, {args.n} tokens each, greedy; {what}\n"
        f"{os.cpu_count()} cores, {os.environ.get('OPENBLAS_NUM_THREADS', '?')} BLAS threads; turbopuffer: local server, "
        f"{args.latency_ms:g} ms a request"
    )
    publish(out, NAME, data, md, lambda path: plot(rows, path, title))


if __name__ == "__main__":
    import common

    sys.exit(common.main(sys.modules[__name__]))
