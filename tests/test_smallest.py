"""The in-process stores' top-k (backends._smallest): each row's k smallest, smallest first, ties to the lowest
column, NaN last, as a full sort says, whatever the values (ties, infinities, NaN, rows sorted against it)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vecgpt.backends._smallest import smallest


def full_sort(d: np.ndarray, k: int) -> np.ndarray:
    return np.lexsort((np.broadcast_to(np.arange(d.shape[1]), d.shape), d), axis=1)[:, :k]


FEW = st.sampled_from([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan])


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=400), elements=FEW),
    st.integers(1, 450),
)
def test_ties_and_non_numbers_go_by_column(d, k):
    assert np.array_equal(smallest(d, k), full_sort(d, k))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 4), st.integers(1, 6000), st.integers(1, 300), st.integers(0, 2**32 - 1), st.booleans())
def test_long_rows_as_a_full_sort(m, n, k, seed, descending):
    rng = np.random.default_rng(seed)
    d = rng.integers(-50, 50, (m, n)).astype(np.float32)  # many ties at the k-th
    if descending:  # the sample's bound then passes the most entries
        d = -np.sort(d, axis=1)
    assert np.array_equal(smallest(d, k), full_sort(d, k))


def test_the_token_search_shape():
    d = np.random.default_rng(0).standard_normal((16, 50257)).astype(np.float32)
    got = smallest(d, 40)
    assert got.shape == (16, 40)
    assert np.array_equal(got, full_sort(d, 40))
