"""GPT-2 with every matrix multiply as one exact search in a store; read beside reference.py.

`push` writes a model into a store. `Engine.open()` starts a `Text`: its attention keys live in the
store (collection text-<id>, tagged layer/head/position), its values in process memory. Layer norm,
GELU, softmax, residual adds and sampling stay in numpy, in float64.
"""

from __future__ import annotations

import contextlib
import math
import uuid

import numpy as np

from vecgpt import encoding
from vecgpt.attention import RunningSoftmax
from vecgpt.backends.base import Search, Store, Where
from vecgpt.errors import VecgptError
from vecgpt.meter import Meter
from vecgpt.reference import gelu, layer_norm
from vecgpt.sampling import Candidates, ordered
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
    out = [(n, s[0] if n == "wte" else s[1], encoding.doc_dim(hp.n_embd if n == "wte" else s[0], metric)) for n, s in rows]
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
    if held and not replace:
        raise VecgptError(f"the store holds another model ({held.get('fingerprint')}, from {held.get('source')}); "
                          f"pass --replace to overwrite it, or use another store path")
    store.write_manifest(None)  # from here until the end the store holds no complete model
    for name in store.collections():
        if not name.startswith("text-"):
            store.drop(name)
    hp, m2 = model.hparams, {}
    from tqdm import tqdm

    bar = tqdm(total=sum(n for _, n, _ in plan(model, metric)), unit="doc", desc="load", disable=not progress)
    for name in matrices(hp):
        p = get(model.params, name)
        weight = p["weight"].T if name == "wte" else p["weight"]  # [in, out]
        docs, m2[name] = encoding.encode_rows(weight, p.get("bias"), metric)
        _write(store, name, docs, metric, bar)
    _write(store, "wpe", model.params["wpe"]["weight"], "l2", bar)
    _write(store, "ln", ln_table(model), "l2", bar)
    bar.close()
    manifest = {"fingerprint": fp, "model_fingerprint": model.fingerprint, "source": model.source,
                "encoding_version": encoding.ENCODING_VERSION, "metric": metric,
                "hparams": model.hparams.__dict__, "m2": m2}
    store.write_manifest(manifest)
    return manifest


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


class Engine:
    """A store holding a model, ready to open texts."""

    def __init__(self, store: Store, top_k: int = 40, prompt_block: bool = True, tile: int = 8):
        self.store, self.top_k, self.prompt_block, self.tile = store, top_k, prompt_block, tile
        manifest = store.read_manifest()
        if manifest is None:
            raise VecgptError("the store holds no model; run `vecgpt load` first")
        self.manifest = manifest
        self.metric = manifest["metric"]
        self.hparams = HParams(**manifest["hparams"])
        self.m2 = manifest["m2"]

    def check(self, model: Model) -> None:
        if self.manifest["fingerprint"] != store_fingerprint(model, self.metric):
            raise VecgptError(f"the store holds model {self.manifest['fingerprint']}, not {model.source} "
                              f"({store_fingerprint(model, self.metric)}); load it with --replace")

    def open(self) -> "Text":
        return Text(self)


class Text:
    """One text: keys in the store, values and |k|^2 in memory, and the tokens read so far."""

    def __init__(self, engine: Engine):
        self.engine, self.store, self.hp = engine, engine.store, engine.hparams
        self.metric, self.meter = engine.metric, Meter(engine.store)
        self.name = f"text-{uuid.uuid4().hex[:12]}"
        hp, hd = self.hp, self.hp.n_embd // self.hp.n_head
        self.tokens: list[int] = []
        self.trace: list | None = None  # set to [] to collect the residual stream after each layer
        self.pending: list[tuple] = []  # a decode step's keys, written together with its token search
        self.values = np.zeros((hp.n_layer, hp.n_ctx, hp.n_head, hd))  # [L, ctx, H, hd]
        self.key_norms = np.zeros((hp.n_layer, hp.n_head, hp.n_ctx))  # [L, H, ctx]
        self.meter.together(("open", lambda: self.store.create(self.name, hd, self.metric, ("layer", "head", "position"))),
                            ("open", self._fetch_ln))

    def _fetch_ln(self) -> None:
        table = self.store.fetch("ln", np.arange(4 * self.hp.n_layer + 2)).astype(np.float64)
        self.ln = [{"ln_1": {"weight": table[4 * i], "bias": table[4 * i + 1]},
                    "ln_2": {"weight": table[4 * i + 2], "bias": table[4 * i + 3]}} for i in range(self.hp.n_layer)]
        self.ln_f = {"weight": table[-2], "bias": table[-1]}

    @property
    def position(self) -> int:
        return len(self.tokens)

    def truncate(self, n: int) -> None:
        """Forget tokens from n on; their keys stay in the store until overwritten, unseen by filters."""
        self.tokens = self.tokens[:n]

    def close(self) -> None:
        self.store.drop(self.name)

    def read(self, ids, k: int | None = None) -> Candidates:
        """Feed tokens; the best k next tokens after the last one."""
        ids = [int(i) for i in ids]
        if self.position + len(ids) > self.hp.n_ctx:
            raise VecgptError(f"the text would reach {self.position + len(ids)} tokens; the context holds {self.hp.n_ctx}")
        blocks = [ids] if self.engine.prompt_block else [[i] for i in ids]
        for block in blocks:
            x = self._forward(block)
        return self._next_tokens(x[-1:], k or self.engine.top_k)

    def _forward(self, ids: list[int]) -> np.ndarray:  # [m] -> [m, d]
        start = self.position
        x = self._embed(ids, start)  # [m, d]
        for layer in range(self.hp.n_layer):
            x = self._block(x, layer, start)
            if self.trace is not None:
                self.trace.append(x.copy())
        self.tokens += ids
        return x

    def _embed(self, ids, start):  # [m] -> [m, d]
        d, positions = self.hp.n_embd, np.arange(start, start + len(ids))
        *_, wte, wpe = self.meter.together(*self._flush(), ("lookup", lambda: self.store.fetch("wte", np.asarray(ids))),
                                           ("lookup", lambda: self.store.fetch("wpe", positions)))
        return wte[:, :d].astype(np.float64) + wpe.astype(np.float64)

    def _block(self, x, layer, start):  # [m, d] -> [m, d]
        ln, eps = self.ln[layer], self.hp.eps
        x = x + self._mha(layer_norm(x, **ln["ln_1"], eps=eps), layer, start)
        h = gelu(self._linear(layer_norm(x, **ln["ln_2"], eps=eps), f"h.{layer}.mlp.c_fc"))  # [m, 4d]
        return x + self._linear(h, f"h.{layer}.mlp.c_proj")

    def _linear(self, x, name):  # [m, in] -> [m, out], one search returning every row
        q = encoding.encode_queries(x, self.metric)
        (hits,) = self.meter.together(("matrix", lambda: self.store.search(name, q)))
        y = np.empty((len(x), hits.ids.shape[1]))
        np.put_along_axis(y, hits.ids, encoding.decode_dists(hits.dists, q, self.engine.m2[name], self.metric), axis=1)
        return y

    def _mha(self, x, layer, start):  # [m, d] -> [m, d]
        hp, m = self.hp, len(x)
        hd = hp.n_embd // hp.n_head
        q, k, v = (a.reshape(m, hp.n_head, hd) for a in np.split(self._linear(x, f"h.{layer}.attn.c_attn"), 3, axis=1))
        k32 = k.astype(np.float32)  # the keys as the store holds them
        self.values[layer, start:start + m] = v
        self.key_norms[layer, :, start:start + m] = np.einsum("mhd,mhd->hm", k32.astype(np.float64), k32.astype(np.float64))
        if m == 1:  # decode: earlier keys from the store, the own key from memory; this one is written later
            self.pending.append((layer, start, k32))
            searches = self._key_searches(q, layer, start)
            found = self.meter.together(*searches)[0] if searches else [None] * hp.n_head
            own = (np.array([[start]]), np.einsum("hd,hd->h", q[0], k32[0].astype(np.float64)).reshape(-1, 1, 1))
        else:  # a block: write its keys, then every query searches all keys up to the block's end
            self.meter.together(("key_write", lambda: self._write_keys([(layer, start, k32)])))
            found = self.meter.together(*self._key_searches(q, layer, start + m))[0]
            own = None
        heads = self._attend(q, found, own, layer, start)  # [H, m, hd]
        return self._linear(heads.transpose(1, 0, 2).reshape(m, -1), f"h.{layer}.attn.c_proj")

    def _write_keys(self, entries):  # [(layer, start, k32 [m, H, hd])] in one upsert
        ids, vectors, attrs = [], [], {"layer": [], "head": [], "position": []}
        for layer, start, k32 in entries:
            m, n_head = k32.shape[:2]
            pos, head = np.repeat(np.arange(start, start + m), n_head), np.tile(np.arange(n_head), m)
            ids.append(self._key_ids(layer, head, pos))
            vectors.append(k32.reshape(m * n_head, -1))
            for name, column in (("layer", np.full(m * n_head, layer)), ("head", head), ("position", pos)):
                attrs[name].append(column)
        self.store.upsert(self.name, np.concatenate(ids), np.vstack(vectors),
                          {name: np.concatenate(c) for name, c in attrs.items()})

    def _flush(self):  # the pending key write as a (kind, fn) call, to ride along with another round
        if not self.pending:
            return []
        entries, self.pending = self.pending, []
        return [("key_write", lambda: self._write_keys(entries))]

    def _key_ids(self, layer, head, pos):
        return (layer * self.hp.n_head + head) * self.hp.n_ctx + pos

    def _key_searches(self, q, layer, end):  # every head's keys at positions < end, in one search_many
        if end == 0:
            return []
        q32 = q.astype(np.float32)

        def run():
            hits = self.store.search_many([Search(self.name, q32[:, h], where=Where(
                eq={"layer": layer, "head": h}, lt={"position": end})) for h in range(self.hp.n_head)])
            if any(h.ids.shape[1] != end for h in hits):  # e.g. a server that crashed dropped its unlogged tables
                raise VecgptError(f"the store lost keys of this text ({min(h.ids.shape[1] for h in hits)} of {end} "
                                  f"positions found in layer {layer}); start the text again")
            return [(q32[:, h], hits[h]) for h in range(self.hp.n_head)]
        return [("key_search", run)]

    def _attend(self, q, found, own, layer, start):  # q [m, H, hd] -> [H, m, hd], all heads a tile at a time
        m, n_head, hd = q.shape
        state, columns = RunningSoftmax((n_head, m), hd), []
        if found[0] is not None:
            columns.append(self._key_scores(found, layer))
        if own is not None:
            columns.append(own)
        query_pos = np.arange(start, start + m)[:, None]
        for pos, dots in columns:  # pos [m, n] key positions, dots [H, m, n]
            for t in range(0, pos.shape[1], self.engine.tile):
                p = pos[:, t:t + self.engine.tile]  # [m, tile]
                values = self.values[layer, p[0]].transpose(1, 0, 2)  # [H, tile, hd]
                state.update(dots[:, :, t:t + self.engine.tile] / math.sqrt(hd), values, mask=p <= query_pos)
        return state.finish()

    def _key_scores(self, found, layer):  # per-head (q32, hits) -> positions [m, n], q.k [H, m, n]
        order = [np.argsort(hits.ids, axis=1) for _, hits in found]  # each head: its keys in position order
        pos = np.take_along_axis(found[0][1].ids, order[0], 1) % self.hp.n_ctx  # [m, n], the same for every head
        dots = [encoding.decode_key_dists(np.take_along_axis(hits.dists, o, 1), q32, self.key_norms[layer, h][pos],
                                          self.metric) for h, ((q32, hits), o) in enumerate(zip(found, order))]
        return pos, np.stack(dots)

    def _next_tokens(self, x, k):  # [1, d] -> the k best tokens
        q = encoding.encode_queries(layer_norm(x, **self.ln_f, eps=self.hp.eps), self.metric)
        *_, hits = self.meter.together(*self._flush(), ("token_search", lambda: self.store.search("wte", q, k=k)))
        return ordered(hits.ids[0], encoding.decode_dists(hits.dists, q, self.engine.m2["wte"], self.metric)[0])
