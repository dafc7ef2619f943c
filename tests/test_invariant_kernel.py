"""The invariant kernels: a search of every row with several queries gives each row the bits of its query searched
alone, on FAISS and memory, in both metrics: the fixed-order kernel (vecgpt/backends/_kernel.py) and the checked
product (vecgpt/backends/_product.py), whether its once-a-shape check passes or fails. What is expected is computed
here (each query alone, and a float64 reference), never read from the code under test."""

from __future__ import annotations

import numpy as np
import pytest

from vecgpt.backends import _product
from vecgpt.backends import memory as memory_store
from vecgpt.errors import VecgptError

faiss_store = pytest.importorskip("vecgpt.backends.faiss")

ROWS, DIM = 1100, 200  # past a whole ALIGN and under TAIL: both of the product's blocks
COUNTS = (2, 3, 5, 16, 17, 33, 70)  # query counts: ladder sizes, padded ones, more than one call
MODULES = {"faiss": faiss_store, "memory": memory_store}
FALLBACK = {"faiss": "scan", "memory": "gemv"}
DEFAULT = {"faiss": "fixed", "memory": "fixed"}


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Verdicts of this test's own (they are process-wide: once a shape)."""
    monkeypatch.setattr(_product, "VERDICTS", {})


def filled(backend: str, metric: str, tmp_path, rows: int = ROWS, **options):
    options = {"kernel": "blas", **options}  # kernel None: the default
    store = MODULES[backend].connect(str(tmp_path / backend), **{k: v for k, v in options.items() if v is not None})
    x = np.random.default_rng(5).standard_normal((rows, DIM)).astype(np.float32)
    store.create("m", DIM, metric)
    store.upsert("m", np.arange(rows), x)
    return store


def assert_rows_are_each_alone(store, k=None):
    q = np.random.default_rng(6).standard_normal((max(COUNTS), DIM)).astype(np.float32)
    alone = [store.search("m", q[i : i + 1], k=k) for i in range(len(q))]
    for m in COUNTS:
        together = store.search("m", q[:m], k=k)
        for i in range(m):
            assert np.array_equal(together.dists[i], alone[i].dists[0]), (m, i)
            assert np.array_equal(together.ids[i], alone[i].ids[0]), (m, i)


def product_keeps_rows_here(x: np.ndarray) -> bool:
    """Whether the checked product gives each row of x its query's bits alone on this CPU and BLAS, found here: three
    queries alone, then among 2 to 64 others in turn, through the product's calls."""
    q = np.random.default_rng(11).standard_normal((3, x.shape[1])).astype(x.dtype)
    alone = np.concatenate([_product.product(q[i : i + 1], x) for i in range(3)])
    turns = np.arange(64) % 3
    return all(np.array_equal(_product.product(q[turns[:m]], x), alone[turns[:m]]) for m in range(2, 65))


def near_float64(store, backend, metric):
    """Each distance within a stated bound of float64's: a sum of DIM + 2 terms in float32 (memory: float64)."""
    q = np.random.default_rng(6).standard_normal((5, DIM)).astype(np.float32)
    x = store.fetch("m", np.arange(ROWS)).astype(np.float64)
    q64 = q.astype(np.float64)
    exact = -(q64 @ x.T) if metric == "ip" else ((q64[:, None, :] - x[None]) ** 2).sum(-1)
    scale = np.abs(q64) @ np.abs(x).T if metric == "ip" else ((np.abs(q64)[:, None, :] + np.abs(x)[None]) ** 2).sum(-1)
    u = np.finfo(np.float32 if backend == "faiss" else np.float64).eps
    return np.all(np.abs(store.search("m", q).dists - exact) <= (DIM + 3) * u * scale + 1e-12)


@pytest.mark.parametrize("backend", ["faiss", "memory"])
@pytest.mark.parametrize("metric", ["ip", "l2"])
@pytest.mark.parametrize("k", [None, 7])
@pytest.mark.parametrize("kernel", ["blas", "fixed"])
def test_each_row_of_a_search_is_its_query_alone(tmp_path, backend, metric, k, kernel):
    store = filled(backend, metric, tmp_path, kernel=kernel)
    assert_rows_are_each_alone(store, k)
    assert near_float64(store, backend, metric)
    x = store.fetch("m", np.arange(ROWS)).astype(np.float32 if backend == "faiss" else np.float64)
    if kernel == "fixed":
        expected = "fixed"
    elif backend == "faiss" and metric == "l2":
        expected = "scan"  # l2 keeps FAISS's own sums
    else:
        expected = "blas" if product_keeps_rows_here(x) else FALLBACK[backend]
    assert store.stats()["m"]["kernel"] == expected


def fixed_order(q: np.ndarray, x: np.ndarray, metric: str) -> np.ndarray:
    """Each (query, row) summed in increasing dimension order, one rounding an operation, in numpy (no BLAS)."""
    acc = np.zeros((len(q), len(x)), x.dtype)
    for d in range(x.shape[1]):
        term = q[:, d : d + 1] * x[None, :, d] if metric == "ip" else (q[:, d : d + 1] - x[None, :, d]) ** 2
        acc = acc + term
    return acc


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("metric", ["ip", "l2"])
@pytest.mark.parametrize(("rows", "dim"), [(1, 1), (37, 13), (64, 8), (100, 65), (300, 3073)])
def test_the_fixed_kernel_sums_each_output_in_increasing_dimension_order(dtype, metric, rows, dim):
    """One to three queries read the rows in place (the direct kernel; 3073: row vectors in bands, gs rows apart),
    more through a tile's buffer: the same sums."""
    from vecgpt.backends import _kernel

    if dim == 3073 and dtype == np.float32:
        assert _kernel.group_rows(dim, 4, 8, rows) > 8  # rows 3 pages and 4 bytes long: banded
    rng = np.random.default_rng(12)
    x, q = rng.standard_normal((rows, dim)).astype(dtype), rng.standard_normal((19, dim)).astype(dtype)
    expected = fixed_order(q, x, metric)
    for m in range(1, 20):  # every query block (8, 4, 2, 1) and their mixes
        assert np.array_equal(_kernel.rows(q[:m], x, metric), expected[:m]), m


@pytest.mark.parametrize("backend", ["faiss", "memory"])
@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_two_stores_of_one_backend_each_keep_their_own_kernel(tmp_path, backend, metric):
    fixed = filled(backend, metric, tmp_path / "a", kernel="fixed")
    other = filled(backend, metric, tmp_path / "b", kernel=FALLBACK[backend])
    q = np.random.default_rng(13).standard_normal((3, DIM)).astype(np.float32)
    x = fixed.fetch("m", np.arange(ROWS))
    dtype = np.float32 if backend == "faiss" else np.float64
    want = fixed_order(q.astype(dtype), x.astype(dtype), metric if backend == "faiss" else "ip")
    if backend == "faiss" and metric == "ip":
        want = -want
    got = fixed.search("m", q).dists
    if backend == "memory":  # memory decodes l2 from its products (|x|^2 + |q|^2 - 2 q.x)
        x64, q64 = x.astype(np.float64), q.astype(np.float64)
        norms, q2 = np.einsum("ij,ij->i", x64, x64), np.einsum("ij,ij->i", q64, q64)
        want = -want if metric == "ip" else np.maximum(norms[None] + q2[:, None] - 2 * want, 0.0)
    plain = other.search("m", q).dists  # the other kernel's sums, between the fixed store's searches
    assert np.array_equal(fixed.search("m", q).dists, got) and np.array_equal(got, want)
    assert fixed.kernel == "fixed" and other.kernel == FALLBACK[backend]
    assert fixed.stats()["m"]["kernel"] == "fixed" and other.stats()["m"]["kernel"] == FALLBACK[backend]
    assert not np.array_equal(plain, got) or backend == "memory"  # FAISS's lane sums round otherwise than in order


@pytest.mark.parametrize("backend", ["faiss", "memory"])
@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_a_failed_check_falls_back_to_a_query_at_a_time(tmp_path, monkeypatch, backend, metric):
    monkeypatch.setattr(_product, "check", lambda x: False)
    store = filled(backend, metric, tmp_path)
    assert_rows_are_each_alone(store)
    assert_rows_are_each_alone(store, k=7)
    assert store.stats()["m"]["kernel"] == FALLBACK[backend]


@pytest.mark.parametrize("backend", ["faiss", "memory"])
def test_a_passed_check_takes_one_product_for_every_query_count_one_included(tmp_path, monkeypatch, backend):
    """Whatever this CPU's BLAS does: a product invariant by construction (a query at a time) passes the check, and
    the store then runs it for one query as for many."""
    calls = []

    def one_at_a_time(q, x, out):
        calls.append(len(q))
        out[:] = np.stack([x @ row for row in q])
        return out

    monkeypatch.setattr(_product, "by_calls", one_at_a_time)
    store = filled(backend, "ip", tmp_path)
    assert store.search("m", np.ones((1, DIM), np.float32)).dists.shape == (1, ROWS)
    assert calls and store.stats()["m"]["kernel"] == "blas" and all(_product.VERDICTS.values())
    calls.clear()
    assert_rows_are_each_alone(store)
    assert 1 in calls and max(COUNTS) in calls  # one query and many went through the product


def test_the_check_fails_a_product_whose_rows_depend_on_the_others(monkeypatch):
    x = np.random.default_rng(7).standard_normal((300, DIM)).astype(np.float32)
    assert _product.check(x) == _product.holds(x)  # the verdict is the check's, remembered
    plain = _product.by_calls

    def crowded(q, x, out):  # the last bit of every sum moves once a call holds more than two queries
        plain(q, x, out)
        if len(q) > 2:
            out *= np.float32(1 + 2**-20)
        return out

    monkeypatch.setattr(_product, "by_calls", crowded)
    assert not _product.check(x)


@pytest.mark.parametrize("rows", [5, 64, 1000, 1100, 2048 + 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_product_is_q_times_each_row(rows, dtype):
    rng = np.random.default_rng(8)
    x, q = rng.standard_normal((rows, 65)).astype(dtype), rng.standard_normal((70, 65)).astype(dtype)
    got, exact = _product.product(q, x), q.astype(np.float64) @ x.astype(np.float64).T
    bound = 70 * np.finfo(dtype).eps * np.abs(q) @ np.abs(x).T  # a sum of 65 products, in any order
    assert got.dtype == dtype and got.shape == (70, rows) and np.all(np.abs(got - exact) <= bound)


def test_the_ladder_covers_every_count_and_each_call_size_is_checked():
    assert [_product.call_size(m) for m in (1, 2, 3, 17, 64)] == [2, 2, 4, 24, 64]
    assert set(_product.LADDER) <= set(_product.CHECKED)


@pytest.mark.parametrize("backend", ["faiss", "memory"])
def test_an_unknown_kernel_is_refused_in_one_line(tmp_path, backend):
    with pytest.raises(VecgptError, match=r"^\S+: kernel 'fast' is not one of .*set \[store\] kernel") as e:
        MODULES[backend].connect(str(tmp_path), kernel="fast")
    assert "\n" not in str(e.value)


def test_faiss_without_invariance_takes_its_own_blas_search(tmp_path):
    store = filled("faiss", "ip", tmp_path, invariant=False)
    q = np.random.default_rng(9).standard_normal((16, DIM)).astype(np.float32)
    hits = store.search("m", q)
    exact = -(q.astype(np.float64) @ store.fetch("m", np.arange(ROWS)).astype(np.float64).T)
    assert np.allclose(hits.dists, exact, rtol=0, atol=1e-3) and store.stats()["m"]["kernel"] == "faiss"
    store.search("m", q[:1])
    assert store.stats()["m"]["kernel"] == "scan"  # one query: FAISS's one-query kernel


@pytest.mark.parametrize("backend", ["faiss", "memory"])
def test_the_default_kernel_is_the_fixed_order_one(tmp_path, backend):
    store = filled(backend, "ip", tmp_path, kernel=None)
    store.search("m", np.ones((3, DIM), np.float32))
    assert store.stats()["m"]["kernel"] == store.kernel == DEFAULT[backend] and not _product.VERDICTS
