"""GPT-2 with every matrix multiply as one exact search in a store; read beside reference.py.

The runner (`Step`) has reference.py's functions in its order; where the reference computes `x @ weight + bias` the
engine searches. A step's block of rows belongs to one text or to several (vecgpt.stepper steps every text in flight
together): each matrix is one search with every row, every text's keys are searched in one call in the same round
(each text's in its own collection), attention runs for all texts at once (vecgpt.attend), and the layer norms,
GELU and residual adds run once over the block. A text's state between steps is data (vecgpt.session.Session,
opened by `Engine.open()`); its keys in the store are vecgpt.text_keys'.
Attention's output projection is applied per head to each position's value when it is computed
(collections h.<i>.attn.c_proj.<h>, in the same round as the key search), so a layer is four dependent
rounds: c_attn; key search and value projections; c_fc; c_proj. The projected values are rounded to float32 as
the store holds them (the key rows' payload) and kept in memory in float64. Writes go out in order beside the
searches (vecgpt.writer). The token search brings the next token's rows along (its candidates' documents, the next
position's wpe row), so a generated token's first round is c_attn.
Layer norm, GELU, softmax, residual adds and sampling stay in numpy, in float64. A model loaded with
`--layout three` runs vecgpt.three_rounds' Session and Step instead: three rounds a layer (Engine.session picks
it); `--layout five` runs vecgpt.five_rounds': five, the textbook order, with the raw values kept.
A store holds any number of models; an Engine runs one, named by its store fingerprint (its collections
are `<fingerprint>.<matrix>`), and a text stays on that model whatever else is loaded or dropped.
Writing a model into a store is vecgpt.loading; counting requests is vecgpt.meter; a position read again to look
inside is vecgpt.inspection.
"""

from __future__ import annotations

import importlib
from contextlib import suppress
from functools import partial
from itertools import accumulate

import numpy as np

from vecgpt import encoding, inspection, rounds
from vecgpt.attend import attend, softmax_in_place  # noqa: F401  (softmax_in_place: the engine's, for its readers)
from vecgpt.backends.base import Search, Store, row_order
from vecgpt.errors import VecgptError
from vecgpt.inspection import LENS_K, Inspection  # noqa: F401
from vecgpt.loading import check_layout, collection, hparams_of, session_key
from vecgpt.meter import later
from vecgpt.policy import Policy
from vecgpt.policy import check as check_policy
from vecgpt.reference import gelu, layer_norm
from vecgpt.sampling import ordered
from vecgpt.session import Ahead, Read, Session, chunks, squared_norms, write_points  # noqa: F401
from vecgpt.text_keys import follow_up, keep_norms, key_scores, key_search, queue_rows, searched_end  # noqa: F401

PREFILL_CHUNK = 64  # a prompt's tokens read in one step (a chunk: its boundaries at multiples of this, from 0)
AHEAD_MOST = 64  # candidates whose rows the token search brings along (Step.gpt2); more: the next read fetches


class Engine:
    """A store holding a model, ready to open decoding sessions."""

    def __init__(
        self,
        store: Store,
        top_k: int = 40,
        prompt_block: bool = True,
        model: str | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
        attention_top_k: int | None = None,
        attention_index: str | None = None,
        attention_threshold: float | None = None,
        attention_sinks: int | None = None,
        attention_window: int | None = None,
    ):
        """`model`: the store fingerprint of the model to run (see `vecgpt ls`); None: the only one the store holds.
        A prompt is read `prefill_chunk` tokens at a time (prompt_block=False: one at a time). A new session's policy
        (vecgpt.policy): its queries' K best keys (`attention_top_k`) or keys within beta of the best
        (`attention_threshold`) between the first `attention_sinks` and the last `attention_window` positions, all
        None: every earlier key; `attention_index`: the store's approximate index top-k's key searches use (one of
        its `indexes`, e.g. FAISS's "hnsw"), None: exact."""
        self.store, self.top_k, self.prompt_block = store, top_k, prompt_block
        self.chunk_size = prefill_chunk if prompt_block else 1
        self.key = model or only_model(store)
        manifest = store.read_manifest(self.key)
        if manifest is None:
            raise VecgptError(
                f"the store holds no model {self.key}; run `vecgpt load` first (`vecgpt ls` lists the models)"
            )
        self.manifest = manifest
        self.metric = manifest["metric"]
        self.hparams = hparams_of(manifest)  # GPT-2's HParams, or a Llama family's (manifest["family"])
        self.m2 = manifest["m2"]
        # under l2, each layer's bound on a key row's length (vecgpt.key_bounds): the rows are padded to it, and a
        # key search ranks by q.k; a model loaded before bounds were made: None, and its keys are not padded
        self.key_bound = manifest.get("key_bound") if self.metric == "l2" else None
        self.attention_index = self.check_index(attention_index)
        policy = Policy(attention_top_k, attention_threshold, attention_sinks, attention_window)
        self.policy = self.check_policy(policy)
        self.attention_top_k = self.policy.top_k
        self._ln: tuple | None = None  # layer_norms()

    def check_index(self, kind: str | None) -> str | None:
        """An approximate key index, refused in one line before any search on a store without one of that kind."""
        offered = getattr(self.store, "indexes", ())
        if kind is not None and kind not in offered:
            has = f"its indexes: {', '.join(offered)}" if offered else "it searches keys exactly only"
            raise VecgptError(f"attention_index {kind!r}: this store has no such index of keys ({has}); unset it")
        return kind

    def check_policy(self, policy: Policy) -> Policy:
        """Which keys a query keeps, refused in one line before any search where it cannot run: K and beta rank a
        head's keys by q.k, so the key search must (a model loaded with metric ip); an index serves top-k only."""
        policy = check_policy(policy, self.hparams.n_ctx)
        ranks = policy.top_k is not None or policy.threshold is not None
        if ranks and self.metric != "ip" and self.key_bound is None:
            what = "attention_top_k" if policy.top_k is not None else "attention_threshold"
            raise VecgptError(
                f"{what} ranks each head's earlier keys by q.k: this model was loaded before its keys could be "
                f"padded for that under l2; load it again (vecgpt load --config ...) or use --metric ip"
            )
        if self.attention_index is not None and policy.threshold is not None:
            raise VecgptError("attention_index serves attention_top_k only; unset it for attention_threshold")
        return policy

    def check_top_k(self, k: int | None) -> int | None:
        """K for top-k attention alone (Engine.check_policy)."""
        return self.check_policy(Policy(top_k=k)).top_k

    def name(self, matrix: str) -> str:
        """The collection holding one of this model's matrices or tables."""
        return collection(self.key, matrix)

    def dropped(self) -> bool:
        return self.store.read_manifest(self.key) is None

    def open(self) -> Session:
        return self.session()

    def layer_norms(self) -> tuple[list[dict], dict]:
        """Each layer's ln_1 and ln_2 and the final ln_f ({"weight", "bias"} in float64), fetched once an engine."""
        if self._ln is None:
            n = self.hparams.n_layer
            table = self.store.fetch(self.name("ln"), np.arange(4 * n + 2)).astype(np.float64)
            pair = lambda i: {"weight": table[i], "bias": table[i + 1]}  # noqa: E731
            self._ln = [{"ln_1": pair(4 * i), "ln_2": pair(4 * i + 2)} for i in range(n)], pair(4 * n)
        return self._ln

    def inspect(self, session: Session, position: int, token: int) -> Inspection:
        """What reading `token` at `position` of a session again computes, writing nothing (vecgpt.inspection)."""
        return inspection.inspect(session, position, token)

    def session(self, name: str | None = None, create: bool = True) -> Session:
        """A Session of the model's layout (its manifest's "layout"; a model loaded before layouts existed: four), or
        of the Llama family's in it (vecgpt.llama_rounds)."""
        return session_class(session_key(self.manifest))(self, name, create)


LAYOUTS: dict[str, type[Session]] = {}  # a layout's name -> its Session class; each registers itself (`layout`)


LAYOUTS: dict[str, type[Session]] = {}  # a layout's name -> its Session class; each registers itself (`layout`)


def layout(name: str):
    """Register a Session class as the layout `name` (vecgpt.config.LAYOUTS): a model loaded in it runs it."""

    def register(cls):
        cls.layout, LAYOUTS[name] = name, cls
        return cls

    return register


def session_class(name: str) -> type[Session]:
    """The Session class of a layout, its module (vecgpt.<name>_rounds; "llama_five": vecgpt.llama_rounds) imported
    by name when first asked for."""
    if name not in LAYOUTS:
        importlib.import_module(f"vecgpt.{name.split('_')[0]}_rounds")
    return LAYOUTS[name]


def own_scores(q: np.ndarray, k32: np.ndarray) -> np.ndarray:
    """q.k of each query with its own position's key, q [m, H, hd] and k32 [m, H, hd] -> [H, m], in float64 and
    summed the same way whatever m (as squared_norms)."""
    return (q * np.asarray(k32, np.float64)).sum(axis=-1).T


def put_rows(ids, values):  # outputs [m, n] found in the order of ids [m, n] -> in row order
    order = row_order(ids.shape[1])
    if ids.base is order or (ids == order).all():  # found in row order already (an in-process scan says so)
        return np.asarray(values, np.float64)
    y = np.empty(values.shape)
    np.put_along_axis(y, ids, values, axis=1)
    return y


def only_model(store: Store) -> str:
    check_layout(store)
    keys = sorted(store.manifests())
    if len(keys) != 1:
        raise VecgptError(
            "the store holds no model; run `vecgpt load` first"
            if not keys
            else f"the store holds {len(keys)} models ({', '.join(keys)}); name one"
        )
    return keys[0]


class Step:
    """One forward pass over a block of rows that belong to several texts (a text alone: a block of one), in
    reference.py's order; where the reference computes `x @ weight + bias`, one search with every text's rows. Each
    text's attention is its own: its keys are searched in its collection, in the same round for all texts. A row's
    numbers never depend on the others in the block: every store computes each query alone (docs/batching.md)."""

    group = 1  # query heads a key head serves (grouped-query attention: vecgpt.llama_rounds)

    def __init__(self, reads: list[Read], again: bool = False):
        """again: read positions a second time to look inside (Session.inspect): nothing written, no text changed."""
        self.reads, self.again = reads, again
        self.engine = reads[0].session.engine
        self.hp, self.metric = self.engine.hparams, self.engine.metric
        self.starts = [r.session.position if r.start is None else r.start for r in reads]
        self.bounds = [0, *accumulate(len(r.ids) for r in reads)]  # text i's rows: bounds[i] to bounds[i + 1]
        self.errors: dict[int, BaseException] = {}
        self._reading = (-1, [])  # texts(): (the errors when made, the texts still reading)
        self.residuals: list = [None] * len(reads)  # again: each text's residual after each layer [L, d]
        self.ln, self.ln_f = self.engine.layer_norms()

    def texts(self, only=None) -> list:  # the texts still reading: (index, session, start, its rows in the block)
        if self._reading[0] != len(self.errors):  # errors only grow: made again when one was added
            self._reading = (len(self.errors), reading(self))
        return self._reading[1] if only is None else [t for t in self._reading[1] if only(t[3].stop - t[3].start)]

    def run(self) -> list:
        """Each read's candidates (None where it asked for none), or the error that stopped that text."""
        # a store that reads a manifest for free is asked each time (it may serve a dropped model from memory); any
        # other is asked when a read fails
        local_drop = getattr(self.engine.store, "local", False) and self.engine.dropped()
        for i, s, start, _ in self.texts():
            if local_drop:
                self.errors[i] = s.model_dropped()
            elif not self.again:
                self.guard(i, partial(s.check_read, start))
        out = {}
        with suppress(Stopped):
            out = self.gpt2(self.hidden()) if len(self.errors) < len(self.reads) else {}
        return [self.errors.get(i, out.get(i)) for i in range(len(self.reads))]

    def guard(self, i: int, fn):
        """fn(); its VecgptError stops text i alone (others read on)."""
        try:
            return fn()
        except VecgptError as e:
            self.fail(i, e)

    def fail(self, i: int, error: BaseException) -> None:
        session = self.reads[i].session
        dropped = isinstance(error, VecgptError) and self.engine.dropped()
        self.errors[i] = session.model_dropped() if dropped else error

    def send(self, shared=(), pooled=None, rows=None) -> tuple[list, dict]:
        """One round: `shared` calls for the texts' rows (`rows`: each text's part, by default its rows in the
        block), and each text's key searches `pooled` {index: [Search]}, sent as one call for every text; (the shared
        results, {index: [its searches' hits]})."""
        session = {i: s for i, s, *_ in self.texts()}
        parts = {session[i]: (b.stop - b.start if rows is None else rows.get(i, 0)) for i, _, _, b in self.texts()}
        pool = {session[i]: p for i, p in (pooled or {}).items()}
        out, found, failed = rounds.send(self.engine.store, list(shared), parts, {}, pool)
        index = {id(s): i for i, s in session.items()}
        for s, e in failed.items():
            self.fail(index[id(s)], e)
        if len(self.errors) == len(self.reads):
            raise Stopped
        return out, {index[id(s)]: r for s, r in found.items()}

    # ------------------------------------------------------------ the forward pass, in reference.py's order

    def linear(self, x, name):  # [m, in] -> [m, out]: x @ weight + bias as one search returning every row
        search, decode = self.search_of(x, name)
        (found,), _ = self.send([later.search_many([search])])
        return decode(found[0])

    def search_of(self, x, name):  # x [m, in] -> (a search of every row of a matrix, decode(hits) -> [m, out])
        q = encoding.encode_queries(x, self.metric, self.engine.m2[name])
        return Search(self.engine.name(name), q), lambda hits: self.scatter(hits, q, name)

    def scatter(self, hits, q, name):  # a search of every row -> outputs [m, out] in row order
        return put_rows(hits.ids, encoding.decode_dists(hits.dists, q, self.engine.m2[name], self.metric))

    def feed_forward(self, x, layer):  # [m, d] -> [m, d]
        return self.linear(gelu(self.linear(x, f"h.{layer}.mlp.c_fc")), f"h.{layer}.mlp.c_proj")

    def attention(self, q, searched, own, layer):  # q [m, H, hd] -> [m, d]: sum_h softmax(q k^T / sqrt(hd)) pv_h
        out = np.zeros((len(q), self.hp.n_embd))
        for rows, heads in self.weighted_values(searched, own, layer):
            out[rows] = heads.sum(axis=0)
        return out

    def weighted_values(self, searched, own, layer) -> list:  # -> [(a text's rows, its [H, m, w])], every text's
        texts = list(self.texts())
        entries = [(s, searched[i], own[:, rows], start) for i, s, start, rows in texts]
        values = attend(entries, layer, self.hp.n_embd // self.hp.n_head)
        return [(rows, v) for (*_, rows), v in zip(texts, values)]

    def mha(self, x, layer):  # [m, d] -> [m, d]; earlier keys searched in the store, the own one in memory
        m = len(x)
        q, k, v = self.linear(x, f"h.{layer}.attn.c_attn").reshape(m, 3, self.hp.n_head, -1).transpose(1, 0, 2, 3)
        k32 = k.astype(np.float32)  # keys as the store holds them
        for _, s, start, rows in self.texts():
            keep_norms(s, layer, start, k32[rows])
        searched = self.scores_and_projections(q, v, k32, layer)
        return self.attention(q, searched, own_scores(q, k32), layer)

    def scores_and_projections(self, q, v, k32, layer):  # -> {text: q.k of its earlier keys [H, m, start + m - 1]}
        """The new positions' values projected by their heads' rows of c_proj (kept in each text's `projected` as
        the store holds them), in one round with the key searches of the texts reading one position; a block's rows are
        written, then its keys searched in a round of its own."""
        project, decode = self.projections(v, layer)
        asked = self.key_searches(q, layer, one)
        (found,), own = self.send([later.search_many(project)], calls(asked))
        projected = decode(found)
        for _, s, start, rows in self.texts():
            s.keep_values(layer, start, projected[rows])
            queue_rows(s, layer, start, k32[rows], projected[rows])
        searched = self.key_scores(asked, own, layer)
        return {**searched, **self.key_round(q, layer, only=several)}

    def projections(self, v, layer):  # v [m, H, hd] -> (a search per head, decode(hits) -> [m, H, d])
        m, n_head, hd = v.shape
        names = [f"h.{layer}.attn.c_proj.{h}" for h in range(n_head)]
        m2 = np.repeat([self.engine.m2[name] for name in names], m)[:, None]  # [H m, 1]
        vq = encoding.encode_queries(v.transpose(1, 0, 2).reshape(n_head * m, hd), self.metric, m2[:, 0])
        searches = [Search(self.engine.name(name), vq[h * m : (h + 1) * m]) for h, name in enumerate(names)]

        def decode(found):  # H x hits [m, d] -> [m, H, d]
            ids = found[0].ids if all(h.ids is found[0].ids for h in found) else np.vstack([h.ids for h in found])
            dists = np.vstack([hits.dists for hits in found])
            y = put_rows(ids, encoding.decode_dists(dists, vq, m2, self.metric))
            return y.reshape(n_head, m, -1).transpose(1, 0, 2)

        return searches, decode

    def key_round(self, q, layer, only=None):  # q [m, H, hd] -> {text: q.k [H, m_text, start + m_text - 1]}
        """One round: each text's search of this layer's keys below its last query's position."""
        asked = self.key_searches(q, layer, only)
        _, own = self.send([], calls(asked)) if calls(asked) else ([], {})
        return self.key_scores(asked, own, layer)

    def key_searches(self, q, layer, only=None) -> dict:  # {text: its key searches (Asked) or None: no earlier key}
        asked = {}
        for i, s, start, rows in self.texts(only=only):
            asked[i] = self.guard(i, partial(key_search, s, q[rows], layer, start, self.group))
        return {i: a for i, a in asked.items() if i not in self.errors}

    def key_scores(self, asked, own, layer):  # each text's key searches' hits -> its q.k
        asked, own = self.follow_ups(asked, own, layer)
        out = {}
        for i, s, start, rows in self.texts():
            if i in asked:
                found = own.get(i, [None])[0] if asked[i] is not None else None
                m = rows.stop - rows.start
                out[i] = self.guard(i, partial(key_scores, s, asked[i], found, layer, start, m, self.group))
        return out

    def follow_ups(self, asked, own, layer) -> tuple[dict, dict]:
        """A threshold's range searches, once the first round found each head's best key: a round of their own."""
        more = {}
        for i, s, _, _ in self.texts():
            if asked.get(i) is not None and i in own:
                extra = self.guard(i, partial(follow_up, s, asked[i], own[i][0], layer, self.group))
                if extra is not None:
                    more[i] = extra
        if more:
            _, found = self.send([], {i: a.searches[len(asked[i].searches) :] for i, a in more.items()})
            for i, a in more.items():
                if i in found:
                    asked[i], own[i] = a, [[*own[i][0], *found[i][0]]]
        return asked, own

    def transformer_block(self, x, layer):  # [m, d] -> [m, d]
        ln, eps = self.ln[layer], self.hp.eps
        x = x + self.mha(layer_norm(x, **ln["ln_1"], eps=eps), layer)
        return x + self.feed_forward(layer_norm(x, **ln["ln_2"], eps=eps), layer)

    def hidden(self) -> np.ndarray:  # the block's rows [m] -> [m, d], the final vectors ln_f(x)
        x = self.embeddings()  # [m, d]
        xs = [x]
        for layer in range(self.hp.n_layer):
            x = self.transformer_block(x, layer)
            xs.append(x)
        for i, s, start, rows in self.texts():
            if self.again:
                self.residuals[i] = np.stack([a[rows][0] for a in xs[1:]])
                continue
            if s.trace is not None:
                s.trace.append([a[rows] for a in xs])
            s.ended(self.reads[i].ids, start)
        return layer_norm(x, **self.ln_f, eps=self.hp.eps)

    def embeddings(self):  # every text's tokens -> their wte and wpe rows, as stored, summed [m, d]
        d, rows = self.hp.n_embd, [None] * len(self.reads)
        for i, s, start, _ in self.texts():
            rows[i] = None if self.again else s.take_ahead(self.reads[i].ids, start)
        need = [i for i, *_ in self.texts() if rows[i] is None]
        if need:
            ids = np.concatenate([self.reads[i].ids for i in need]).astype(np.int64)
            pos = np.concatenate([np.arange(self.starts[i], self.starts[i] + len(self.reads[i].ids)) for i in need])
            wte, wpe = self.fetch_rows([("wte", ids), ("wpe", pos)], {i: len(self.reads[i].ids) for i in need})
            at = np.cumsum([0] + [len(self.reads[i].ids) for i in need])
            for j, i in enumerate(need):
                rows[i] = wte[at[j] : at[j + 1]], wpe[at[j] : at[j + 1]]
        x = np.zeros((self.bounds[-1], d))
        for i, *_, block in self.texts():
            x[block] = rows[i][0][:, :d].astype(np.float64) + rows[i][1].astype(np.float64)
        return x

    def fetch_rows(self, tables, weights, shared=()) -> list:
        """Rows of the model's tables [(table, ids)] in one round (each table one fetch, its ids once), `shared`
        calls after them ({text: its part} `weights`); each table's rows in the order asked, then `shared`'s results."""
        fetches, inverse = [], []
        for table, ids in tables:
            unique, back = np.unique(ids, return_inverse=True)
            fetches.append(later.fetch(self.engine.name(table), unique))
            inverse.append(back)
        found, _ = self.send([*fetches, *shared], rows=weights)
        return [*(f[back] for f, back in zip(found, inverse)), *found[len(fetches) :]]

    def gpt2(self, h) -> dict:  # [m, d] -> {text: its k best next tokens}: h @ wte.T as a top-k search
        asking = [i for i, *_ in self.texts() if self.reads[i].k]
        if not asking:
            return {}
        m2 = self.engine.m2["wte"]
        q = encoding.encode_queries(h[[self.bounds[i + 1] - 1 for i in asking]], self.metric, m2)
        # The candidates' rows come with them (a token document's first d columns are its embedding), and the next
        # position's row beside them: the next token's read needs no round of its own for them. Not for a long
        # list of candidates, whose vectors would weigh more than a round (a token's top 1,000: 3 MB).
        sessions = {i: self.reads[i].session for i in asking}
        ahead = [i for i in asking if self.reads[i].k <= AHEAD_MOST and sessions[i].position < self.hp.n_ctx]
        groups: dict = {}  # (k, rows come along) -> the places in `asking` of the texts searched together
        for j, i in enumerate(asking):
            groups.setdefault((self.reads[i].k, i in ahead), []).append(j)
        searches = [Search(self.engine.name("wte"), q[js], k=k, vectors=a) for (k, a), js in groups.items()]
        nxt = np.array([sessions[i].position for i in ahead], np.int64)
        weights = dict.fromkeys(asking, 1)
        if len(ahead):
            wpe, found = self.fetch_rows([("wpe", nxt)], weights, [later.search_many(searches)])
        else:
            wpe, ((found,), _) = None, self.send([later.search_many(searches)], rows=weights)
        out = {}
        for hits, ((_, a), js) in zip(found, groups.items()):
            for row, j in enumerate(js):
                i, ids = asking[j], hits.ids[row]
                dists = encoding.decode_dists(hits.dists[row : row + 1], q[j : j + 1], m2, self.metric)[0]
                out[i] = ordered(ids, dists)
                if a and hits.vectors is not None:  # a store that cannot give them: the next read fetches them
                    s = sessions[i]
                    s.ahead = Ahead(s.position, dict(zip(ids.tolist(), hits.vectors[row])), wpe[ahead.index(i)][None])
        return out


class Stopped(Exception):
    """Every text of a step has failed: the step ends (each text's error is in Step.errors)."""


def reading(step: Step) -> list:  # Step.texts(): (index, session, start, its rows in the block), errors left out
    rows = [slice(a, b) for a, b in zip(step.bounds[:-1], step.bounds[1:])]
    return [(i, r.session, step.starts[i], rows[i]) for i, r in enumerate(step.reads) if i not in step.errors]


def one(m: int) -> bool:  # a text reading one position (a decode step)
    return m == 1


def several(m: int) -> bool:  # a text reading a block (a prompt's chunk)
    return m > 1


def calls(asked: dict) -> dict:  # {text: Asked or None} -> {text: [Search]} of the texts that search
    return {i: a.searches for i, a in asked.items() if a is not None}


Session.step = Step
layout("four")(Session)
