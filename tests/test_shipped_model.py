"""The Shakespeare model that ships with vecgpt: it loads, it is the file we trained, and every
store reads it as numpy does, within the derived tolerance (vecgpt.tolerance), teacher-forced on
numpy's greedy tokens."""

import hashlib

import numpy as np
import pytest

from vecgpt import tokenizer, tolerance, weights
from vecgpt.api import generate
from vecgpt.engine import Engine
from vecgpt.loading import push
from vecgpt.reference import Reference

SHA256 = "8a097563400749aaf62f05b6c8702291cfe84999b771ada91017a5deba4760eb"
FINGERPRINT = "9404d1cf43f47481"
PROMPTS = ["ROMEO:", "To be, or not", "First Citizen:\n"]
IN_PROCESS = {"memory", "faiss"}  # every prompt: a token takes milliseconds there


@pytest.fixture(scope="module")
def shipped():
    return weights.load(None)


@pytest.fixture(scope="module")
def model64():
    return weights.load(None, dtype=np.float64)


@pytest.fixture(scope="module")
def reference_tokens(model64):
    return {p: generate(Reference(model64, np.float64), tokenizer.encode(p), 32, stop=False).tokens for p in PROMPTS}


def test_shipped_file_is_the_trained_one(shipped):
    path = weights.SHIPPED / "shakespeare" / "model.safetensors"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256
    assert path.stat().st_size <= 16 * 2**20
    assert shipped.fingerprint == FINGERPRINT
    assert shipped.hparams == weights.HParams(n_layer=4, n_head=4, n_embd=128, n_ctx=256, n_vocab=50257)


def test_every_store_reads_as_numpy(make_store, backend, shipped, model64, reference_tokens):
    store = make_store(backend)
    push(store, shipped, "l2", progress=False)
    engine = Engine(store)
    for prompt in PROMPTS if backend in IN_PROCESS else PROMPTS[:1]:  # a store over a file or a server: one prompt
        text = engine.open()
        r = tolerance.forced_comparison(
            text, model64, tokenizer.encode(prompt), reference_tokens[prompt], "l2", tolerance.unit_roundoff(backend)
        )
        text.close()
        print(
            f"{backend} {prompt!r}: tol {r['tol'].min():.2e}..{r['tol'].max():.2e}, max error {r['max_error'].max():.2e}"
        )
        assert not r["violations"], (prompt, r["violations"][:5])
