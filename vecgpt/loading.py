"""Writing a model into a store: every matrix as documents, the token and position tables, the layer norms."""

from __future__ import annotations

import contextlib
import re
from datetime import datetime, timezone
from functools import partial

import numpy as np

from vecgpt import encoding
from vecgpt.backends.base import Store
from vecgpt.config import LAYOUTS
from vecgpt.errors import VecgptError
from vecgpt.orders import query_rows, value_output
from vecgpt.weights import HParams, Model

LN_PARTS = ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias")
BATCH = 4096
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


def text_row(hp: HParams, layout: str = "four") -> tuple[int, int]:
    """A text row's vector and payload widths in a layout: four, a key (hd) and its projected value (d);
    three, the document (W_q k, b_q . k) (d + 1) and the key with its projected value (hd + d); five, a key
    and its raw value (hd, hd)."""
    hd = hp.n_embd // hp.n_head
    return {"three": (hp.n_embd + 1, hd + hp.n_embd), "five": (hd, hd)}.get(layout, (hd, hp.n_embd))


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
        if layer is None:
            return {"weight": self.model.tensor(f"{name}.weight")}
        if int(layer[1]) != self.layer:
            self.layer, self.held = None, {}  # the previous layer goes before the next is read
            self.layer, self.held = int(layer[1]), {"h": {int(layer[1]): self.model.block(int(layer[1]))}}
        return get(self.held, name, self.model.hparams.n_head)


def push(store: Store, model: Model, metric: str = "l2", progress: bool = True, layout: str = "four") -> dict:
    """Write every matrix, the token and position tables and the layer norms under the model's own names;
    the manifest goes last, so a load is invisible until complete and never touches another model's data.
    `layout`: one of LAYOUTS; a store may hold a model in both (their keys differ).

    Under the store's load lock where it has one: a second process loading the same model waits, then finds
    it loaded."""
    with getattr(store, "load_lock", contextlib.nullcontext)():
        return _push(store, model, metric, progress, layout)


def _push(store: Store, model: Model, metric: str, progress: bool, layout: str) -> dict:
    if layout not in LAYOUTS:
        raise VecgptError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
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
    m2 = _write_all(store, model, metric, key, progress, layout)
    manifest = {
        "fingerprint": key,
        "model_fingerprint": model.fingerprint,
        "source": model.source,
        "encoding_version": encoding.ENCODING_VERSION,
        "metric": metric,
        "hparams": model.hparams.__dict__,
        "layout": layout,
        "m2": m2,
        "documents": sum(n for _, n, _ in plan(model, metric, layout)),
        "loaded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    store.write_manifest(key, manifest)
    return manifest


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


def _write_all(store: Store, model: Model, metric: str, key: str, progress: bool, layout: str) -> dict[str, float]:
    """Every collection of `plan`, matrix by matrix as read from the checkpoint; M^2 of each (see vecgpt.encoding)."""
    from tqdm import tqdm

    m2, reader = {}, Reader(model)
    total = sum(n for _, n, _ in plan(model, metric, layout))
    bar = tqdm(total=total, unit="doc", desc="load", disable=not progress)
    for name in matrices(model.hparams, layout):
        p = reader.get(name)
        weight, bias = p["weight"].T if name == "wte" else p["weight"], p.get("bias")  # [in, out]
        m2[name] = m = encoding.largest_norm2(weight, bias)
        rows = partial(encoding.encode_block, weight, bias, metric, m)  # a batch of documents at a time
        _write(
            store, collection(key, name), rows, weight.shape[1], encoding.doc_dim(weight.shape[0], metric), metric, bar
        )
        del p, weight, bias, rows
    reader = None
    for name, table in (("wpe", model.tensor("wpe.weight")), ("ln", ln_table(model))):
        _write(store, collection(key, name), table.__getitem__, len(table), table.shape[1], "l2", bar)
    bar.close()
    return m2


def _write(store: Store, name: str, rows, n: int, dim: int, metric: str, bar) -> None:
    """n documents of width dim, rows(slice) giving a batch of them: written BATCH at a time."""
    store.create(name, dim, metric, attrs=("row",))
    for start in range(0, n, BATCH):
        ids = np.arange(start, min(start + BATCH, n))
        store.upsert(name, ids, rows(slice(start, start + len(ids))), {"row": ids})
        bar.update(len(ids))


def ln_table(model: Model) -> np.ndarray:  # [4 * n_layer + 2, d]
    hp = model.hparams
    rows = [model.tensor(f"h.{i}.{part}") for i in range(hp.n_layer) for part in LN_PARTS]
    return np.stack(rows + [model.tensor("ln_f.weight"), model.tensor("ln_f.bias")])
