"""The experiments: their metric functions on known inputs, and a tiny end-to-end run of each."""

import importlib.util
import json

import numpy as np
import pytest

from vecgpt import families, llama_tolerance, tokenizer, tolerance, weights
from vecgpt.api import generate
from vecgpt.cli import main
from vecgpt.cli.experiments import experiments
from vecgpt.engine import Engine
from vecgpt.loading import push
from vecgpt.reference import Reference
from vecgpt.reference_llama import LlamaReference
from vecgpt.reference_llama import generate as llama_greedy
from vecgpt.weights import load

EXPERIMENTS = experiments()  # experiments/NN_name/run.py by NAME
agreement, numpy_comparison, requests, storage = (
    EXPERIMENTS[name] for name in ("agreement", "numpy-comparison", "requests", "storage")
)

HAVE_FAISS = importlib.util.find_spec("faiss") is not None


# ------------------------------------------------------------ metric functions


def test_first_divergence():
    assert agreement.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert agreement.first_divergence([1, 2, 4], [1, 2, 3]) == 2
    assert agreement.first_divergence([5, 2], [6, 2]) == 0
    assert agreement.first_divergence([], []) is None


def test_top2_gap():
    assert agreement.top2_gap([0.0, 3.0, 1.0, 2.5]) == pytest.approx(0.5)
    assert agreement.top2_gap([2.0, 2.0, -1.0]) == 0.0


def test_near_tie_threshold():
    assert agreement.tie_threshold(1e-2) == pytest.approx(2e-2)  # twice the logit error ...
    assert agreement.tie_threshold(1e-7) == 1e-3  # ... but never below the absolute floor
    assert agreement.near_tie(0.01, 1e-2)
    assert not agreement.near_tie(0.5, 1e-2)
    assert agreement.near_tie(5e-4, 0.0)
    assert not agreement.near_tie(2e-3, 0.0)


def test_topk_overlap():
    assert agreement.topk_overlap([1, 2, 3, 4], [3, 4, 5, 6]) == 0.5
    assert agreement.topk_overlap([4, 3, 2, 1], [1, 2, 3, 4]) == 1.0
    assert agreement.topk_overlap([7], [8]) == 0.0


def test_logit_error():
    ref = np.array([1.0, 9.0, 3.0])
    assert agreement.logit_error([0, 2], [1.0, 3.5], ref) == {"max": 0.5, "mean": 0.25}
    np.testing.assert_array_equal(agreement.logit_errors([1], [8.0], ref), [1.0])


def test_residual_error():
    x = [np.array([[1.0, 2.0], [3.0, 4.0]]), np.zeros((2, 2))]
    r = [np.array([[1.0, 2.0], [3.0, 5.0]]), np.zeros((2, 2))]
    (a, b) = agreement.residual_error(x, r)
    assert a["max_abs"] == 1.0 and a["relative"] == pytest.approx(1 / np.sqrt(39))
    assert b == {"max_abs": 0.0, "relative": 0.0}


def test_typical_error_is_the_median():
    assert agreement.typical_error([1e-6, 5.0, 2e-6]) == 2e-6
    assert agreement.typical_error([]) == 0.0


def score_steps(last_ref, last_cands):
    """Two steps where the subject is exact, then the step given."""
    exact_ref, exact = np.array([0.0, 1.0, 0.5]), (np.array([1, 2]), np.array([1.0, 0.5]))
    ref = {
        "tokens": [1, 1, int(np.argmax(last_ref))],
        "logits": [exact_ref, exact_ref, np.array(last_ref)],
        "residual": [np.ones((1, 2))],
    }
    return agreement.score([exact, exact, last_cands], [np.ones((1, 2))], ref, 2)


def test_score_divergence_at_a_near_tie():
    # last step: the reference prefers token 2 by 5e-4 (below the 1e-3 floor); the subject flips it
    s = score_steps([0.0, 0.5, 0.5005], (np.array([1, 2]), np.array([0.5004, 0.5003])))
    assert s["identical_steps"] == 2 and s["first_divergence"] == 2 and s["agreeing_steps"] == 2
    d = s["divergence"]
    assert d["reference_top2_gap"] == pytest.approx(5e-4) and d["near_tie"]
    assert d["reference_token"] == 2 and d["token"] == 1
    assert s["topk_overlap"] == [1.0, 1.0, 1.0] and s["logit_error_max"] == pytest.approx(4e-4)


def test_score_divergence_not_at_a_tie():
    # the reference prefers token 1 by 0.5; a subject exact elsewhere but wrong here is not excused
    s = score_steps([0.0, 1.0, 0.5], (np.array([2, 1]), np.array([1.2, 1.1])))
    assert s["first_divergence"] == 2 and not s["divergence"]["near_tie"]
    assert s["divergence"]["typical_logit_error"] == 0.0 and s["divergence"]["logit_error_at_step"] == pytest.approx(
        0.7
    )
    assert s["logit_error_max"] == pytest.approx(0.7)


def test_score_without_divergence():
    s = score_steps([0.0, 1.0, 0.5], (np.array([1, 0]), np.array([1.0, 0.0])))
    assert s["identical_steps"] == 3 and s["first_divergence"] is None and "divergence" not in s
    assert s["topk_overlap"] == [1.0, 1.0, 0.5] and s["missing_reference_ranks"] == [[], [], [2]]


def test_identical_prefix_and_side_by_side():
    assert numpy_comparison.identical_prefix([1, 2, 3, 4], [1, 2, 5, 4]) == 2
    assert numpy_comparison.identical_prefix([1, 2], [1, 2, 3]) == 2
    rows = numpy_comparison.side_by_side([(7, 2.0), (8, 1.0)], {"s": [(8, 1.5), (9, 0.5)]})
    assert rows[0]["s"] is None and rows[1]["s"] == 1.5 and rows[1]["s rank"] == 1


def test_storage_kinds():
    assert storage.kind_of("h.11.attn.c_attn") == "attn.c_attn"
    assert storage.kind_of("h.0.mlp.c_proj") == "mlp.c_proj" and storage.kind_of("h.2.attn.c_proj.3") == "attn.c_proj"
    assert storage.kind_of("wte") == "wte" and storage.kind_of("manifest") == "other"
    kinds = storage.by_kind(
        {
            "h.0.mlp.c_fc": {"documents": 3, "bytes": 30},
            "h.1.mlp.c_fc": {"documents": 3, "bytes": 30},
            "wte": {"documents": 5, "bytes": 50},
            "text-abc": {"documents": 9, "bytes": 90},
        }
    )
    assert kinds == {
        "mlp.c_fc": {"documents": 6, "bytes": 60, "collections": 2},
        "wte": {"documents": 5, "bytes": 50, "collections": 1},
    }


def test_storage_plan_of_gpt2_small_shape():
    from vecgpt.weights import HParams, Model

    hp = HParams(**agreement.GPT2_SMALL)
    shapes = {
        "wte": (hp.n_vocab, 768),
        "c_attn": (768, 2304),
        "c_proj": (768, 768),
        "c_fc": (768, 3072),
        "m_proj": (3072, 768),
    }
    z = {k: np.zeros(s, np.float32) for k, s in shapes.items()}  # plan reads shapes only
    block = {
        "attn": {"c_attn": {"weight": z["c_attn"]}, "c_proj": {"weight": z["c_proj"]}},
        "mlp": {"c_fc": {"weight": z["c_fc"]}, "c_proj": {"weight": z["m_proj"]}},
    }
    model = Model(hp, {"wte": {"weight": z["wte"]}, "h": [block] * 12}, "shape only")
    kinds = storage.planned(model, "l2")
    assert sum(k["documents"] for k in kinds.values()) == 134_275 + 12 * 11 * 768  # attn.c_proj by head
    assert kinds["mlp.c_fc"] == {"documents": 12 * 3072, "bytes": 12 * 3072 * 770 * 4, "collections": 12}


def test_per_token_counts():
    def tok(total, rounds, by_kind):
        return {
            "total": total,
            "subqueries": 1,
            "round_trips": rounds,
            "by_kind": by_kind,
            "subqueries_by_kind": {},
            "round_trips_by_kind": {"matrix": rounds},
            "seconds": 0.0,
        }

    summary = {"per_token": [tok(10, 4, {"open": 2, "matrix": 8}), tok(6, 3, {"matrix": 6}), tok(8, 5, {"matrix": 8})]}
    c = requests.per_token_counts(summary)
    assert c["first_token"]["requests"] == 10 and c["first_token"]["round_trips_sequential"] == 10
    assert c["per_generated_token"]["requests"] == 7.0 and c["per_generated_token"]["round_trips"] == 4.0
    assert c["per_generated_token"]["round_trips_sequential"] == 7.0
    assert c["per_generated_token"]["requests_by_kind"] == {"matrix": 7.0}
    assert c["generated_tokens"] == 2


# ------------------------------------------------------------ traces


def test_traced_reference_equals_the_reference(tiny_model_dir):
    model = load(str(tiny_model_dir), dtype=np.float64)
    ids = tokenizer.encode("Hello there world")
    plain, traced = Reference(model, np.float64), agreement.traced_reference(model, np.float64)
    for feed in (ids, [11], [12]):
        np.testing.assert_array_equal(plain.logits(feed), traced.logits(feed))
    layers = agreement.stack_trace(traced.trace)
    assert len(layers) == model.hparams.n_layer + 1 and layers[0].shape == (len(ids) + 2, model.hparams.n_embd)


def test_engine_trace_matches_reference(make_store, tiny_model, tiny_model_dir):
    store = make_store("memory")
    push(store, tiny_model, "l2", progress=False)
    text = Engine(store).open()
    trace = agreement.traced(text)
    ids = tokenizer.encode("Hello there world")
    text.read(ids), text.read([11])
    ref = agreement.traced_reference(load(str(tiny_model_dir), dtype=np.float64), np.float64)
    ref.logits(ids), ref.logits([11])
    errs = agreement.residual_error(agreement.stack_trace(trace), agreement.stack_trace(ref.trace))
    assert len(errs) == tiny_model.hparams.n_layer + 1
    assert errs[0]["max_abs"] == 0.0  # the embedding is a float32 lookup either way
    assert all(0 < e["max_abs"] < 1e-4 for e in errs[1:])
    text.close()


def write_configs(tmp_path) -> list[str]:
    paths = []
    for backend in ["memory"] + (["faiss"] if HAVE_FAISS else []):
        p = tmp_path / f"{backend}.toml"
        p.write_text(f'backend = "{backend}"\nmetric = "l2"\n')
        paths.append(str(p))
    return paths


def test_variants_add_the_other_encoding_at_its_own_path(tmp_path):
    configs = write_configs(tmp_path)
    vs = agreement.variants(configs, str(tmp_path / "stores"))
    assert [(v.config.backend, v.config.metric) for v in vs] == [
        (b, m) for b in ["memory"] + (["faiss"] if HAVE_FAISS else []) for m in ("l2", "ip")
    ]
    paths = [v.config.store["path"] for v in vs]
    assert len(set(paths)) == len(paths) and all(p.startswith(str(tmp_path / "stores")) for p in paths)
    assert len(agreement.variants(configs, str(tmp_path / "stores"), both_metrics=False)) == len(configs)


# ------------------------------------------------------------ end to end, tiny


@pytest.fixture
def run_experiment(tmp_path, tiny_model_dir, capsys):
    configs = write_configs(tmp_path)

    def run(name, *extra):
        out = tmp_path / "out" / name
        code = main(
            [
                "experiment",
                name,
                "--model",
                str(tiny_model_dir),
                "--configs",
                *configs,
                "--store-root",
                str(tmp_path / "stores"),
                "--out",
                str(out),
                "--quiet",
                *extra,
            ]
        )
        printed = capsys.readouterr().out
        assert code == 0
        return out, printed

    return run


def check_files(out, stem, tiny_model_dir):
    for suffix in (".json", ".md", ".png"):
        assert (out / f"{stem}{suffix}").stat().st_size > 0
    data = json.loads((out / f"{stem}.json").read_text())
    prov = data["provenance"]
    assert prov["model"]["fingerprint"] == load(str(tiny_model_dir)).fingerprint
    assert {"commit", "versions", "machine", "threads", "seed"} <= set(prov)
    return data


def sure_agreement(tiny_model_dir, ids, n, subject):
    """(greedy steps any run within the derived tolerance shares with numpy, tolerance per step)."""
    model64 = load(str(tiny_model_dir), dtype=np.float64)
    tokens = generate(Reference(model64, np.float64), ids, n, stop=False).tokens
    exact = tolerance.forced_logits(model64, ids, tokens)
    backend, metric = subject.split(" (")[0], subject.split("(")[1].rstrip(")")
    if backend == "numpy":  # float32 maths, nothing stored: plain dot products
        tol = tolerance.logit_tolerance(model64, ids, tokens, "ip", tolerance.U32, exact, stored=0.0)
    else:
        tol = tolerance.logit_tolerance(model64, ids, tokens, metric, tolerance.unit_roundoff(backend), exact)
    return tolerance.sure_greedy_steps(exact, tol), tol


def test_agreement_end_to_end(run_experiment, tiny_model_dir):
    out, printed = run_experiment("agreement", "-n", "3", "--prompts", "Hello world")
    data = check_files(out, "agreement", tiny_model_dir)
    subjects = {s["subject"]: s for s in data["summary"]}
    assert {"numpy (float32)", "memory (l2)", "memory (ip)"} <= set(subjects)
    for name, s in subjects.items():
        sure, tol = sure_agreement(tiny_model_dir, tokenizer.encode("Hello world"), 3, name)
        assert s["identical_steps"][0] >= sure and s["topk_overlap_min"] >= 0.95  # a tie at rank 40 may differ
        assert s["logit_error_max"] <= tol.max() and len(s["residual_max_abs_by_layer"]) == 3
        if name != "numpy (float32)":  # each store held to its derived tolerance, step by step
            assert s["violation_count"] == 0 and 0 < s["error_over_tolerance_max"] < 1
    assert "memory (ip)" in printed and "| subject |" in printed


def test_numpy_comparison_end_to_end(run_experiment, tiny_model_dir):
    out, printed = run_experiment("numpy-comparison", "-n", "4")
    data = check_files(out, "numpy_comparison", tiny_model_dir)
    assert len(data["settings"]["prompt_ids"]) == 10 and len(data["scores"]) == 40
    ids = data["settings"]["prompt_ids"]
    for s in data["summary"]:
        sure, tol = sure_agreement(tiny_model_dir, ids, 4, f"{s['subject'].split()[0]} ({s['metric']})")
        assert s["identical_steps"] >= sure and s["max_abs_error"] <= tol[0]
    assert "numpy float64" in printed


def test_storage_end_to_end(run_experiment, tiny_model_dir):
    out, printed = run_experiment("storage")
    data = check_files(out, "storage", tiny_model_dir)
    hp = load(str(tiny_model_dir)).hparams
    by_head = hp.n_layer * (hp.n_head - 1) * hp.n_embd  # attention's c_proj has a document per output and head
    for r in data["results"]:
        assert r["documents"] == sum(k["documents"] for k in r["planned"].values()) == 51_483 + by_head
        assert r["bytes"] > 0 and r["load_s"] > 0
    assert "wte" in printed


def test_requests_end_to_end(run_experiment, tiny_model_dir):
    out, printed = run_experiment("requests", "-n", "3")
    data = check_files(out, "requests", tiny_model_dir)
    hp = load(str(tiny_model_dir)).hparams
    for r in data["results"]:
        per, rounds = r["per_generated_token"], {"four": 4, "five": 5}[r["layout"]]
        # per layer c_attn, one key search for all heads, c_fc, mlp c_proj, and attention's c_proj: in layout four a
        # projection per head in the key search's round, in five one search after attention; one key write; token
        # search 1, with the next position's row fetched beside it (the next token's row comes with it)
        layer = 4 + hp.n_head if r["layout"] == "four" else 5
        assert per["requests"] == hp.n_layer * layer + 1 + 1 + 1 == per["round_trips_sequential"]
        assert per["round_trips"] == rounds * hp.n_layer + 1
    assert "token by token" in printed


# ------------------------------------------------------------ where experiments run and write


def test_each_run_gets_a_new_folder_under_the_current_one(tmp_path, tiny_model_dir, monkeypatch, capsys):
    configs = write_configs(tmp_path)[:1]
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert (
            main(
                [
                    "experiment",
                    "storage",
                    "--model",
                    str(tiny_model_dir),
                    "--configs",
                    *configs,
                    "--store-root",
                    str(tmp_path / "stores"),
                    "--quiet",
                ]
            )
            == 0
        )
    runs = sorted((tmp_path / "results" / "storage").iterdir())
    assert len(runs) == 2 and all((r / "storage.json").is_file() for r in runs)
    prov = json.loads((runs[0] / "storage.json").read_text())["provenance"]
    assert prov["command"] and prov["time"] and prov["cwd"] == str(tmp_path)  # the command: this process's argv


def test_run_py_runs_from_any_folder(tmp_path, tiny_model_dir):
    import os
    import subprocess
    import sys
    from pathlib import Path

    run_py = Path(__file__).resolve().parents[1] / "experiments" / "03_storage" / "run.py"
    configs = write_configs(tmp_path)[:1]
    env = {**os.environ, "PYTHONPATH": str(run_py.parents[2])}  # this checkout's vecgpt
    done = subprocess.run(
        [
            sys.executable,
            str(run_py),
            "--model",
            str(tiny_model_dir),
            "--configs",
            *configs,
            "--store-root",
            str(tmp_path / "stores"),
            "--quiet",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (run,) = (tmp_path / "results" / "storage").iterdir()
    assert "run.py" in json.loads((run / "storage.json").read_text())["provenance"]["command"]
    bad = subprocess.run(
        [sys.executable, str(run_py), "--model", str(tmp_path / "nowhere")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("vecgpt: error:") and len(bad.stderr.splitlines()) == 1


def test_without_the_experiments_folder_one_line_says_where(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VECGPT_EXPERIMENTS", str(tmp_path))  # a folder without experiments
    assert main(["experiment", "agreement", "-n", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vecgpt: error: the experiments live in the vecgpt repository") and err.count("\n") == 1


# ------------------------------------------------------------ the Llama family


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    """A random Llama (2 layers, 4 query heads sharing 2 key heads, GPT-2's 50,257 tokens and so its tokenizer)."""
    hp = families.LlamaHParams(2, 4, 2, 64, 96, 64, 50257, tied=True)
    return weights.make_llama_model(tmp_path_factory.mktemp("llama") / "tiny-llama", hp, seed=3, std=0.2)


def llama_run(name, tmp_path, model_dir, capsys, *extra):
    out = tmp_path / "out" / name
    argv = ["experiment", name, "--model", str(model_dir), "--configs", *write_configs(tmp_path)]
    assert main([*argv, "--store-root", str(tmp_path / "stores"), "--out", str(out), "--quiet", *extra]) == 0
    printed = capsys.readouterr().out
    return json.loads((out / f"{name.replace('-', '_')}.json").read_text()), printed


def llama_tolerance_of(model64, ids, tokens, subject: dict) -> np.ndarray:
    """The derived tolerance a store subject is held to (its l2 keys' pad aside: ip, or the float64 store's l2)."""
    backend = subject["subject"].split()[0]
    return llama_tolerance.logit_tolerance(model64, ids, tokens, subject["metric"], tolerance.unit_roundoff(backend))


def test_agreement_on_a_llama(tmp_path, tiny_llama_dir, capsys):
    data, printed = llama_run("agreement", tmp_path, tiny_llama_dir, capsys, "-n", "4", "--prompts", "Hello world")
    model64, ids = load(str(tiny_llama_dir), dtype=np.float64), tokenizer.encode("Hello world")
    tokens = llama_greedy(LlamaReference(model64, np.float64), ids, 4)
    assert data["prompts"][0]["reference_tokens"] == tokens  # numpy's side is reference_llama
    subjects = {s["subject"]: s for s in data["summary"]}
    assert {"numpy (float32)", "memory (l2)", "memory (ip)"} <= set(subjects)
    for name, s in subjects.items():
        assert len(s["residual_max_abs_by_layer"]) == 3 and s["identical_steps"] == [4]
        if name == "numpy (float32)":
            continue
        assert s["violation_count"] == 0 and 0 < s["error_over_tolerance_max"] < 1
        if s["metric"] == "ip":  # no key pad: the bound is llama_tolerance's as called here
            tol = llama_tolerance_of(model64, ids, tokens, s)
            assert np.allclose(data["per_prompt"][name][0]["tolerance_by_step"], tol, rtol=1e-12)
    assert all(v["layout"] == "five" for v in data["variants"]) and "4 / 2 heads (llama)" in printed


def test_numpy_comparison_on_a_llama(tmp_path, tiny_llama_dir, capsys):
    data, printed = llama_run("numpy-comparison", tmp_path, tiny_llama_dir, capsys, "-n", "5")
    model64, ids = load(str(tiny_llama_dir), dtype=np.float64), data["settings"]["prompt_ids"]
    want = llama_greedy(LlamaReference(model64, np.float64), ids, 5)
    assert data["numpy_float64"]["tokens"] == want
    exact = llama_tolerance.forced_logits(model64, ids, want)
    rows = {s["subject"]: s for s in data["summary"]}
    assert rows["numpy float64"]["max_abs_error"] == 0 and rows["numpy float64"]["identical_steps"] == 5
    for name, s in rows.items():
        assert s["ms_per_token"] > 0 and len(s["read_ms"]) == 5  # the prompt's read, then 4 generated tokens
        if name.startswith("numpy"):
            continue
        tol = llama_tolerance_of(model64, ids, want, s)
        sure = tolerance.sure_greedy_steps(exact, tol)
        assert s["max_abs_error"] <= tol[0] and sure >= 3 and s["tokens"][:sure] == want[:sure]
    assert "x numpy float32" in printed
