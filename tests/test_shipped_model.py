"""The Shakespeare model that ships with vecgpt: it loads, it is the file we trained, and every
store decodes it exactly as numpy does."""

import hashlib

import numpy as np
import pytest

from vecgpt import tokenizer, weights
from vecgpt.api import generate
from vecgpt.engine import Engine, push
from vecgpt.reference import Reference

SHA256 = "8a097563400749aaf62f05b6c8702291cfe84999b771ada91017a5deba4760eb"
FINGERPRINT = "9404d1cf43f47481"
PROMPTS = ["ROMEO:", "To be, or not", "First Citizen:\n"]


@pytest.fixture(scope="module")
def shipped():
    return weights.load(None)


@pytest.fixture(scope="module")
def reference_tokens(shipped):
    ref = weights.load(None, dtype=np.float64)
    return {p: generate(Reference(ref, np.float64), tokenizer.encode(p), 32, stop=False).tokens for p in PROMPTS}


def test_shipped_file_is_the_trained_one(shipped):
    path = weights.SHIPPED / "shakespeare" / "model.safetensors"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256
    assert path.stat().st_size <= 16 * 2**20
    assert shipped.fingerprint == FINGERPRINT
    assert shipped.hparams == weights.HParams(n_layer=4, n_head=4, n_embd=128, n_ctx=256, n_vocab=50257)


def test_greedy_through_every_store_equals_numpy(make_store, backend, shipped, reference_tokens):
    store = make_store(backend)
    push(store, shipped, "l2", progress=False)
    engine = Engine(store)
    for prompt in PROMPTS:
        text = engine.open()
        assert generate(text, tokenizer.encode(prompt), 32, stop=False).tokens == reference_tokens[prompt], prompt
        text.close()
