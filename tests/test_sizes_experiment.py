"""`vecgpt experiment sizes` end to end at 1/64 scale (two sizes, numpy, memory and FAISS), its exponent fit on
made-up numbers, and its layout costs read back from the estimate."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from vecgpt import weights
from vecgpt.cli import main
from vecgpt.cli.experiments import experiments
from vecgpt.loading import plan

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

sizes = experiments()["sizes"]  # puts experiments/07_sizes on sys.path
from size_fit import exponent, layout_costs  # noqa: E402

HAVE_FAISS = importlib.util.find_spec("faiss") is not None
STORES = ["numpy", "memory"] + (["faiss"] if HAVE_FAISS else [])
SIZES, N = ["gpt2", "gpt2-medium"], 2


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sizes")
    argv = ["experiment", "sizes", "--scale", "64", "--sizes", *SIZES, "--stores", *STORES, "-n", str(N)]
    argv += ["--models", str(tmp / "models"), "--store-root", str(tmp / "stores"), "--out", str(tmp / "out")]
    assert main([*argv, "--quiet"]) == 0
    for suffix in (".json", ".md", ".png"):
        assert (tmp / "out" / f"sizes{suffix}").stat().st_size > 0
    assert not list((tmp / "stores").glob("memory-*")), "a store's model is dropped after its run (no --keep)"
    data = json.loads((tmp / "out" / "sizes.json").read_text())
    again = ["experiment", "sizes", "--render", str(tmp / "out" / "sizes.json"), "--out", str(tmp / "again")]
    assert main(again) == 0  # the tables and plot of a run's JSON, written again
    assert json.loads((tmp / "again" / "sizes.json").read_text())["rows"] == data["rows"]
    return data


def test_a_row_for_every_size_and_store(data):
    assert [(r["size"], r["store"]) for r in data["rows"]] == [(s, t) for s in SIZES for t in STORES]
    for r in data["rows"]:
        assert r["error"] is None and r["skipped"] is None
        assert r["parameters"] == weights.parameter_count(weights.size_shape(r["size"], 64))
        assert r["ms_per_token"] > 0 and r["load_s"] > 0 and r["peak_mb"] > 0
        assert len(r["tokens"]) == N + 1  # the prompt's candidate, then one a generated token


def test_a_store_row_splits_its_first_read_and_counts_its_requests(data):
    for r in (r for r in data["rows"] if r["store"] not in ("numpy", "transformers")):
        hp = weights.size_shape(r["size"], 64)
        assert r["layout"] == "five" and r["documents"] == sum(n for _, n, _ in plan(hp, "l2", "five"))
        assert r["mb_per_s"] > 0 and r["stored_mb"] > 0 and r["disk_mb"] > 0 and r["peak_mb_load"] > 0
        assert r["whole_same_fingerprint"] is True  # the whole checkpoint read and hashed names the same model
        parts = r["open_s"] + r["find_model_s"] + r["engine_text_s"] + r["first_read_s"]
        assert 0 < parts <= r["first_token_s"] + 1e-3  # the parts are timed inside the whole
        assert r["round_trips_per_token"] == 5 * hp.n_layer + 1  # layout five: 5 rounds a layer, the token search
        assert r["tokens_as_numpy"] == f"{N + 1}/{N + 1}" and r["x_numpy"] > 0  # numpy top-2 gaps >= 5e-3 here
        assert r["numpy_beside_tokens"] == data["rows"][0 if r["size"] == SIZES[0] else len(STORES)]["tokens"]


def test_fits_and_layout_costs(data):
    fits = {f["store"]: f for f in data["fits"]}
    assert set(fits) == set(STORES)
    assert all(fits[s]["ms_per_token"] is not None and fits[s]["load_s"] is not None for s in STORES)
    assert fits["numpy"]["x_numpy"] is None and fits["memory"]["x_numpy"] is not None  # a store against numpy
    assert len(data["layout_costs"]) == 4 * 3  # every size in every layout, run or not: no load needed
    for size in SIZES:
        costs = {c["layout"]: c for c in data["layout_costs"] if c["size"] == size}
        assert set(costs) == {"four", "three", "five"}
        assert costs["five"]["subqueries_per_token"] < costs["four"]["subqueries_per_token"]
        assert all(c["dollars_per_token"] > 0 for c in costs.values())
    assert data["provenance"]["commit"] and data["settings"]["scale"] == 64


def test_exponent_of_a_power_law():
    x = np.array([124e6, 355e6, 774e6, 1558e6])
    assert exponent(x, 3.0 * x**1.5) == pytest.approx(1.5, abs=1e-9)
    assert exponent(x, 0.2 * x) == pytest.approx(1.0, abs=1e-9)
    assert exponent([1.0, 2.0, 4.0], [5.0, None, 20.0]) == pytest.approx(1.0, abs=1e-9)  # a missing figure skipped
    assert exponent([1.0], [2.0]) is None and exponent([2.0, 2.0], [1.0, 3.0]) is None


def test_layout_costs_read_back_the_estimate():
    hp = weights.SIZES["gpt2-xl"]
    five = {c["layout"]: c for c in layout_costs(hp)}["five"]
    assert five["documents"] == sum(n for _, n, _ in plan(hp, "l2", "five"))  # one copy
    assert five["subqueries_per_token"] == 48 * 4 + 1 + 48 * 25
    assert f"${five['dollars_per_token']:.6f}" in five["estimate"]
    assert five["load_dollars"] == pytest.approx(2.0 * five["gb"], abs=0.01)  # $2 a GB written


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """--llama at 1/8 scale: one Llama shape (measured cut to 1 and 2 layers, and whole) and GPT-2 small."""
    if not HAVE_FAISS:
        pytest.skip("the Llama shapes are measured on FAISS")
    tmp = tmp_path_factory.mktemp("llama-sizes")
    argv = ["experiment", "sizes", "--llama", "--scale", "8", "--llama-layers", "1", "2", "-n", "2"]
    argv += ["--llama-shapes", "SmolLM2-135M", "gpt2", "--llama-full", "SmolLM2-135M"]
    argv += ["--models", str(tmp / "models"), "--store-root", str(tmp / "stores"), "--out", str(tmp / "out")]
    assert main(argv) == 0
    for suffix in (".json", ".md", ".png"):
        assert (tmp / "out" / f"llama_sizes{suffix}").stat().st_size > 0
    assert not list((tmp / "models").rglob("model.safetensors")), "the cut checkpoints are removed (no --keep)"
    rows = json.loads((tmp / "out" / "llama_sizes.json").read_text())["rows"]
    again = [
        "experiment",
        "sizes",
        "--llama",
        "--render",
        str(tmp / "out" / "llama_sizes.json"),
        "--out",
        str(tmp / "r"),
    ]
    assert main(again) == 0  # the measurements kept, the shapes' figures taken again
    assert json.loads((tmp / "r" / "llama_sizes.json").read_text())["rows"] == rows
    return {r["shape"]: r for r in rows}


def test_llama_shapes_planned_and_counted(llama):
    import llama_sizes

    assert list(llama) == ["SmolLM2-135M", "gpt2"]
    for name, r in llama.items():
        hp = llama_sizes.shapes(8)[name]
        assert r["documents"] == sum(n for _, n, _ in plan(hp, "ip", "five")) and r["layers"] == hp.n_layer
        # rounds and requests grow by a layer's at each layer: read at the shape's depth, they are layout five's
        assert r["round_trips"] == pytest.approx(5 * hp.n_layer + 1) == r["rounds_per_token"]
        assert r["round_trips_per_layer"] == pytest.approx(5) and r["requests"] > r["round_trips"]
        assert [c["layers"] for c in r["cuts"]] == [1, 2] and all(
            c["store_ms"] > 0 < c["store_cpu_ms"] for c in r["cuts"]
        )
    whole = llama["SmolLM2-135M"]["whole"]  # measured at all 30 layers: what the fit read
    assert whole["round_trips"] == 151 and llama["SmolLM2-135M"]["round_trips"] == pytest.approx(151)
    assert whole["requests"] == pytest.approx(llama["SmolLM2-135M"]["requests"])


def test_llama_shapes_turbopuffer_cost(llama):
    """turbopuffer's figures are `vecgpt load --dry-run`'s in layout five (one copy of the matrices): under grouped-query
    attention a key head's request carries its group's queries."""
    import llama_sizes
    from size_fit import read_estimate

    from vecgpt.cli.store import cost_estimate
    from vecgpt.config import load_config

    config = load_config(str(CONFIGS / "turbopuffer.toml"), layout="five")
    config.store = {**config.store, "replicas": 1}
    for name, r in llama.items():
        said = read_estimate(cost_estimate(config, llama_sizes.shapes(8)[name]))
        assert r["tpuf_dollars_per_token"] == said["dollars_per_token"] > 0
        assert r["tpuf_subqueries_per_token"] == said["subqueries_per_token"]
    smol, gpt2 = llama["SmolLM2-135M"], llama["gpt2"]
    assert smol["tpuf_requests_per_token"] < smol["tpuf_subqueries_per_token"]  # 9 query heads, 3 key heads
    assert gpt2["tpuf_requests_per_token"] == gpt2["tpuf_subqueries_per_token"]
