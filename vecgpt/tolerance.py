"""How far a store's logits may be from float64 numpy's, derived, and the rule that compares them.

The tolerance. vecgpt.encoding bounds the error of every search (matrix outputs, attention
scores) from the actual M^2, |q|^2, dimension and the store's unit roundoff u. `logit_tolerance`
re-runs the float64 reference with each multiply's output moved by that bound, the sign drawn at
random, and takes the largest change of any logit: tol = SAFETY x max over PATTERNS runs. Half of
the runs draw one sign per output (errors of independent sign, as rounding errors of different
documents are), half one sign per search (errors shared by every output of a search, such as the
store's rounding of |q|^2, here at the full bound). Why this covers the real error although the
worst sign pattern is not searched: the per-search bound takes gamma_n ~ n u, the worst summation
order, while rounding errors of independent sign add up to about sqrt(n) u (n = 65..3074 here:
8 to 55 times less), and SAFETY = 2 covers the spread of a few random patterns around the error
they sample. The tests report the tolerance beside the error actually seen. A model loaded in layout
"three" (vecgpt.three_rounds) is perturbed in its own order (orders.three_round_heads): W_vo's search with
the product's float32 rounding, each key's document as a search, the searched scores as (x, 1) . document.
Layout "five" (vecgpt.five_rounds) runs the plain order (orders.plain_heads, reference.mha's): the raw values
rounded to float32 as kept, attention's c_proj one search over the heads' outputs.

The rule (`disagreements`), teacher-forced and by token id: each store logit within tol of
numpy's for the same id; two candidates in an order other than numpy's only if numpy's logits are
within 2 tol; nothing from outside numpy's top k unless its numpy logit is within 2 tol of the
k-th (the most a pair of errors of at most tol can move it past a member of the top k).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np

from vecgpt import encoding
from vecgpt.encoding import U32, U64
from vecgpt.engine import searched_end
from vecgpt.errors import VecgptError
from vecgpt.orders import InOrder, query_rows, value_output
from vecgpt.policy import as_policy
from vecgpt.reference import Reference
from vecgpt.sampling import Candidates
from vecgpt.weights import Model, flatten

PATTERNS, SAFETY = 4, 2.0
MEMO_ENTRIES = 32  # the numpy sides remembered (`remembered`); a GPT-2 small row of logits is 0.4 MB a step


def unit_roundoff(backend: str) -> float:
    """The precision a store computes distances in: its module's UNIT_ROUNDOFF where it says (a store returning the
    L2 distance, not its square, rounds once more: SQLite, DuckDB), else the memory store float64, every other
    float32."""
    from vecgpt.backends.base import extra

    try:
        said = extra(backend, "UNIT_ROUNDOFF")
    except (VecgptError, ImportError, KeyError):  # an unknown or uninstalled backend
        said = None
    return said or (U64 if backend == "memory" else U32)


class Perturbation:
    """Moves every multiply of the reference by its search's error bound, with random signs (vecgpt.orders' hook)."""

    def __init__(
        self,
        metric: str,
        u: float,
        seed: int,
        per_output: bool,
        stored: float = U32,
        layout: str = "four",
        top_k=None,
        padded_r2: float | None = None,
    ):
        self.metric, self.u, self.per_output, self.stored, self.layout = metric, u, per_output, stored, layout
        self.top_k = top_k  # the attention policy (vecgpt.policy), or top-k's K alone; None: every key
        self.padded_r2 = padded_r2  # l2 keys padded to one length (vecgpt.key_bounds): its square, else None
        self.rng, self.m2, self._products = np.random.default_rng(seed), {}, {}
        # a store runs attention in its layout's order (vecgpt.orders); plain maths (stored = 0) in layout "four" as numpy
        self.order = "three" if layout == "three" else "projected" if stored > 0 and layout != "five" else "plain"

    def signs(self, shape):
        return self.rng.choice([-1.0, 1.0], shape if self.per_output else (1,) * len(shape))

    def linear(self, x, weight, bias, y):
        bound = encoding.search_bound(x, self.largest_norm2(weight, bias), self.metric, self.u, self.stored)  # [m]
        return y + bound[:, None] * self.signs(y.shape)

    def largest_norm2(self, weight, bias) -> float:  # M^2, as encode_rows computes it
        key = (weight.__array_interface__["data"][0], weight.shape, weight.strides)
        if key not in self.m2:
            b = np.broadcast_to(np.asarray(bias, np.float64), weight.shape[1:])
            self.m2[key] = float((np.einsum("ij,ij->j", weight, weight) + b * b).max())
        return self.m2[key]

    def products(self, c_attn, c_proj, n_head, h):
        """Head h's W_vo and W_qk (layout "three"), made once a run: M^2 is cached by the arrays' address."""
        key = (c_attn["weight"].__array_interface__["data"][0], h)
        if key not in self._products:
            self._products[key] = value_output(c_attn, c_proj, n_head, h), query_rows(c_attn, n_head, h)
        return self._products[key]

    def product(self, x, weight, bias, y):
        """A search of a product made at load (W_vo): project's bounds, and the product rounded to float32 as
        stored: each document d_j moves by at most u32 |d_j| <= u32 M, its output by u32 M |(x, 1)|."""
        rounding = self.stored * np.sqrt(self.largest_norm2(weight, bias) * (np.einsum("ij,ij->i", x, x) + 1))
        return self.project(x, weight, bias, y) + rounding[:, None] * self.signs(y.shape)

    def kept(self, v):
        """c_attn's values as a text keeps them: layout "five" keeps them raw in float32, each element moved by
        at most u32 |v| (the other layouts keep projected values instead: `project`)."""
        return v + self.stored * np.abs(v) * self.signs(v.shape) if self.layout == "five" else v

    def project(self, v, weight, bias, y):
        """A value projected by its head's rows of c_proj: the search's bound, and float32 rounding as kept."""
        return self.linear(v, weight, bias, y) + self.stored * np.abs(y) * self.signs(y.shape)

    def searched(self, n: int, m: int) -> int:
        """Of n keys, m of them new, how many a search scores (engine.searched_end); the rest are scored in memory."""
        return searched_end(n - m, m)

    def searched_scores(self, q, docs, scores):  # q [m, dim] against docs [n, dim], every one searched
        norms2 = self.stored_norms2(np.einsum("ij,ij->i", docs, docs))
        bound = encoding.key_bound(q, norms2, self.metric, self.u, norms2, self.stored)
        return scores + bound * self.signs(scores.shape)

    def stored_norms2(self, norms2):  # |row|^2 of key rows as stored: padded ones all have the bound's
        return norms2 if self.padded_r2 is None else np.full_like(norms2, self.padded_r2)

    def scores(self, q, k, scores):  # the last query's own key is scored in memory: not searched
        norms2 = self.stored_norms2(np.einsum("ij,ij->i", k, k))
        end = searched_end(len(k) - len(q), len(q))
        searched = norms2[:end] if end else norms2
        return scores + encoding.key_bound(q, norms2, self.metric, self.u, searched, self.stored) * self.signs(
            scores.shape
        )


def teacher_forced(reader, prompt: list[int], tokens: list[int], k: int) -> list[Candidates]:
    """The candidates after the prompt and after each of tokens[:-1], fed one at a time."""
    out = [reader.read(prompt, k)]
    return out + [reader.read([t], k) for t in tokens[:-1]]


def forced_logits(model64: Model, prompt: list[int], tokens: list[int], perturb=None, top_k=None) -> np.ndarray:
    """float64 numpy's full logits [steps, vocab] at the same steps as teacher_forced (top_k: under top-k
    attention; with perturb, perturb.top_k)."""
    if perturb is None:
        key = ("forced", ints(prompt), ints(tokens), top_k)
        return remembered(model64, key, lambda: _forced_logits(model64, prompt, tokens, None, top_k))
    return _forced_logits(model64, prompt, tokens, perturb)


def _forced_logits(model64, prompt, tokens, perturb, top_k=None) -> np.ndarray:
    ref = Reference(model64, np.float64, top_k) if perturb is None else InOrder(model64, perturb, np.float64)
    rows = [ref.logits(prompt)[-1]] + [ref.logits([t])[-1] for t in tokens[:-1]]
    return np.stack(rows)


def logit_tolerance(
    model64: Model,
    prompt: list[int],
    tokens: list[int],
    metric: str,
    u: float,
    exact: np.ndarray | None = None,
    stored: float = U32,
    layout: str = "four",
    top_k=None,
    padded_r2: float | None = None,
) -> np.ndarray:
    """Per step, the derived bound on |store logit - float64 numpy logit| for any token. [steps]
    (stored = 0: plain maths in precision u, as numpy float32, no vectors rounded to float32 on the way;
    layout: the model's, vecgpt.config.LAYOUTS; top_k: the attention policy, or top-k's K; padded_r2: l2 key rows
    padded to that squared length; exact: forced_logits of the same arguments, if the caller has it)."""
    key = ("tolerance", ints(prompt), ints(tokens), metric, float(u), float(stored), layout, top_k, padded_r2)
    return remembered(
        model64,
        key,
        lambda: _logit_tolerance(model64, prompt, tokens, metric, u, exact, stored, layout, top_k, padded_r2),
    )


def _logit_tolerance(model64, prompt, tokens, metric, u, exact, stored, layout, top_k, padded_r2) -> np.ndarray:
    exact = forced_logits(model64, prompt, tokens, top_k=top_k) if exact is None else exact
    moved = []
    for seed in range(PATTERNS):
        perturb = Perturbation(metric, u, seed, seed % 2 == 0, stored, layout, top_k, padded_r2)
        moved.append(np.abs(forced_logits(model64, prompt, tokens, perturb) - exact).max(1))
    return SAFETY * np.max(moved, axis=0)


def forced_comparison(
    reader, model64: Model, prompt: list[int], tokens: list[int], metric: str, u: float, k: int = 40
) -> dict:
    """A store's reader and float64 numpy fed the same tokens: the rule at every step, the derived
    tolerance (in the reader's layout) and the largest error seen."""
    cands = teacher_forced(reader, prompt, tokens, k)
    top_k = getattr(reader, "policy", None) or getattr(reader, "attention_top_k", None)
    top_k = top_k if top_k is None or as_policy(top_k).active else None
    exact = forced_logits(model64, prompt, tokens, top_k=top_k)
    layout = getattr(reader, "layout", "four")
    bound = getattr(getattr(reader, "engine", None), "key_bound", None)
    padded_r2 = None if bound is None else float(max(bound)) ** 2
    tol = logit_tolerance(model64, prompt, tokens, metric, u, exact, layout=layout, top_k=top_k, padded_r2=padded_r2)
    broken = [
        f"step {i}: {d}" for i, (c, row, t) in enumerate(zip(cands, exact, tol)) for d in disagreements(c, row, k, t)
    ]
    return {
        "candidates": cands,
        "exact": exact,
        "tol": tol,
        "violations": broken,
        "max_error": np.array([max_error(c, row) for c, row in zip(cands, exact)]),
    }


def block_tolerance(
    model64: Model,
    ids: list[int],
    metric: str,
    u: float,
    stored: float = U32,
    layout: str = "four",
    top_k: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """float64 numpy's logits [positions, vocab] for one block of ids, and the tolerance per position
    (stored = 0: plain maths in precision u, the vectors not rounded to float32 on the way; top_k: top-k attention's)."""
    key = ("block", ints(ids), metric, float(u), float(stored), layout, top_k)
    return remembered(model64, key, lambda: _block_tolerance(model64, ids, metric, u, stored, layout, top_k))


def _block_tolerance(model64, ids, metric, u, stored, layout, top_k) -> tuple[np.ndarray, np.ndarray]:
    exact = Reference(model64, np.float64, top_k).logits(ids)
    moved = []
    for seed in range(PATTERNS):
        ref = InOrder(model64, Perturbation(metric, u, seed, seed % 2 == 0, stored, layout, top_k), np.float64)
        moved.append(np.abs(ref.logits(ids) - exact).max(1))
    return exact, SAFETY * np.max(moved, axis=0)


_memo: OrderedDict = OrderedDict()
_memo_lock = threading.Lock()


def remembered(model: Model, key: tuple, compute):
    """compute(), remembered by the model's weights (their bytes, not their name) and key: a comparison's numpy
    side is the same for every store compared with it (the tests, the agreement experiment), and takes seconds.
    Arrays come back read-only, as they are shared."""
    key = (weights_digest(model), *key)
    with _memo_lock:
        if key in _memo:
            _memo.move_to_end(key)
            return _memo[key]
    value = compute()
    for a in value if isinstance(value, tuple) else (value,):
        a.flags.writeable = False
    with _memo_lock:
        _memo[key] = value
        while len(_memo) > MEMO_ENTRIES:
            _memo.popitem(last=False)
    return value


def weights_digest(model: Model) -> str:
    """The weights' own bytes, dtype and shape (not `fingerprint`, which names a store's model by its float32 values:
    two float64 models that round alike would share it)."""
    digest = hashlib.sha256()
    for name, value in sorted(flatten(model.params).items()):
        digest.update(f"{name} {value.dtype.str} {value.shape}".encode())
        digest.update(np.ascontiguousarray(value).data)
    return digest.hexdigest()


def ints(ids) -> tuple[int, ...]:
    return tuple(int(i) for i in ids)


def disagreements(c: Candidates, ref: np.ndarray, k: int, tol: float) -> list[str]:
    """Where the store's candidates c break the rule against numpy's full logit row ref; [] if none."""
    ids, got = np.asarray(c.ids, np.int64), np.asarray(c.logits, np.float64)
    want, k = ref[ids], min(k, len(ref))
    out = [] if len(ids) == k else [f"{len(ids)} candidates, not {k}"]
    out += [
        f"token {ids[i]}: logit {got[i]:.9g}, numpy {want[i]:.9g}, error above {tol:.3g}"
        for i in np.flatnonzero(np.abs(got - want) > tol)
    ]
    before = np.triu(want[None, :] - want[:, None] > 2 * tol, 1)  # [i, j]: i ranked first, numpy's j higher
    out += [
        f"token {ids[i]} before {ids[j]}, numpy {want[i]:.9g} < {want[j]:.9g} by over 2 tol"
        for i, j in np.argwhere(before)
    ]
    kth = np.partition(ref, len(ref) - k)[len(ref) - k]
    out += [
        f"token {ids[i]}: numpy {want[i]:.9g}, more than 2 tol below numpy's k-th {kth:.9g}"
        for i in np.flatnonzero(want < kth - 2 * tol)
    ]
    return out


def max_error(c: Candidates, ref: np.ndarray) -> float:
    return float(np.abs(np.asarray(c.logits) - ref[np.asarray(c.ids)]).max())


def greedy_margin(ref: np.ndarray) -> np.ndarray:
    """numpy's top-2 gap per step, [steps]: a greedy run is fixed where it exceeds 2 tol."""
    top = np.sort(np.partition(ref, -2, axis=-1)[..., -2:], axis=-1)
    return top[..., 1] - top[..., 0]


def sure_greedy_steps(exact: np.ndarray, tol: np.ndarray) -> int:
    """How many leading greedy tokens every run within tol shares with numpy: up to the first step
    whose top-2 gap is 2 tol or less."""
    fixed = greedy_margin(exact) > 2 * tol
    return int(len(fixed) if fixed.all() else np.argmin(fixed))


def sure_draw(ref: np.ndarray, u: float, temperature: float, k: int, tol: float) -> tuple[int | None, str]:
    """The token `sampling.choose` draws from numpy's row ref with uniform u, if every store within
    tol draws it too; else (None, why). A store's r-th best logit is within tol of numpy's r-th (a
    sorted list moves by at most what each entry moves), so its CDF over ranks, F = A / (A + B),
    is within F (1 - F) (e^(2 tol / T) - 1) <= (e^(2 tol / T) - 1) / 4 of numpy's; and its token at
    the drawn rank is numpy's if that token's logit stands more than 2 tol from both neighbours."""
    order = np.lexsort((np.arange(len(ref)), -ref))[: k + 1]  # numpy's top k + 1, best first
    top = ref[order]
    z = top[:k] / temperature
    cdf = np.cumsum(np.exp(z - z.max()))
    cdf /= cdf[-1]
    i = min(int(np.searchsorted(cdf, u, side="right")), k - 1)
    gaps = -np.diff(top)  # gaps[j]: between ranks j and j + 1
    if any(gaps[j] <= 2 * tol for j in (i - 1, i) if 0 <= j < len(gaps)):
        return None, "near tie"
    eps = np.expm1(2 * tol / temperature) / 4 + 1e-12
    if any(abs(u - cdf[j]) <= eps for j in (i - 1, i) if 0 <= j < k - 1):
        return None, "near a CDF boundary"
    return int(order[i]), ""
