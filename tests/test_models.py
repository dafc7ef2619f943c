"""Many models in one store, on every backend: filed by store fingerprint, side by side, none touching another."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vecgpt import tokenizer, tolerance, weights
from vecgpt.api import generate
from vecgpt.backends.base import one_process
from vecgpt.config import load_config
from vecgpt.engine import Engine
from vecgpt.errors import VecgptError
from vecgpt.loading import drop, drop_old_layout, models, push, store_fingerprint
from vecgpt.reference import Reference

from conftest import SLOW, TINY, store_options, tiny_params

PROMPT = tokenizer.encode("Hello world")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def second_model_dir(tmp_path_factory):
    return weights.save(tmp_path_factory.mktemp("second"), TINY, tiny_params(TINY, seed=7))


@pytest.fixture(scope="module")
def models64(tiny_model_dir, second_model_dir):
    return [weights.load(str(d), dtype=np.float64) for d in (tiny_model_dir, second_model_dir)]


def offered(store, metrics=("l2", "ip")) -> list[str]:
    return [m for m in metrics if m in store.metrics]


def agrees_with_numpy(engine, model64, backend, metric) -> list[str]:
    greedy = generate(Reference(model64, np.float64), PROMPT, 4, stop=False).tokens
    text = engine.open()
    try:
        r = tolerance.forced_comparison(text, model64, PROMPT, greedy, metric, tolerance.unit_roundoff(backend))
    finally:
        text.close()
    return r["violations"]


def test_two_models_in_both_encodings_side_by_side(make_store, backend, models64):
    store = make_store(backend)
    loaded = [(m, metric) for metric in offered(store) for m in models64]
    if backend in SLOW:  # conftest.SLOW: each model in one encoding, the two encodings still side by side
        loaded = [(m, offered(store)[i % len(offered(store))]) for i, m in enumerate(models64)]
    for m, metric in loaded:
        push(store, m, metric, progress=False)
    keys = [store_fingerprint(m, metric) for m, metric in loaded]
    assert sorted(x["fingerprint"] for x in models(store)) == sorted(keys)
    assert all(x["bytes"] > 0 and x["documents"] > 0 and x["loaded_at"] for x in models(store))
    for (m, metric), key in zip(loaded, keys):
        assert not agrees_with_numpy(Engine(store, model=key), m, backend, metric), (key, metric)
    with pytest.raises(VecgptError, match="name one"):
        Engine(store)


class Greedy:
    """A text that read the prompt; `take(n)` appends n greedy tokens, reading each."""

    def __init__(self, text):
        self.text, self.cands = text, text.read(PROMPT)

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            out.append(int(self.cands[0][0]))
            self.cands = self.text.read(out[-1:])
        return out


def test_another_models_load_and_drop_leave_a_text_unchanged(make_store, backend, models64):
    a, b = models64
    metric = "l2"  # every store ranks by it
    store, other = make_store.loaded(backend, a, metric), make_store(backend)  # `other`: as another process would
    alone = Engine(store).open()
    expected = Greedy(alone).take(6)
    alone.close()
    text = Engine(store, model=store_fingerprint(a, metric)).open()
    reader = Greedy(text)
    got = reader.take(2)
    push(other, b, metric, progress=False)
    got += reader.take(2)
    drop(other, store_fingerprint(b, metric))
    got += reader.take(2)
    text.close()
    assert got == expected
    assert [x["fingerprint"] for x in models(other)] == [store_fingerprint(a, metric)]


def test_dropping_a_texts_model_stops_it_in_one_line(make_store, backend, tiny_model):
    metric = "l2"  # every store ranks by it
    store, other = make_store.loaded(backend, tiny_model, metric), make_store(backend)
    text = Engine(store).open()
    first = text.read(PROMPT)
    drop(other, store_fingerprint(tiny_model, metric))
    with pytest.raises(VecgptError, match="was dropped") as e:
        text.read([int(first[0][0])])
    assert "\n" not in str(e.value)
    text.close()
    assert models(other) == []


def test_a_store_in_the_previous_layout_is_refused_until_its_collections_go(make_store, backend, tiny_model):
    store = make_store(backend)
    metric = offered(store)[0]
    store.create("wte", 8, metric, attrs=("row",))  # what the previous layout named a model's token table
    for attempt in (
        lambda: push(store, tiny_model, metric, progress=False),
        lambda: models(store),
        lambda: Engine(store),
    ):
        with pytest.raises(VecgptError, match="previous layout.*drop --old-layout"):
            attempt()
    assert drop_old_layout(store) == ["wte"]
    push(store, tiny_model, metric, progress=False)
    assert [x["source"] for x in models(store)] == [tiny_model.source]


def test_two_processes_loading_two_models_at_once_both_land_whole(
    make_store, backend, tmp_path, tiny_model_dir, second_model_dir, models64
):
    options = store_options(backend, tmp_path)
    config = tmp_path / "s.toml"
    config.write_text(
        f'backend = "{backend}"\n[store]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())
    )
    loads = [
        subprocess.Popen(
            [sys.executable, "-m", "vecgpt", "load", "--config", str(config), "--model", str(d)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for d in (tiny_model_dir, second_model_dir)
    ]
    landed = []
    for proc, m in zip(loads, models64):
        _, err = proc.communicate(timeout=300)
        if proc.returncode and one_process(backend, options):  # the file is the other load's: one line says so
            assert "open in another process" in err.strip().splitlines()[-1], err
            continue
        assert proc.returncode == 0, err
        landed.append(m)
    assert landed, "neither load landed"
    store, loaded = make_store(backend), load_config(config)  # the backend's default encoding and layout
    keys = [store_fingerprint(m, loaded.metric, loaded.layout) for m in landed]
    assert sorted(x["fingerprint"] for x in models(store)) == sorted(keys)  # each whole, or not there
    for m, key in zip(landed, keys):
        assert not agrees_with_numpy(Engine(store, model=key), m, backend, loaded.metric), key


def test_store_option_sets_each_backends_location():
    from vecgpt.backends.base import available, location_key

    wanted = {"memory": "path", "faiss": "path", "lancedb": "path", "pgvector": "schema", "turbopuffer": "prefix"}
    assert {b: location_key(b) for b in wanted if b in available()} == {
        b: k for b, k in wanted.items() if b in available()
    }
