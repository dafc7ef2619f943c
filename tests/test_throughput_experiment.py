"""`vecgpt experiment throughput` end to end on the tiny model: memory and FAISS, one and two texts at once."""

import importlib.util
import json

import numpy as np
import pytest

from vecgpt.api import generate
from vecgpt.cli import main
from vecgpt.cli.experiments import experiments
from vecgpt.reference import Reference
from vecgpt.weights import load

throughput = experiments()["throughput"]
HAVE_FAISS = importlib.util.find_spec("faiss") is not None
STORES = ["numpy", "memory"] + (["faiss"] if HAVE_FAISS else [])
N, PROMPT = 3, 4


@pytest.fixture(scope="module")
def result(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("throughput")
    argv = ["experiment", "throughput", "--model", str(tiny_model_dir), "--stores", *STORES, "--texts", "1", "2"]
    argv += ["-n", str(N), "--prompt-tokens", str(PROMPT), "--store-root", str(tmp / "stores"), "--out"]
    assert main([*argv, str(tmp / "out"), "--quiet"]) == 0
    return tmp / "out"


def test_files_and_provenance(result, tiny_model_dir):
    for suffix in (".json", ".md", ".png"):
        assert (result / f"throughput{suffix}").stat().st_size > 0
    data = json.loads((result / "throughput.json").read_text())
    assert data["provenance"]["model"]["fingerprint"] == load(str(tiny_model_dir)).fingerprint
    assert data["settings"]["texts"] == [1, 2] and data["settings"]["n"] == N
    assert "| store | texts |" in (result / "throughput.md").read_text()


def test_every_store_and_size_has_a_row(result):
    rows = json.loads((result / "throughput.json").read_text())["rows"]
    expected = {throughput.NUMPY, "memory (l2)"} | (
        {"faiss (ip)", "faiss (ip, kernel=blas)", "faiss (ip, invariant=False)"} if HAVE_FAISS else set()
    )
    assert {(r["store"], r["texts"]) for r in rows} == {(s, t) for s in expected for t in (1, 2)}


def test_figures_are_consistent(result):
    for r in json.loads((result / "throughput.json").read_text())["rows"]:
        texts = r["texts"]
        assert r["tokens_counted"] == texts * N and len(r["tokens"]) == texts
        assert r["decode_steps"] == texts * (N - 1)  # a read a token after the prompt's
        assert all(len(t) == N for t in r["tokens"])
        assert r["tokens_per_s"] > 0 and r["ms_per_token"] > 0 and r["ms_per_token_p90"] >= r["ms_per_token"]
        if r["store"] == throughput.NUMPY:
            continue
        assert r["wall_s"] > 0 and texts * N / r["wall_s"] == pytest.approx(r["tokens_per_s_with_prompt"])
        assert sum(r["steps_by_texts"].values()) > 0 and max(map(int, r["steps_by_texts"])) <= texts
        assert r["requests_per_token"] > 0 and r["round_trips_per_token"] > 0
        assert r["texts_as_numpy"] == texts  # the tiny model's greedy tokens have clear margins


def test_sharing_divides_requests_not_round_trips(result):
    rows = json.loads((result / "throughput.json").read_text())["rows"]
    at = {(r["store"], r["texts"]): r for r in rows}
    for store in {s for s, _ in at if s != throughput.NUMPY}:
        one, two = at[store, 1], at[store, 2]
        assert two["requests_per_token"] < one["requests_per_token"]  # a matrix's search: one for both texts
        assert two["round_trips_per_token"] == pytest.approx(one["round_trips_per_token"], abs=0.5)
        if "invariant=False" not in store:
            assert two["first_text_as_alone"]  # its tokens do not depend on its company


def test_goals_are_listed(result):
    goals = json.loads((result / "throughput.json").read_text())["goals"]
    assert len(goals) == 9 and all(g["met"] is None for g in goals)  # no row of 16 texts: not measured


def test_batched_numpy_equals_the_reference(tiny_model):
    prompts = throughput.make_prompts(tiny_model.hparams, 3, PROMPT, 0)
    params = tiny_model.params
    reader = throughput.BatchedNumpy(tiny_model.hparams, params, np.ascontiguousarray(params["wte"]["weight"].T), 3)
    ids, tokens = np.asarray(prompts), []
    for _ in range(N):
        ids = reader.read(ids)[:, :1]
        tokens.append(ids[:, 0])
    for i, prompt in enumerate(prompts):
        alone = generate(Reference(tiny_model, np.float32), prompt, N, stop=False).tokens
        assert list(np.stack(tokens, 1)[i]) == list(alone)


def test_max_texts_and_goal_ratios():
    assert throughput.max_texts(["lancedb=4", "memory=16"]) == {"lancedb": 4, "memory": 16}
    rows = [
        {"store": "faiss (ip)", "texts": 1, "tokens_per_s": 10.0, "ms_per_token": 100.0},
        {"store": "faiss (ip)", "texts": 16, "tokens_per_s": 45.0, "ms_per_token": 350.0},
        {"store": "faiss (ip)", "texts": 32, "tokens_per_s": 40.0, "ms_per_token": 800.0},
        {"store": throughput.NUMPY, "texts": 16, "tokens_per_s": 60.0},
        {"store": "turbopuffer (l2)", "texts": 1, "round_trips_per_token": 37},
        {"store": "turbopuffer (l2)", "texts": 16, "round_trips_per_token": 37},
    ]
    met = [(g["measured"], g["met"]) for g in throughput.goals(rows)]
    assert met[0] == (4.5, True) and met[1] == (0.75, True)  # x one text's; x numpy batched's
    assert met[2] == (40 / 45, False)  # 32 texts slower in aggregate than 16
    assert met[3] == (3.5, True) and met[4][1] is True  # a text's ms a token; turbopuffer's round trips
    assert len(met) == 5  # no row for a store not run (FAISS's blas kernel here)
    duck = [{"store": "duckdb (ip)", "texts": n, "tokens_per_s": t} for n, t in ((1, 2.6), (16, 5.0))]
    (only,) = throughput.goals(duck)  # the other stores' goal: 2x their one text
    assert only["store"] == "duckdb (ip)" and only["measured"] == pytest.approx(5.0 / 2.6) and only["met"] is False
