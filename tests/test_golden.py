"""numpy's reference is GPT-2: its logits for the shipped model against golden ones that Hugging Face
transformers' GPT2LMHeadModel produced (scripts/make_golden.py; no transformers needed here).

Tolerance, derived as for a store by vecgpt.tolerance: every multiply is a plain dot product (the
bias one more term: the "ip" bound, no float32 storage of the vectors), summed in any order.
transformers ran in float64 (scripts/make_golden.py), so numpy float64 gets the float64 bound
(u = 2^-53) and, to within ~1e-12, must be the same function: a GELU of the erf form (2.8e-3 away
here) or any wrong layer would fail. numpy float32 gets the float32 bound (u = 2^-24); its
elementwise steps (layer norm, GELU, softmax, residual adds) add a few roundings of each value,
small beside dot products of 128 to 512 terms, and within the tolerance's safety factor.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from vecgpt import tolerance, weights
from vecgpt.reference import Reference
from vecgpt.sampling import Candidates

GOLDEN = json.loads((Path(__file__).parent / "golden" / "shakespeare_transformers.json").read_text())


@pytest.fixture(scope="module")
def model64():
    return weights.load(None, dtype=np.float64)


def test_golden_file_is_for_the_shipped_model():
    path = weights.SHIPPED / "shakespeare" / "model.safetensors"
    import hashlib

    assert hashlib.sha256(path.read_bytes()).hexdigest() == GOLDEN["sha256"]
    assert "transformers" in GOLDEN["produced_by"] and "torch" in GOLDEN["produced_by"]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", GOLDEN["prompts"], ids=lambda c: c["prompt"][:12])
def test_reference_logits_equal_transformers(case, dtype, model64):
    u = tolerance.U64 if dtype == np.float64 else tolerance.U32
    _, tol = tolerance.block_tolerance(model64, case["ids"], "ip", u, stored=0.0)
    model = model64 if dtype == np.float64 else weights.load(None)
    ours = Reference(model, dtype).logits(case["ids"]).astype(np.float64)  # [positions, vocab]
    worst = 0.0
    for pos, (ids, logits) in enumerate(zip(case["top_ids"], case["top_logits"])):
        golden = Candidates(np.array(ids), np.array(logits))
        broken = tolerance.disagreements(golden, ours[pos], GOLDEN["top_k"], tol[pos])
        assert not broken, (pos, broken[:5])
        worst = max(worst, tolerance.max_error(golden, ours[pos]))
    print(f"{case['prompt'][:12]!r} {np.dtype(dtype).name}: tol {tol.min():.2e}..{tol.max():.2e}, error {worst:.2e}")
