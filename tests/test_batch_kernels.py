"""Batch invariance with each kernel, on the shipped FAISS config (configs/faiss.toml: inner product) and memory's:
a text's every logit (k = the vocabulary), every step, in a batch of 5 texts stepped together is bit for bit the one
it computes alone (tests/test_batch.py runs the l2 encoding with each store's default kernel)."""

from __future__ import annotations

import numpy as np
import pytest
import test_batch as batch

from vecgpt.config import load_config, open_store
from vecgpt.engine import Engine
from vecgpt.loading import push, store_fingerprint

pytest.importorskip("faiss")

KERNELS = [("faiss", "scan"), ("faiss", "fixed"), ("faiss", "blas"), ("memory", "gemv"), ("memory", "fixed")]


@pytest.mark.parametrize(("backend", "kernel"), KERNELS, ids=[f"{b}-{k}" for b, k in KERNELS])
def test_a_batch_gives_each_text_its_bits_alone_with_each_kernel(tmp_path, tiny_model, backend, kernel):
    config = load_config(f"configs/{backend}.toml")
    config.store.update(path=str(tmp_path), kernel=kernel)
    store = open_store(config)
    assert store.kernel == kernel
    push(store, tiny_model, config.metric, progress=False, layout=config.layout)
    engine = Engine(store, model=store_fingerprint(tiny_model, config.metric, config.layout))
    parts, k = batch.BATCHES[5], engine.hparams.n_vocab
    solo = [batch.alone(engine, part, k) for part in parts]
    got, _ = batch.together(engine, parts, k)
    for i, (want, have) in enumerate(zip(solo, got)):
        batch.same_bits(want, have, f"{backend} {config.metric} {kernel}, text {i}")
    ran = {s.get("kernel") for s in store.stats().values()} - {None}
    assert ran <= {kernel, "scan"} and (kernel in ran or kernel == "blas")  # blas: a shape may fail its check
    assert np.isfinite(got[0][0].logits).all()


def test_a_text_records_its_kernel_and_resumes_only_on_it(tmp_path, tiny_model):
    """A kept text computed with one kernel is refused in one line by a store running another (its bits would
    change), and continues on a store running the one it began with."""
    from vecgpt.backends.base import get_store
    from vecgpt.errors import VecgptError
    from vecgpt.loading import push
    from vecgpt.text import Text

    path = str(tmp_path / "faiss")
    store = get_store("faiss", path=path, kernel="scan")
    key = push(store, tiny_model, "ip", progress=False, layout="five")["fingerprint"]
    text = Text.start(Engine(store, model=key), [15496, 995])
    text.generate(2)
    text_id = text.keep()
    assert text.settings["kernel"] == "scan"
    store.close()
    other = get_store("faiss", path=path, kernel="fixed")
    with pytest.raises(VecgptError, match=r"computed with the 'scan' kernel .* kernel = \"scan\""):
        Text.resume(Engine(other, model=key), text_id)
    other.close()
    same = get_store("faiss", path=path, kernel="scan")
    assert Text.resume(Engine(same, model=key), text_id).tokens == text.tokens
