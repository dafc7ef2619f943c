"""Writing a model into a store: every matrix as documents, the token and position tables, the layer norms."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sys
import time
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import numpy as np

from vecgpt import encoding, key_bounds, tokenizer
from vecgpt.backends.base import Store
from vecgpt.config import LAYOUTS
from vecgpt.errors import VecgptError
from vecgpt.families import LlamaHParams
from vecgpt.orders import query_rows, value_output
from vecgpt.paths import read_cache
from vecgpt.weights import HParams, Model, default_models_dir

LN_PARTS = ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias")
BATCH = 4096
RATE_BYTES = 64_000_000  # the smallest load whose rate `vecgpt load --dry-run` quotes
BARE = {"wte", "wpe", "ln"}  # names the previous layout gave every model


def matrices(hp: HParams, layout: str = "four") -> list[str]:
    """Every matrix a load writes. The attention output projection is split by head (h.<i>.attn.c_proj.<h>:
    the rows of c_proj that head h's value multiplies), so each position's value is projected when it is
    computed and attention needs no multiply after it (see engine.Session.mha). Layout "three" stores instead
    per head W_v W_o (h.<i>.attn.vo.<h>) and W_q's rows with b_q (h.<i>.attn.qk.<h>): see vecgpt.three_rounds.
    Layout "five" stores c_proj whole (h.<i>.attn.c_proj), applied after attention: see vecgpt.five_rounds."""
    names = []
    for i in range(hp.n_layer):
        names += [f"h.{i}.attn.c_attn", *attention_output(i, hp.n_head, layout), f"h.{i}.mlp.c_fc", f"h.{i}.mlp.c_proj"]
    return names + ["wte"]


def attention_output(layer: int, n_head: int, layout: str) -> list[str]:
    """The matrices a layout stores for attention beyond c_attn: c_proj whole (five), per head (four), or
    layout three's per-head products."""
    if layout == "five":
        return [f"h.{layer}.attn.c_proj"]
    parts = ("vo", "qk") if layout == "three" else ("c_proj",)
    return [f"h.{layer}.attn.{part}.{h}" for part in parts for h in range(n_head)]


def text_row(hp: HParams, layout: str = "four", padded: bool = False) -> tuple[int, int]:
    """A text row's vector and payload widths in a layout: four, a key (hd) and its projected value (d);
    three, the document (W_q k, b_q . k) (d + 1) and the key with its projected value (hd + d); five, a key
    and its raw value (hd, hd). padded: the vector has one more column, the pad that gives every row one length
    (an l2 model's keys, vecgpt.key_bounds)."""
    hd = hp.n_embd // hp.n_head
    dim, payload = {"three": (hp.n_embd + 1, hd + hp.n_embd), "five": (hd, hd)}.get(layout, (hd, hp.n_embd))
    return dim + int(padded), payload


def store_fingerprint(model: Model, metric: str, layout: str = "four") -> str:
    """A loaded model's key in a store: its collections are named from it, its manifest is filed under it."""
    return f"{model.fingerprint}-e{encoding.ENCODING_VERSION}-{metric}" + ("" if layout == "four" else f"-{layout}")


def collection(key: str, name: str) -> str:  # ("0123abcd...-e1-l2", "wte") -> "0123abcd...-e1-l2.wte"
    return f"{key}.{name}"


def matrix_of(name: str) -> str:  # "0123abcd...-e1-l2.h.0.mlp.c_fc" -> "h.0.mlp.c_fc"; any other name as it is
    return re.sub(r"^[0-9a-f]+-e\d+-[a-z0-9]+(-[a-z]+)?\.", "", name)


def get(params: dict, name: str, n_head: int | None = None) -> dict:
    """A matrix's {"weight" [in, out], "bias"}: "h.3.attn.c_attn" is params["h"][3]["attn"]["c_attn"]. A head's
    part of c_proj ("h.3.attn.c_proj.5", n_head needed) holds its rows of the weight, and the bias only for
    head 0 (attention weights sum to 1, so the bias carried by one head's projected values adds it once);
    "vo" and "qk" parts are layout three's products (orders.value_output, orders.query_rows)."""
    product = re.fullmatch(r"h\.(\d+)\.attn\.(vo|qk)\.(\d+)", name)
    if product:
        attn, h = params["h"][int(product[1])]["attn"], int(product[3])
        return (
            value_output(attn["c_attn"], attn["c_proj"], n_head, h)
            if product[2] == "vo"
            else query_rows(attn["c_attn"], n_head, h)
        )
    part = re.fullmatch(r"(h\.\d+\.attn\.c_proj)\.(\d+)", name)
    if part:
        whole, h = get(params, part[1]), int(part[2])
        hd = whole["weight"].shape[0] // n_head
        head = {"weight": whole["weight"][h * hd : (h + 1) * hd]}
        return {**head, "bias": whole["bias"]} if h == 0 and "bias" in whole else head
    node = params
    for part in name.split("."):
        node = node[int(part)] if part.isdigit() else node[part]
    return node


def matrix_shape(hp: HParams, name: str) -> tuple[int, int]:
    """The [in, out] shape of a matrix of `matrices` (wte as stored, [vocab, d]), from the hyper-parameters alone."""
    d, hd = hp.n_embd, hp.n_embd // hp.n_head
    if name == "wte":
        return (hp.n_vocab, d)
    kind = re.sub(r"^h\.\d+\.", "", name)
    if re.fullmatch(r"attn\.c_proj\.\d+", kind):
        return (hd, d)
    if re.fullmatch(r"attn\.qk\.\d+", kind):
        return (hd, d + 1)
    if re.fullmatch(r"attn\.vo\.\d+", kind):
        return (d, d)
    return {"attn.c_attn": (d, 3 * d), "attn.c_proj": (d, d), "mlp.c_fc": (d, 4 * d), "mlp.c_proj": (4 * d, d)}[kind]


def plan(model: Model | HParams, metric: str, layout: str = "four") -> list[tuple[str, int, int]]:
    """(collection, documents, dimension) of everything a load writes, from the model's shape alone."""
    hp = model.hparams if isinstance(model, Model) else model
    if not isinstance(hp, HParams):  # a Llama-family shape (families.LlamaHParams)
        return plan_llama(hp, metric, layout)
    rows = [(name, matrix_shape(hp, name)) for name in matrices(hp, layout)]
    out = [
        (n, s[0] if n == "wte" else s[1], encoding.doc_dim(hp.n_embd if n == "wte" else s[0], metric)) for n, s in rows
    ]
    return out + [("wpe", hp.n_ctx, hp.n_embd), ("ln", 4 * hp.n_layer + 2, hp.n_embd)]


class Reader:
    """A model's matrices for `get`, read from its checkpoint a layer at a time: the layer last asked for is held,
    nothing else (matrices come in layer order, so each layer is read once)."""

    def __init__(self, model: Model):
        self.model, self.layer, self.held = model, None, {}

    def get(self, name: str) -> dict:
        layer = re.match(r"h\.(\d+)\.", name)
        if name == "wte":
            return {"weight": TokenRows(self.model)}
        if layer is None:
            return {"weight": self.model.tensor(f"{name}.weight")}
        if int(layer[1]) != self.layer:
            self.layer, self.held = None, {}  # the previous layer goes before the next is read
            self.layer, self.held = int(layer[1]), {"h": {int(layer[1]): self.model.block(int(layer[1]))}}
        return get(self.held, name, self.model.hparams.n_head)


class TokenRows:
    """The token table as encoding reads a matrix ([d, vocab] after "wte"'s transpose, indexed [:, rows]), its rows
    read from the checkpoint a block at a time as asked: the whole table is never held."""

    def __init__(self, model: Model):
        self.model, self.shape = model, (model.hparams.n_vocab, model.hparams.n_embd)

    @property
    def T(self) -> TokenRows:  # noqa: N802 (numpy's name)
        return Transposed(self)


class Transposed:
    def __init__(self, table: TokenRows):
        self.table, self.shape = table, table.shape[::-1]

    def __getitem__(self, index: tuple) -> np.ndarray:
        start, stop, _ = index[1].indices(self.shape[1])
        return self.table.model.rows("wte.weight", start, stop).T


def push(
    store: Store, model: Model, metric: str | None = None, progress: bool | None = True, layout: str | None = None
) -> dict:
    """Write every matrix, the token and position tables and the layer norms under the model's own names;
    the manifest goes last, so a load is invisible until complete and never touches another model's data.
    `metric` and `layout` (one of LAYOUTS) unset: those of the config the store was opened with (config.open_store),
    so that `vecgpt generate` with that config finds this load; a store opened otherwise, l2 in layout four.
    A store may hold a model in several encodings and layouts (their keys differ). A load stopped part way
    (killed, a full disk) resumes: collections already written are checked and kept (`Load`).
    progress: True, a bar on stderr (and the resume line); None, only when stderr is a terminal; False, silent.

    Under the store's load lock where it has one: a second process loading the same model waits, then finds
    it loaded."""
    opened = getattr(store, "opened_for", None) or ("l2", "four")
    with getattr(store, "load_lock", contextlib.nullcontext)():
        return _push(store, model, metric or opened[0], progress, layout or opened[1])


def _push(store: Store, model: Model, metric: str, progress: bool | None, layout: str) -> dict:
    if layout not in LAYOUTS:
        raise VecgptError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    llama = isinstance(model.hparams, LlamaHParams)
    if llama:
        check_llama_layout(layout)
    key = store_fingerprint(model, metric, layout)
    held = store.read_manifest(key)
    if held:
        return held
    check_layout(store)
    offers = getattr(store, "metrics", (metric,))
    if metric not in offers:
        raise VecgptError(
            f"this store cannot rank by {metric!r} (it offers {', '.join(offers)}); use --metric {offers[0]}"
        )
    rows = plan(model, metric, layout)
    check_memory(store, rows)
    load = (LlamaLoad if llama else Load)(store, key, rows, progress)
    m2 = load.run(model, metric, layout)
    manifest = {
        **({"family": model.hparams.family} if llama else {}),
        "fingerprint": key,
        "model_fingerprint": model.fingerprint,
        "source": model.source,
        **({"tokenizer": tokenizer.record(model)} if llama else {}),  # what its texts are read with (of_manifest)
        "encoding_version": encoding.ENCODING_VERSION,
        "metric": metric,
        "hparams": model.hparams.__dict__,
        "layout": layout,
        "m2": m2,
        "key_bound": load.key_bound,
        "documents": sum(n for _, n, _ in rows),
        "loaded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    store.write_manifest(key, manifest)
    load.record_rate()
    return manifest


def check_memory(store: Store, rows: list) -> None:
    """A store that holds every vector in this process's memory (memory, FAISS) is refused a model larger than the
    memory free, before anything is written."""
    from vecgpt.backends._in_process import InProcessStore
    from vecgpt.cli.attention import available_bytes

    need, free = sum(n * d * 4 for _, n, d in rows), available_bytes()
    if isinstance(store, InProcessStore) and free and need > free:
        raise VecgptError(
            f"{backend_name(store)} holds every vector in memory: this model needs {size_text(need)}, "
            f"{size_text(free)} is free; free memory, or load it into a store that reads from disk "
            f"(pgvector, lancedb, sqlite, duckdb)"
        )


def backend_name(store: Store) -> str:  # vecgpt.backends.pgvector.store.PgStore -> "pgvector"
    module = type(store).__module__
    return module.split(".")[2] if module.startswith("vecgpt.backends.") else module


def drop(store: Store, key: str) -> None:
    """Remove one model: its manifest first (from then on it is not there), then its collections."""
    store.write_manifest(key, None)
    for name in store.collections():
        if name.startswith(collection(key, "")):
            store.drop(name)


def models(store: Store) -> list[dict]:
    """Every model the store holds: its manifest, with the bytes its collections take now."""
    check_layout(store)
    sizes = store.stats()
    out = []
    for key in sorted(store.manifests()):
        manifest = store.read_manifest(key)
        if manifest is not None:  # dropped since the listing
            mine = [v for name, v in sizes.items() if name.startswith(collection(key, ""))]
            out.append({**manifest, "bytes": sum(v.get("bytes", 0) for v in mine if isinstance(v, dict))})
    return out


def check_layout(store: Store) -> None:
    """A store written before models were filed by fingerprint (one model under bare names) is refused."""
    if BARE & set(store.collections()):
        raise VecgptError(
            f"{store} holds a model in the previous layout (one model per store); "
            f"run `vecgpt drop --old-layout` with the same options, then load again"
        )


def drop_old_layout(store: Store) -> list[str]:
    """The previous layout's collections (bare names), removed; texts and filed models stay."""
    gone = [name for name in store.collections() if name in BARE or re.fullmatch(r"h\.\d+\.(attn|mlp)\.c_\w+", name)]
    for name in gone:
        store.drop(name)
    return gone


class Load:
    """The writing of one model's collections, in plan order, each flushed to the store's disk once written. Run
    again after a load stopped part way, it keeps the collections before the last one the stopped load touched,
    each checked first (its count, and one row of every batch against the checkpoint's encoding: one that differs
    is written again); that last one, perhaps cut short, is dropped and written again from nothing."""

    def __init__(self, store: Store, key: str, rows: list, progress: bool | None):
        self.store, self.key, self.rows = store, key, rows
        self.names = [collection(key, name) for name, _, _ in rows]
        there = set(store.collections())
        touched = [i for i, name in enumerate(self.names) if name in there]
        self.kept = {self.names[i] for i in touched[:-1] if store.count(self.names[i]) == rows[i][1]}
        self.doubtful = {self.names[i] for i in touched} - self.kept
        if self.kept and progress is not False:
            print(f"resuming: {len(self.kept)} of {len(rows)} collections already written", file=sys.stderr)
        self.bar = progress_bar(rows, progress)
        self.written, self.started = [0, 0], time.monotonic()  # documents, bytes written by this run

    def run(self, model: Model, metric: str, layout: str) -> dict[str, float]:
        """Every collection of the plan, matrix by matrix as read from the checkpoint; M^2 of each matrix."""
        m2, reader = {}, Reader(model)
        self.key_bound = []  # per layer: every key row a text writes is no longer (vecgpt.key_bounds)
        for name in matrices(model.hparams, layout):
            p = reader.get(name)
            if name.endswith(".attn.c_attn"):
                self.key_bound.append(self.bound(model, name, p, layout))
            weight, bias = p["weight"].T if name == "wte" else p["weight"], p.get("bias")  # [in, out]
            m2[name] = m = encoding.largest_norm2(weight, bias)
            rows = partial(encoding.encode_block, weight, bias, metric, m)  # a batch of documents at a time
            self.write(
                collection(self.key, name), rows, weight.shape[1], encoding.doc_dim(weight.shape[0], metric), metric
            )
            del p, weight, bias, rows
        del reader
        for name, table in (("wpe", model.tensor("wpe.weight")), ("ln", ln_table(model))):
            self.write(collection(self.key, name), table.__getitem__, len(table), table.shape[1], "l2")
        self.bar.close()
        return m2

    @staticmethod
    def bound(model: Model, name: str, c_attn: dict, layout: str) -> float:
        ln = {part: model.tensor(name.replace("attn.c_attn", f"ln_1.{part}")) for part in ("weight", "bias")}
        return key_bounds.layer_bound(c_attn, ln, model.hparams.n_head, layout)

    def write(self, name: str, rows, n: int, dim: int, metric: str) -> None:
        """n documents of width dim, rows(slice) giving a batch of them: written BATCH at a time, then flushed."""
        if name in self.kept and same_rows(self.store, name, rows, n):
            self.bar.update(n)
            return
        if name in self.kept or name in self.doubtful:
            self.store.drop(name)
        with disk_full(self, name):
            self.store.create(name, dim, metric, attrs=("row",))
            for start in range(0, n, BATCH):
                ids = np.arange(start, min(start + BATCH, n))
                self.store.upsert(name, ids, rows(slice(start, start + len(ids))), {"row": ids})
                self.advance(len(ids), len(ids) * dim * 4)
            getattr(self.store, "flush", lambda: None)()

    def advance(self, docs: int, size: int) -> None:
        self.written[0] += docs
        self.written[1] += size
        self.bar.update(docs)
        if not self.bar.disable:
            self.bar.set_postfix_str(f"{self.written[1] / 1e6 / max(self.elapsed(), 1e-9):,.1f} MB/s", refresh=False)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self, name: str) -> int:
        """Bytes of float32 vectors from collection `name` to the end of the plan."""
        return sum(n * d * 4 for _, n, d in self.rows[self.names.index(name) :])

    def record_rate(self) -> None:
        record_rate(backend_name(self.store), *self.written, self.elapsed())


def same_rows(store: Store, name: str, rows, n: int) -> bool:
    """The first row and the last of every batch as held equal the checkpoint's encoding, bit for bit."""
    ids = np.unique(np.r_[0, np.arange(BATCH - 1, n, BATCH), n - 1])
    want = np.vstack([rows(slice(i, i + 1)) for i in ids]).astype(np.float32)
    try:
        held = np.asarray(store.fetch(name, ids), np.float32)
    except VecgptError:
        return False
    return held.shape == want.shape and np.array_equal(held, want)


@contextlib.contextmanager
def disk_full(load: Load, name: str):
    """A write that fails for want of disk room, from any store, as one line: the room the rest needs, and that
    running the same command again resumes."""
    try:
        yield
    except Exception as e:
        if not no_space(e):
            raise
        with contextlib.suppress(Exception):  # its part written: not saved again when the store closes
            load.store.drop(name)
        raise VecgptError(
            f"the disk filled while writing {matrix_of(name)}: the rest of this load is "
            f"{size_text(load.left(name))} of float32 vectors (the store's files take more); free room and run "
            f"the same command again: it resumes"
        ) from None


def size_text(n: int) -> str:
    return f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def no_space(error: BaseException | None) -> bool:
    """ENOSPC anywhere in the chain of causes, or a server's own word for it (PostgreSQL's DiskFull)."""
    while error is not None:
        if getattr(error, "errno", None) == errno.ENOSPC or type(error).__name__ == "DiskFull":
            return True
        if "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def progress_bar(rows: list, progress: bool | None):
    from tqdm import tqdm

    total = sum(n for _, n, _ in rows)
    disable = None if progress is None else not progress  # None: tqdm shows it on a terminal only
    return tqdm(total=total, unit="doc", unit_scale=True, desc="load", disable=disable, file=sys.stderr)


def rates_path() -> Path:
    return default_models_dir().parent / "load-rates.json"


def read_rates() -> dict:
    return read_cache(rates_path())


def record_rate(backend: str, docs: int, size: int, seconds: float) -> None:
    """File this load's rate for `backend` if it wrote more than the one filed (the largest load measures best) and
    at least RATE_BYTES (a tiny load's rate is mostly its start)."""
    rates = read_rates()
    if seconds <= 0 or size < RATE_BYTES or size <= rates.get(backend, {}).get("bytes", 0):
        return
    rates[backend] = {
        "documents": docs,
        "bytes": size,
        "seconds": round(seconds, 3),
        "documents_per_s": round(docs / seconds, 1),
        "mb_per_s": round(size / 1e6 / seconds, 2),
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        rates_path().parent.mkdir(parents=True, exist_ok=True)
        tmp = rates_path().with_name(f"load-rates.{os.getpid()}.part")
        tmp.write_text(json.dumps(rates, indent=1) + "\n")
        tmp.replace(rates_path())
    except OSError:  # a read-only cache: the dry run just has no rate to quote
        pass


def ln_table(model: Model) -> np.ndarray:  # [4 * n_layer + 2, d]
    hp = model.hparams
    rows = [model.tensor(f"h.{i}.{part}") for i in range(hp.n_layer) for part in LN_PARTS]
    return np.stack(rows + [model.tensor("ln_f.weight"), model.tensor("ln_f.bias")])


def check_llama_layout(layout: str) -> None:
    """Layout three is refused for a rotary family, before anything is written (docs/llama-engine.md)."""
    if layout == "three":
        raise VecgptError(
            "layout three scores keys from the layer's input, which rotary positions forbid: q_i.k_j = "
            "(W_q x_i) . R_(j-i) k_j turns with the query's position, so no stored document per key serves every "
            "later query; use --layout four (the fewest rounds) or five"
        )


def llama_matrices(hp, layout: str = "four") -> dict[str, tuple[int, int]]:
    """A Llama-family model's matrices as a load would write them, by collection, with their [documents, input]
    shapes ([out, in], as nn.Linear holds them), named as GPT-2's so that what reads a plan reads this one: the
    projections that share an input stacked into one collection (q, k and v: h.<i>.attn.c_attn; gate and up:
    h.<i>.mlp.c_fc), o_proj as c_proj (whole in five; in four by key head, h.<i>.attn.c_proj.<kv>: the slices of
    o_proj of the query heads that share value head kv, which is their one input), down_proj as mlp.c_proj, and the
    output matrix: wte when tied to the token table, else lm_head."""
    check_llama_layout(layout)
    d, hd, inner = hp.n_embd, hp.head_dim, hp.n_inner
    shapes = {}
    for i in range(hp.n_layer):
        shapes[f"h.{i}.attn.c_attn"] = ((hp.n_head + 2 * hp.n_kv_head) * hd, d)
        for name in attention_output(i, hp.n_kv_head, layout):
            shapes[name] = (d, hp.n_head * hd) if layout == "five" else (hp.group * d, hd)
        shapes[f"h.{i}.mlp.c_fc"] = (2 * inner, d)
        shapes[f"h.{i}.mlp.c_proj"] = (d, inner)
    shapes["wte" if hp.tied else "lm_head"] = (hp.n_vocab, d)
    return shapes


def plan_llama(hp, metric: str, layout: str = "four") -> list[tuple[str, int, int]]:
    """(collection, documents, dimension) of a Llama-family load: one document per output row of every matrix,
    the token table (held apart when the output matrix is its own) and the RMSNorm weights (2 a layer, 1 final).
    No position table: rotary positions are computed, not stored."""
    rows = [(name, n, encoding.doc_dim(n_in, metric)) for name, (n, n_in) in llama_matrices(hp, layout).items()]
    table = [] if hp.tied else [("embed_tokens", hp.n_vocab, hp.n_embd)]
    return rows + table + [("ln", 2 * hp.n_layer + 1, hp.n_embd)]


class LlamaLoad(Load):
    """A Llama-family model's collections in plan_llama's order: per layer q, k and v stacked (attn.c_attn), o_proj
    (attn.c_proj whole in layout five, attn.c_proj.<kv> by key head in four), gate and up stacked (mlp.c_fc),
    down_proj (mlp.c_proj); the output matrix (wte when tied to the token table, else lm_head); the token table when
    untied; the RMSNorm weights."""

    def run(self, model: Model, metric: str, layout: str) -> dict[str, float]:
        hp, m2 = model.hparams, {}
        self.key_bound = []
        for i in range(hp.n_layer):
            block = model.block(i)
            for name, (weight, bias) in llama_layer(block, i, hp, layout).items():
                m2[name] = self.matrix(name, weight, bias, metric)
            self.key_bound.append(llama_key_bound(block, hp))
            del block
        table = model.tensor("model.embed_tokens.weight")
        output = "wte" if hp.tied else "lm_head"
        m2[output] = self.matrix(output, (table if hp.tied else model.tensor("lm_head.weight")).T, None, metric)
        tables = ([] if hp.tied else [("embed_tokens", table)]) + [("ln", llama_norms(model))]
        for name, rows in tables:
            self.write(collection(self.key, name), rows.__getitem__, len(rows), rows.shape[1], "l2")
        self.bar.close()
        return m2

    def matrix(self, name: str, weight: np.ndarray, bias, metric: str) -> float:
        """One matrix [in, out] (its documents, a batch at a time); its M^2."""
        m = encoding.largest_norm2(weight, bias)
        rows = partial(encoding.encode_block, weight, bias, metric, m)
        self.write(collection(self.key, name), rows, weight.shape[1], encoding.doc_dim(weight.shape[0], metric), metric)
        return m


def llama_layer(block: dict, i: int, hp, layout: str = "five") -> dict[str, tuple]:
    """A layer's searches as GPT-2's names: {collection: (weight [in, out], bias or None)}, projections that share an
    input stacked (their outputs side by side), a bias of zeros where one of them has none and another has; o_proj
    whole (five) or by key head (four, `by_key_head`)."""

    def stacked(parts: dict, names: tuple) -> tuple:
        weight = np.vstack([parts[n]["weight"] for n in names])  # [out, in], nn.Linear's
        biases = [parts[n].get("bias") for n in names]
        if all(b is None for b in biases):
            return weight.T, None
        return weight.T, np.concatenate(
            [np.zeros(len(parts[n]["weight"])) if b is None else b for n, b in zip(names, biases)]
        )

    attn, mlp = block["self_attn"], block["mlp"]
    o_proj = stacked(attn, ("o_proj",))
    output = by_key_head(*o_proj, hp, i) if layout == "four" else {f"h.{i}.attn.c_proj": o_proj}
    return {
        f"h.{i}.attn.c_attn": stacked(attn, ("q_proj", "k_proj", "v_proj")),
        **output,
        f"h.{i}.mlp.c_fc": stacked(mlp, ("gate_proj", "up_proj")),
        f"h.{i}.mlp.c_proj": stacked(mlp, ("down_proj",)),
    }


def by_key_head(weight, bias, hp, i: int) -> dict[str, tuple]:
    """o_proj [n_head hd, d] as layout four searches it: for key head kv, the rows of the query heads it serves
    (kv group .. kv group + group - 1), their outputs side by side ([hd, group d]): one search of a position's value
    of head kv gives each of those query heads' projected value. o_proj's bias rides with query head 0 (attention
    weights sum to 1, so it is added once)."""
    hd, d, g = hp.head_dim, hp.n_embd, hp.group
    out = {}
    for kv in range(hp.n_kv_head):
        heads = range(kv * g, (kv + 1) * g)
        part = np.hstack([weight[h * hd : (h + 1) * hd] for h in heads])  # [hd, g d]
        b = None if bias is None else np.concatenate([bias if h == 0 else np.zeros(d) for h in heads])
        out[f"h.{i}.attn.c_proj.{kv}"] = (part, b)
    return out


def llama_key_bound(block: dict, hp: LlamaHParams) -> float:
    """R for one layer (vecgpt.key_bounds, derived for RMSNorm): a key is k_h = R_p (W_h (g * xhat) + b_h), with
    xhat = x / sqrt(mean(x^2) + eps), so |xhat|^2 = |x|^2 / (|x|^2 / d + eps) < d, and R_p, the rotation at position
    p, keeps lengths: |k_h| <= ||W_h diag(g)||_2 sqrt(d) + |b_h|, the largest over the key heads."""
    k_proj = block["self_attn"]["k_proj"]
    w, g = np.asarray(k_proj["weight"], np.float64), np.asarray(block["input_layernorm"]["weight"], np.float64)
    b = k_proj.get("bias")
    out = []
    for h in range(hp.n_kv_head):
        rows = slice(h * hp.head_dim, (h + 1) * hp.head_dim)
        bias = 0.0 if b is None else float(np.linalg.norm(np.asarray(b[rows], np.float64)))
        out.append(np.linalg.norm(w[rows] * g[None, :], 2) * np.sqrt(hp.n_embd) + bias)
    return float(max(out) * key_bounds.MARGIN)


def llama_norms(model: Model) -> np.ndarray:  # [2 n_layer + 1, d]: each layer's two RMSNorm weights, the final one
    n = model.hparams.n_layer
    parts = ("input_layernorm", "post_attention_layernorm")
    rows = [model.tensor(f"model.layers.{i}.{part}.weight") for i in range(n) for part in parts]
    return np.stack(rows + [model.tensor("model.norm.weight")])


def hparams_of(manifest: dict) -> HParams | LlamaHParams:
    """A loaded model's shape from its manifest: GPT-2's, or (a manifest naming a family) a Llama family's."""
    h = manifest["hparams"]
    if manifest.get("family") is None:
        return HParams(**h)
    scaling = tuple(tuple(pair) for pair in h.get("rope_scaling") or ())
    return LlamaHParams(**{**h, "rope_scaling": scaling, "biases": tuple(h.get("biases") or ())})


def session_key(manifest: dict) -> str:
    """The Session class a loaded model runs (engine.session_class): its layout's, or the Llama family's in it."""
    layout = manifest.get("layout") or "four"
    return layout if manifest.get("family") is None else f"llama_{layout}"
