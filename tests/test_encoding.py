"""The encoding identity: distances to padded documents give back w.x + b."""

import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vecgpt import encoding


def l2(q, d):
    q, d = q.astype(np.float64), d.astype(np.float64)
    return ((q[:, None, :] - d[None]) ** 2).sum(-1)


@st.composite
def problems(draw):
    n_in, n_out, m = draw(st.integers(1, 40)), draw(st.integers(1, 30)), draw(st.integers(1, 4))
    seed, scale = draw(st.integers(0, 2**32 - 1)), draw(st.sampled_from([1e-3, 1.0, 30.0, 1e3]))
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n_in, n_out)) * scale).astype(np.float32)
    w[:, 0] *= draw(st.sampled_from([1.0, 100.0]))  # one row of a much larger norm
    b = (rng.standard_normal(n_out) * scale).astype(np.float32)
    x = rng.standard_normal((m, n_in)).astype(np.float32)
    return w, b, x


@settings(max_examples=200, deadline=None)
@given(problems())
def test_l2_identity_recovers_outputs(problem):
    w, b, x = problem
    docs, m2 = encoding.encode_rows(w, b, "l2")
    q = encoding.encode_queries(x, "l2")
    assert docs.shape == (w.shape[1], w.shape[0] + 2) and q.shape == (len(x), w.shape[0] + 2)
    y = encoding.decode_dists(l2(q, docs), q, m2, "l2")
    exact = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
    # float64 distances; the only loss is the pad rounded to float32: ~6e-8 * M^2
    np.testing.assert_allclose(y, exact, rtol=0, atol=1e-6 * (m2 + 1))


@settings(max_examples=200, deadline=None)
@given(problems())
def test_every_document_has_length_m(problem):
    w, b, _ = problem
    docs, m2 = encoding.encode_rows(w, b, "l2")
    norms2 = (docs.astype(np.float64) ** 2).sum(1)
    np.testing.assert_allclose(norms2, m2, rtol=1e-6)
    assert np.isclose(norms2.max(), m2, rtol=1e-6)  # M is the largest row norm: one pad is zero
    assert np.min(docs[:, -1]) >= 0


@settings(max_examples=100, deadline=None)
@given(problems())
def test_ip_identity_recovers_outputs(problem):
    w, b, x = problem
    docs, _ = encoding.encode_rows(w, b, "ip")
    q = encoding.encode_queries(x, "ip")
    y = encoding.decode_dists(-(q.astype(np.float64) @ docs.astype(np.float64).T), q, 0.0, "ip")
    exact = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
    np.testing.assert_allclose(y, exact, rtol=1e-9, atol=1e-9 * np.abs(exact).max())


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 16), st.integers(1, 20), st.integers(0, 2**32 - 1))
def test_key_identity(hd, n, seed):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((3, hd)).astype(np.float32), rng.standard_normal((n, hd)).astype(np.float32)
    dots = encoding.decode_key_dists(l2(q, k), q, encoding.squared_norms(k), "l2")
    np.testing.assert_allclose(dots, q.astype(np.float64) @ k.astype(np.float64).T, atol=1e-9)


def test_top_k_by_distance_is_top_k_by_output():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 500)).astype(np.float32) * rng.uniform(0.1, 10, 500).astype(np.float32)
    b = rng.standard_normal(500).astype(np.float32)
    x = rng.standard_normal((1, 16)).astype(np.float32)
    docs, _ = encoding.encode_rows(w, b, "l2")
    by_dist = np.argsort(l2(encoding.encode_queries(x, "l2"), docs)[0])[:10]
    by_output = np.argsort(-(x.astype(np.float64) @ w + b)[0])[:10]
    assert list(by_dist) == list(by_output)


def test_float32_cancellation_is_bounded_as_documented():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 200)).astype(np.float32)
    x = (rng.standard_normal((1, 64)) * 5).astype(np.float32)
    docs, m2 = encoding.encode_rows(w, None, "l2")
    q = encoding.encode_queries(x, "l2")
    d32 = l2(q, docs).astype(np.float32)  # what a float32 store returns
    err = np.abs(encoding.decode_dists(d32, q, m2, "l2") - x.astype(np.float64) @ w).max()
    bound = 6e-8 * (m2 + encoding.squared_norms(q)[0])
    assert err <= bound and err > 0


def sequential32(q, d):  # float32 distances summed in plain sequential order: the worst plausible store
    terms = (np.asarray(q, np.float32)[:, None, :] - np.asarray(d, np.float32)[None]) ** 2
    return np.cumsum(terms, -1, dtype=np.float32)[..., -1]


@settings(max_examples=100, deadline=None)
@given(problems(), st.sampled_from([1e-3, 1.0, 1e3]))
def test_scaled_queries_decode_within_the_derived_bound(problem, x_scale):
    w, b, x = problem
    x = (x * x_scale).astype(np.float32)
    docs, m2 = encoding.encode_rows(w, b, "l2")
    q = encoding.encode_queries(x, "l2", m2)
    s = encoding.query_scale(q, "l2")
    assert np.all(np.log2(s) == np.round(np.log2(s)))  # a power of two: q is x scaled exactly
    np.testing.assert_array_equal(q[:, :-2] / s[:, None].astype(np.float32), x)
    exact = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
    bound = encoding.search_bound(x, m2, "l2", encoding.U32)[:, None]
    assert np.all(np.abs(encoding.decode_dists(sequential32(q, docs), q, m2, "l2") - exact) <= bound)
    assert np.all(
        np.abs(encoding.decode_dists(l2(q, docs), q, m2, "l2") - exact)
        <= encoding.search_bound(x, m2, "l2", encoding.U64)[:, None]
    )


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 64), st.integers(1, 20), st.integers(0, 2**32 - 1), st.sampled_from([1e-2, 1.0, 1e2]))
def test_scaled_key_queries_decode_within_the_derived_bound(hd, n, seed, q_scale):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((3, hd)) * q_scale).astype(np.float32)
    k = rng.standard_normal((n, hd)).astype(np.float32)
    norms2 = encoding.squared_norms(k)
    qs, s = encoding.key_queries(q, norms2, "l2")
    dots = encoding.decode_key_dists(sequential32(qs, k), qs, norms2, "l2", s)
    exact = q.astype(np.float64) @ k.astype(np.float64).T
    assert np.all(np.abs(dots - exact) <= encoding.key_bound(q, norms2, "l2", encoding.U32))


def test_a_matrix_encoded_a_block_of_rows_at_a_time_is_the_whole_matrix_bit_for_bit(monkeypatch):
    """A load encodes a batch of rows at a time (encode_block) after M^2 from blocks of rows (largest_norm2): the
    documents and M^2 are those of the matrix encoded whole, in both encodings, with and without a bias."""
    monkeypatch.setattr(encoding, "BLOCK_BYTES", 7 * 8 * 50)  # 7 rows of 48 + 2
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((48, 61)) * rng.uniform(0.1, 30.0, 61)).astype(np.float32)  # rows of many norms
    b = rng.standard_normal(61).astype(np.float32)
    for bias in (b, None):
        w64 = w.T.astype(np.float64)
        b64 = np.zeros(61) if bias is None else b.astype(np.float64)
        m2 = encoding.largest_norm2(w, bias)
        assert m2 == float((np.einsum("ij,ij->i", w64, w64) + b64 * b64).max())
        for metric in ("l2", "ip"):
            whole, whole_m2 = encoding.encode_rows(w, bias, metric)
            blocks = [encoding.encode_block(w, bias, metric, m2, slice(a, a + 5)) for a in range(0, 61, 5)]
            assert whole_m2 == m2 and np.array_equal(np.vstack(blocks), whole)
            assert whole.shape == (61, encoding.doc_dim(48, metric)) and whole.dtype == np.float32
    assert [(s.start, s.stop) for s in encoding.blocks(w, slice(10, 30))] == [(10, 17), (17, 24), (24, 30)]


def nearest_power(t: float, n: float) -> float:
    """2^k for the integer k nearest log2(r), r = t / n as a double, decided in exact rational arithmetic."""
    r = Fraction(t / n)
    e = math.frexp(t / n)[1]  # 2^(e-1) <= r < 2^e
    k = e if r * r >= Fraction(2) ** (2 * e - 1) else e - 1  # log2 r >= e - 1/2
    return 2.0 ** min(max(k, -60), 60)


near_boundary = st.builds(
    lambda k, ulps: math.ldexp(encoding.SQRT_HALF, k) + ulps * math.ulp(math.ldexp(encoding.SQRT_HALF, k)),
    st.integers(-50, 50),
    st.integers(-3, 3),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.floats(1e-30, 1e30), near_boundary), min_size=1, max_size=8),
    st.floats(1e-3, 1e3) | st.just(1.0),
)
def test_power_of_two_is_the_nearest_in_log2_one_value_or_many(targets, norm):
    want = [nearest_power(t, norm) for t in targets]
    assert encoding.power_of_two(np.array(targets), norm).tolist() == want  # numpy's path
    assert [encoding.power_of_two(t, np.array([norm]))[0] for t in targets] == want  # one value: Python's
    assert encoding.power_of_two(np.array(targets)[:, None], np.array([norm])).shape == (len(targets), 1)


def test_power_of_two_is_one_where_either_is_zero_or_not_finite_and_clipped_beyond_2_to_60():
    bad = [0.0, math.inf, math.nan, -1.0]
    assert encoding.power_of_two(np.array(bad), 1.0).tolist() == [1.0] * 4
    assert encoding.power_of_two(1.0, np.array(bad)).tolist() == [1.0] * 4
    assert [encoding.power_of_two(x, np.array([1.0]))[0] for x in bad] == [1.0] * 4
    assert encoding.power_of_two(np.array([1e300, 1e-300]), 1.0).tolist() == [2.0**60, 2.0**-60]
    assert encoding.power_of_two(1e-300, np.array([1e300]))[0] == 2.0**-60  # the ratio underflows: still clipped
