"""The numpy reference: cache consistency, dtypes, sampling rules, and (optionally) transformers."""

import numpy as np
import pytest

from vecgpt import sampling
from vecgpt.api import generate
from vecgpt.reference import Reference, gelu


def test_kv_cache_equals_full_recompute(tiny_model):
    ids = [464, 2068, 7586, 21831, 18045, 625, 262]
    full = Reference(tiny_model, np.float64).logits(ids)
    ref = Reference(tiny_model, np.float64)
    step = np.vstack([ref.logits(ids[:3])[-1:]] + [ref.logits([i]) for i in ids[3:]])
    np.testing.assert_allclose(step[-1], full[-1], atol=1e-10)


def test_float32_stays_float32_and_near_float64(tiny_model):
    l32 = Reference(tiny_model, np.float32).logits([1, 2, 3])
    l64 = Reference(tiny_model, np.float64).logits([1, 2, 3])
    assert l32.dtype == np.float32
    np.testing.assert_allclose(l32, l64, atol=1e-4)


def test_gelu_is_the_tanh_form():
    # gelu_new(1) = 0.841192; the erf form would give 0.841345
    np.testing.assert_allclose(gelu(np.array([1.0, 0.0, -3.0])), [0.8411920, 0.0, -0.0036374], atol=1e-7)


def test_greedy_ties_go_to_lowest_id():
    logits = np.array([0.1, 0.5, 0.3, 0.5, 0.5])
    c = sampling.top_k(logits, 3)
    assert list(c.ids) == [1, 3, 4]
    assert sampling.choose(c, 0.0, 3, None) == 1


def test_sampling_is_inverse_cdf_over_top_k():
    c = sampling.top_k(np.log(np.array([0.1, 0.2, 0.3, 0.4])), 2)  # ids 3, 2 with p 4/7, 3/7
    u = [sampling.draw(7, p) for p in range(400)]
    draws = [sampling.choose(c, 1.0, 2, x) for x in u]
    assert len(set(u)) == 400 and all(0 <= x < 1 for x in u)
    assert draws == [3 if x < 4 / 7 else 2 for x in u]


def test_generation_stops_at_endoftext(tiny_model):
    class Always:
        def read(self, ids, k):
            return sampling.Candidates(np.array([50256, 1]), np.array([1.0, 0.0]))

    assert generate(Always(), [1], 5).tokens == [50256]
    assert generate(Always(), [1], 5, stop=False).tokens == [50256] * 5


def test_matches_transformers_if_installed(tiny_model_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from vecgpt.weights import load

    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tiny_model_dir)).eval()
    ids = [15496, 995, 11, 314, 716]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].double().numpy()
    got = Reference(load(str(tiny_model_dir), dtype=np.float64), np.float64).logits(ids)
    np.testing.assert_allclose(got, want, atol=1e-3)
