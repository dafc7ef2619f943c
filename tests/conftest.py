"""Shared fixtures: a tiny random GPT-2 with the full vocabulary, and a store of each backend.

A backend whose tests need a server (pgvector, turbopuffer) has a module tests/setup_<backend>.py
with `options(tmp_path) -> dict` giving its connect() arguments; it starts the server once per
run and stops it at exit. Other backends get a fresh path.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil

import numpy as np
import pytest

from vecgpt import weights
from vecgpt.backends.base import available, get_store
from vecgpt.loading import push

pytest_plugins = ["browser"]  # the browser tests' fixtures: chromium, a page, a playground server

LIBRARIES = {
    "faiss": "faiss",
    "lancedb": "lancedb",
    "pgvector": "psycopg",
    "turbopuffer": "turbopuffer",
    "milvus": "pymilvus",
    "sqlite": "sqlite_vec",
    "duckdb": "duckdb",
}
BACKENDS = available()
SLOW = {"milvus"}  # Milvus Lite reads a token in about 0.3 s, 15x FAISS: long runs are shortened there
# Stores in a folder or a file: a model pushed there once a run is copied for each test that needs it loaded (the
# tiny model's push takes 2-5 s on Milvus Lite, LanceDB, SQLite and DuckDB, a copy under 0.2 s)
COPIED = {"memory", "faiss", "lancedb", "milvus", "sqlite", "duckdb"}


def store_options(backend: str, tmp_path) -> dict:
    lib = LIBRARIES.get(backend)
    if lib and importlib.util.find_spec(lib) is None:
        pytest.skip(f"{backend} needs {lib}: pip install 'vecgpt[{backend}]'")
    try:
        setup = importlib.import_module(f"setup_{backend}")
    except ModuleNotFoundError:
        return {"path": str(tmp_path / backend)}
    return setup.options(tmp_path)


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


class Pushed:
    """The run's one push of a model to each store in a folder or a file (COPIED), copied for each test that needs it
    loaded: a copy takes under 0.2 s, the tiny model's push 2-5 s on Milvus Lite, LanceDB, SQLite and DuckDB."""

    def __init__(self, tmp_path_factory):
        self.factory, self.templates = tmp_path_factory, {}

    def copy_to(self, path: str | None, backend: str, model, metric: str, layout: str | None) -> None:
        """The store at `path` (none there yet) starts as a copy of one holding `model` in `metric` and `layout`."""
        if backend not in COPIED or path is None or os.path.exists(path):
            return
        key = (backend, model.fingerprint, model.source, str(model.dtype), metric, layout)
        if key not in self.templates:
            folder = self.factory.mktemp("pushed")
            store = get_store(backend, **store_options(backend, folder))
            try:
                refuse_metric(store, backend, metric)
                push(store, model, metric, progress=False, layout=layout)
            finally:
                store.close()
            self.templates[key] = folder / backend
        (shutil.copytree if self.templates[key].is_dir() else shutil.copyfile)(self.templates[key], path)


@pytest.fixture(scope="session")
def pushed(tmp_path_factory) -> Pushed:
    return Pushed(tmp_path_factory)


@pytest.fixture
def make_store(tmp_path, pushed):
    """make(backend, **extra): a store of the test's own; make.loaded(backend, model, metric, layout): one holding
    `model` pushed in `metric` and `layout` (push's defaults where None; a copy, see Pushed), skipped where it does not
    rank by `metric`."""
    opened = []

    def make(backend: str, **extra):
        store = get_store(backend, **{**store_options(backend, tmp_path), **extra})
        opened.append(store)
        return store

    def loaded(backend: str, model, metric: str = "l2", layout: str | None = None):
        pushed.copy_to(store_options(backend, tmp_path).get("path"), backend, model, metric, layout)
        store = make(backend)
        refuse_metric(store, backend, metric)
        push(store, model, metric, progress=False, layout=layout)  # at once where the copy holds it
        return store

    make.loaded = loaded
    yield make
    for store in opened:
        store.close()


def refuse_metric(store, backend: str, metric: str) -> None:
    if metric not in store.metrics:
        pytest.skip(f"{backend} does not rank by {metric}")


def tiny_params(hp: weights.HParams, seed: int = 0) -> dict:
    """GPT-2-shaped random weights, scaled up and with non-trivial layer norms, so text varies."""
    rng = np.random.default_rng(seed + 1)
    params = weights.make_params(hp, seed)
    for name, value in weights.flatten(params).items():
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            value += rng.normal(0, 0.2, value.shape).astype(np.float32)
        elif name.endswith(("ln_1.bias", "ln_2.bias", "ln_f.bias")):
            value += rng.normal(0, 0.1, value.shape).astype(np.float32)
        elif "attn" in name or "mlp" in name:
            value *= 6  # larger products: attention that is not uniform, MLPs that matter
    return params


TINY = weights.HParams(n_layer=2, n_head=4, n_embd=64, n_ctx=64, n_vocab=50257)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    return weights.save(out, TINY, tiny_params(TINY))


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    return weights.load(str(tiny_model_dir))


@pytest.fixture(scope="session")
def model64(tiny_model_dir):
    """The tiny model in float64: what the stores' results are checked against."""
    return weights.load(str(tiny_model_dir), dtype=np.float64)
