"""Streaming attention equals full-table attention; memory accounting; CLI.

Tolerances (eps = machine epsilon of the dtype, V = max |v|, n = number of keys):
  * same scores given to both (RunningSoftmax vs plain softmax, or integer q, k so that
    every score is exact):                  |streaming - reference| <= eps * V * (4 n + 16)
  * general q, k (scores rounded differently by the two matmuls):
        ... + eps * V * 8 (hd + 1) S   with S = max_ij |q_i| |k_j| / sqrt(hd)  (bounds |score|)
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vecgpt import attention as att
from vecgpt import cli as vecgpt_cli

DTYPES = [np.float32, np.float64]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def softmax_tol(v, n_k, dtype):
    return np.finfo(dtype).eps * max(np.abs(v).max(), 1e-30) * (4 * n_k + 16)


def attention_tol(q, k, v, dtype):
    hd = q.shape[-1]
    S = np.linalg.norm(q, axis=-1).max() * np.linalg.norm(k, axis=-1).max() / math.sqrt(hd)
    eps = np.finfo(dtype).eps
    return softmax_tol(v, k.shape[-2], dtype) + eps * np.abs(v).max() * 8 * (hd + 1) * S


shapes = st.fixed_dictionaries(
    dict(
        n_q=st.integers(1, 12),
        n_k=st.integers(1, 40),
        hd=st.integers(1, 24),
        tile=st.integers(1, 12),
        q_offset=st.integers(0, 12),
        causal=st.booleans(),
        heads=st.sampled_from([(), (1,), (3,)]),
        dtype=st.sampled_from(DTYPES),
        scale=st.sampled_from([0.1, 1.0, 4.0]),
        seed=st.integers(0, 2**31),
    )
)


@SETTINGS
@given(shapes)
def test_streaming_equals_full_random_shapes(c):
    rng = np.random.default_rng(c["seed"])
    q = (c["scale"] * rng.standard_normal(c["heads"] + (c["n_q"], c["hd"]))).astype(c["dtype"])
    k = (c["scale"] * rng.standard_normal(c["heads"] + (c["n_k"], c["hd"]))).astype(c["dtype"])
    v = rng.standard_normal(c["heads"] + (c["n_k"], c["hd"])).astype(c["dtype"])
    full = att.full_attention(q, k, v, c["causal"], c["q_offset"])
    stream = att.streaming_attention(q, k, v, c["causal"], c["q_offset"], c["tile"])
    assert stream.dtype == c["dtype"] and stream.shape == full.shape
    assert np.abs(stream - full).max() <= attention_tol(q, k, v, c["dtype"])


@SETTINGS
@given(
    n_q=st.integers(1, 10),
    n_k=st.integers(1, 40),
    hd=st.sampled_from([1, 4, 16, 64]),
    tile=st.integers(1, 9),
    causal=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    size=st.sampled_from([0, 1, 50]),
    seed=st.integers(0, 2**31),
)
def test_streaming_equals_full_exact_extreme_scores(n_q, n_k, hd, tile, causal, dtype, size, seed):
    """Integer q, k and hd a power of 4: every score is exact, up to |score| ~ 1e4 (size 50, hd 16/64).
    size 0 makes every score equal (0)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-size, size + 1, (n_q, hd)).astype(dtype)
    k = rng.integers(-size, size + 1, (n_k, hd)).astype(dtype)
    v = rng.standard_normal((n_k, hd)).astype(dtype)
    off = max(0, n_k - n_q)
    full = att.full_attention(q, k, v, causal, off)
    stream = att.streaming_attention(q, k, v, causal, off, tile)
    assert np.abs(stream - full).max() <= softmax_tol(v, n_k, dtype)


def reference(scores, values, keep):
    """softmax over the kept finite scores of each row, in float64; rows with none give 0."""
    s = np.where(keep, scores.astype(np.float64), -np.inf)
    out = np.zeros((s.shape[0], values.shape[1]))
    rows = np.isfinite(s).any(axis=1)
    out[rows] = att.softmax(s[rows]) @ values.astype(np.float64)
    return out


extreme = st.fixed_dictionaries(
    dict(
        n_q=st.integers(1, 5),
        n=st.integers(1, 30),
        hd=st.integers(1, 8),
        tile=st.integers(1, 10),
        base=st.sampled_from([0.0, 1e4, -1e4, 3e4]),
        spread=st.sampled_from([0.0, 1.0, 1e4]),
        p_mask=st.sampled_from([0.0, 0.3, 0.9]),
        p_neginf=st.sampled_from([0.0, 0.3]),
        dtype=st.sampled_from(DTYPES),
        seed=st.integers(0, 2**31),
    )
)


def extreme_case(c):
    rng = np.random.default_rng(c["seed"])
    scores = (c["base"] + c["spread"] * rng.standard_normal((c["n_q"], c["n"]))).astype(c["dtype"])
    scores[rng.random(scores.shape) < c["p_neginf"]] = -np.inf
    keep = rng.random(scores.shape) >= c["p_mask"]
    values = rng.standard_normal((c["n"], c["hd"])).astype(c["dtype"])
    return scores, values, keep


def fold(scores, values, keep, tile, order=None, dtype=np.float64):
    rs = att.RunningSoftmax(scores.shape[0], values.shape[1], dtype)
    starts = list(range(0, scores.shape[1], tile))
    for j in starts if order is None else [starts[i] for i in order]:
        rs.update(scores[:, j : j + tile], values[j : j + tile], keep[:, j : j + tile])
    return rs.finish()


@SETTINGS
@given(extreme)
def test_running_softmax_extreme_scores_and_masks(c):
    scores, values, keep = extreme_case(c)
    before = scores.copy()
    got = fold(scores, values, keep, c["tile"], dtype=c["dtype"])
    assert np.array_equal(scores, before)  # caller's scores untouched
    assert got.dtype == c["dtype"] and np.isfinite(got).all()
    assert np.abs(got - reference(scores, values, keep)).max() <= softmax_tol(values, c["n"], c["dtype"])


@SETTINGS
@given(extreme, st.randoms(use_true_random=False))
def test_fold_order_independent(c, rnd):
    scores, values, keep = extreme_case(c)
    order = list(range(len(range(0, c["n"], c["tile"]))))
    rnd.shuffle(order)
    in_order = fold(scores, values, keep, c["tile"], dtype=c["dtype"])
    shuffled = fold(scores, values, keep, c["tile"], order, dtype=c["dtype"])
    assert np.abs(in_order - shuffled).max() <= 2 * softmax_tol(values, c["n"], c["dtype"])


def test_all_masked_tile_leaves_state_unchanged():
    rs = att.RunningSoftmax(3, 2)
    rs.update(np.array([[1.0, 2.0], [-np.inf, -np.inf], [5.0, -1.0]]), np.ones((2, 2)))
    state = [a.copy() for a in (rs.m, rs.l, rs.acc)]
    keep = np.array([[False, False], [False, False], [True, False]])
    rs.update(np.array([[9.0, 9.0], [3.0, 4.0], [-2.0, 7.0]]), np.full((2, 2), 3.0), keep)
    for a, b in zip(state, (rs.m, rs.l, rs.acc)):
        assert np.array_equal(a[:2], b[:2])  # rows 0, 1: bit for bit
    assert not np.array_equal(state[1][2], rs.l[2])  # row 2 did fold
    assert np.array_equal(rs.finish()[1], [0.0, 0.0])  # never saw a finite score


def test_decode_equals_full_last_position():
    q, k, v = att.random_qkv(2, 37, 16, 1, np.float64, seed=3)
    full = att.full_attention(q, k, v, causal=True, q_offset=36)[:, 0]
    assert np.abs(att.streaming_decode(q[:, 0], k, v, tile=8) - full).max() <= 1e-13


def test_fused_numba_equals_full():
    pytest.importorskip("numba")
    q, k, v = att.random_qkv(2, 50, 16, 20, np.float64, seed=4)
    for causal in (True, False):
        full = att.full_attention(q, k, v, causal, 30)
        assert np.abs(att.fused_attention(q, k, v, causal, 30, tile=7) - full).max() <= 1e-13


def test_bad_tile():
    q, k, v = att.random_qkv(1, 4, 2, 4, np.float64)
    with pytest.raises(ValueError):
        att.streaming_attention(q, k, v, tile=0)


# ----------------------------------------------------------------------------- memory


def test_memory_bytes_by_hand():
    mb = att.memory_bytes(12, 1024, 64, 1024, 8, "float32")  # GPT-2 small, one layer, prefill
    assert mb["full"] == 12 * 1024 * 1024 * 4 == 50_331_648
    assert mb["streaming"] == 12 * 1024 * (8 + 1 + 1 + 64) * 4 == 3_637_248
    assert mb["ratio"] == pytest.approx(50_331_648 / 3_637_248)
    assert mb["tile_scores"] + mb["running_max"] + mb["running_total"] + mb["accumulator"] == mb["streaming"]
    assert mb["peak_full"] == mb["full"] + 12 * 1024 * 64 * 4
    assert mb["peak_streaming"] == mb["streaming"] + 12 * 1024 * (64 + 3) * 4
    dec = att.memory_bytes(4, 100, 16, 1, 8, np.float64)  # decode: one query
    assert (dec["full"], dec["streaming"]) == (4 * 100 * 8, 4 * (8 + 2 + 16) * 8)
    assert att.memory_bytes(1, 5, 4, 5, 8, "float64")["tile_scores"] == 5 * 5 * 8  # tile capped at context


MARGIN_REL, MARGIN_ABS = 0.01, 96 * 1024  # measured peak within 1% + 96 KiB of the prediction


@pytest.mark.parametrize(
    "case",
    [
        (2, 256, 64, 256, 8, "float64"),
        (4, 1024, 64, 1024, 8, "float32"),
        (3, 300, 32, 100, 7, "float32"),
        (2, 512, 32, 512, 64, "float64"),
    ],
)
def test_tracemalloc_matches_prediction(case):
    mb = att.memory_bytes(*case)
    for form in ("full", "streaming"):
        peak = att.measure(form, *case)["peak"]
        assert abs(peak - mb["peak_" + form]) <= MARGIN_REL * mb["peak_" + form] + MARGIN_ABS, form
    assert att.measure("streaming", *case)["peak"] < mb["full"]  # never holds the table


# ----------------------------------------------------------------------------- walk and CLI


@SETTINGS
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=40), st.integers(1, 6))
def test_walk_weights_equal_plain_softmax(scores, tile):
    steps, weights = att.softmax_walk(scores, tile)
    plain = att.softmax(np.array(scores))
    assert np.abs(weights - plain).max() <= 1e-15 * (4 * len(scores) + 16)
    assert steps[-1]["running_max"] == max(scores) and len(steps) == math.ceil(len(scores) / tile)


def cli(argv, capsys):
    try:
        args = vecgpt_cli.parser(argv[0]).parse_args(argv)
        rc = args.func(args)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_walk(capsys, tmp_path):
    rc, out, _ = cli(["softmax-walk", "2.0", "-1.0", "5.5"], capsys)
    assert rc == 0 and "rescale by" in out and "0.0301974" in out and "max |streaming - plain| = 0" in out
    f = tmp_path / "s.txt"
    f.write_text("1, 2\n3 -inf\n")
    rc, out, _ = cli(["softmax-walk", "--file", str(f), "--tile", "2"], capsys)
    assert rc == 0 and "0-1" in out and "2-3" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["softmax-walk", "1", "x"],
        ["softmax-walk"],
        ["softmax-walk", "--tile", "0", "1"],
        ["softmax-walk", "nan"],
        ["softmax-walk", "--file", "/no/such/file"],
        ["attention-memory", "--context", "0"],
        ["attention-memory", "--tile", "-3"],
    ],
)
def test_cli_bad_input(argv, capsys):
    rc, out, err = cli(argv, capsys)
    assert rc == 2 and "Traceback" not in err and err.strip()


def test_cli_attention_memory(capsys):
    rc, out, _ = cli(["attention-memory", "--heads", "4", "--context", "128", "1024", "8192", "32768"], capsys)
    assert rc == 0
    assert "16,777,216" in out and "1,212,416" in out and "17,179,869,184" in out and "442.8" in out
    rc, out, _ = cli(["attention-memory", "--heads", "2", "--context", "256", "--measure"], capsys)
    assert rc == 0 and "1.00" in out
