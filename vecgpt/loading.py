"""Writing a model into a store: every matrix as documents, the token and position tables, the layer norms."""

from __future__ import annotations

import contextlib

import numpy as np

from vecgpt import encoding
from vecgpt.backends.base import Store
from vecgpt.errors import VecgptError
from vecgpt.meter import SESSION_PREFIX
from vecgpt.weights import HParams, Model

LN_PARTS = ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias")
BATCH = 4096


def matrices(hp: HParams) -> list[str]:
    names = []
    for i in range(hp.n_layer):
        names += [f"h.{i}.attn.c_attn", f"h.{i}.attn.c_proj", f"h.{i}.mlp.c_fc", f"h.{i}.mlp.c_proj"]
    return names + ["wte"]


def store_fingerprint(model: Model, metric: str) -> str:
    return f"{model.fingerprint}-e{encoding.ENCODING_VERSION}-{metric}"


def get(params: dict, name: str) -> dict:  # "h.3.attn.c_attn" -> params["h"][3]["attn"]["c_attn"]
    node = params
    for part in name.split("."):
        node = node[int(part)] if part.isdigit() else node[part]
    return node


def plan(model: Model, metric: str) -> list[tuple[str, int, int]]:
    """(collection, documents, dimension) of everything a load writes."""
    hp = model.hparams
    rows = [(name, get(model.params, name)["weight"].shape) for name in matrices(hp)]
    out = [(n, s[0] if n == "wte" else s[1], encoding.doc_dim(hp.n_embd if n == "wte" else s[0], metric))
           for n, s in rows]
    return out + [("wpe", hp.n_ctx, hp.n_embd), ("ln", 4 * hp.n_layer + 2, hp.n_embd)]


def push(store: Store, model: Model, metric: str = "l2", replace: bool = False, progress: bool = True) -> dict:
    """Write every matrix, the token and position tables and the layer norms; the manifest goes last.

    Under the store's load lock where it has one: a second process loading the same model waits, then finds
    it loaded."""
    with getattr(store, "load_lock", contextlib.nullcontext)():
        return _push(store, model, metric, replace, progress)


def _push(store: Store, model: Model, metric: str, replace: bool, progress: bool) -> dict:
    fp = store_fingerprint(model, metric)
    held = store.read_manifest()
    if held and held.get("fingerprint") == fp:
        return held
    offers = getattr(store, "metrics", (metric,))
    if metric not in offers:  # before anything is erased
        raise VecgptError(f"this store cannot rank by {metric!r} (it offers {', '.join(offers)}); "
                          f"use --metric {offers[0]}")
    if held and not replace:
        what = (f"this model in the {held.get('metric')} encoding" if held.get("model_fingerprint") == model.fingerprint
                else f"another model ({held.get('fingerprint')}, from {held.get('source')})")
        raise VecgptError(f"the store holds {what}; pass --replace to overwrite it, or use another store path")
    store.write_manifest(None)  # from here until the end the store holds no complete model
    for name in store.collections():
        if not name.startswith(SESSION_PREFIX):
            store.drop(name)
    m2 = _write_all(store, model, metric, progress)
    manifest = {"fingerprint": fp, "model_fingerprint": model.fingerprint, "source": model.source,
                "encoding_version": encoding.ENCODING_VERSION, "metric": metric,
                "hparams": model.hparams.__dict__, "m2": m2}
    store.write_manifest(manifest)
    return manifest


def _write_all(store: Store, model: Model, metric: str, progress: bool) -> dict[str, float]:
    """Every collection of `plan`; M^2 of each matrix (see vecgpt.encoding)."""
    from tqdm import tqdm

    m2 = {}
    bar = tqdm(total=sum(n for _, n, _ in plan(model, metric)), unit="doc", desc="load", disable=not progress)
    for name in matrices(model.hparams):
        p = get(model.params, name)
        weight = p["weight"].T if name == "wte" else p["weight"]  # [in, out]
        docs, m2[name] = encoding.encode_rows(weight, p.get("bias"), metric)
        _write(store, name, docs, metric, bar)
    _write(store, "wpe", model.params["wpe"]["weight"], "l2", bar)
    _write(store, "ln", ln_table(model), "l2", bar)
    bar.close()
    return m2


def _write(store: Store, name: str, vectors: np.ndarray, metric: str, bar) -> None:
    store.create(name, vectors.shape[1], metric, attrs=("row",))
    for start in range(0, len(vectors), BATCH):
        ids = np.arange(start, min(start + BATCH, len(vectors)))
        store.upsert(name, ids, vectors[ids], {"row": ids})
        bar.update(len(ids))


def ln_table(model: Model) -> np.ndarray:  # [4 * n_layer + 2, d]
    hp = model.hparams
    rows = [get(model.params, f"h.{i}.{part}") for i in range(hp.n_layer) for part in LN_PARTS]
    return np.stack(rows + [model.params["ln_f"]["weight"], model.params["ln_f"]["bias"]])
