"""`vecgpt texts show / step-back / retry / branch` on kept texts, `generate`'s sampling default, `--version`.

The tiny model on a FAISS folder; what the commands print is checked against the store (`texts show --json`),
the sampling rule (`sampling.choose`) and the numpy reference."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from test_cli import assert_one_line_error, run

import vecgpt
from vecgpt import weights
from vecgpt.cli import main
from vecgpt.policy import SETTINGS as POLICY_SETTINGS
from vecgpt.reference import Reference
from vecgpt.sampling import Candidates, choose, draw

COST = re.compile(r"^vecgpt: (show|step-back|retry|branch): (\d+) requests, (\d+) round trips, (\d+) positions read")


@pytest.fixture
def store(tmp_path, tiny_model_dir):
    return ["--backend", "faiss", "--store", str(tmp_path / "faiss")]


def kept(capsys, store, tiny_model_dir, n=5, *extra) -> dict:
    code, out, err = run(
        capsys, "generate", *store, "--model", str(tiny_model_dir), "Hello", "-n", str(n), "--keep", "--json", *extra
    )
    assert code == 0, err
    return json.loads(out)


def show(capsys, store, text_id) -> dict:
    code, out, err = run(capsys, "texts", *store, "show", text_id, "--json")
    assert code == 0, err
    return json.loads(out)


def cost_of(err: str, action: str) -> tuple[int, int, int]:
    found = [COST.match(line) for line in err.splitlines()]
    (m,) = [m for m in found if m and m.group(1) == action]
    return int(m.group(2)), int(m.group(3)), int(m.group(4))


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"vecgpt {vecgpt.__version__}"


def test_generate_samples_by_default_and_says_the_seed(capsys, store, tiny_model_dir):
    base = ["generate", *store, "--model", str(tiny_model_dir), "Hello", "-n", "6", "--no-stop", "--json"]
    code, out, err = run(capsys, *base)
    d = json.loads(out)
    (seed,) = [int(s) for s in re.findall(r"^vecgpt: seed: (\d+) ", err, re.M)]
    assert code == 0 and (d["temperature"], d["top_k"], d["seed"]) == (0.8, 40, seed)
    again = json.loads(run(capsys, *base, "--seed", str(seed))[1])
    assert again["tokens"] == d["tokens"]  # the seed said repeats the run
    # each token is the one sampling draws from its candidates with that seed
    for step in d["steps"]:
        c = Candidates(np.array([r[0] for r in step["candidates"]]), np.array([r[1] for r in step["candidates"]]))
        assert step["token"] == choose(c, 0.8, 40, draw(seed, step["position"]))
    code, out, err = run(capsys, *base, "--temperature", "0")
    greedy = json.loads(out)
    assert "seed" not in err and greedy["temperature"] == 0.0
    assert all(s["token"] == s["candidates"][0][0] for s in greedy["steps"])


def test_show_prints_tokens_candidates_settings_and_what_was_spent(capsys, store, tiny_model_dir):
    made = kept(capsys, store, tiny_model_dir, 4, "--seed", "3")
    code, out, err = run(capsys, "texts", *store, "show", made["text_id"], "--json")
    d = json.loads(out)
    assert code == 0 and d["id"] == made["text_id"] and cost_of(err, "show")[0] > 0
    assert [t["id"] for t in d["tokens"]] == made["text_tokens"] and d["prompt_len"] == 1
    assert (
        d["settings"] == {"temperature": 0.8, "top_k": 40, "seed": 3, **dict.fromkeys(POLICY_SETTINGS)}
        and d["prompt"] == "Hello"
    )
    assert d["text"] == made["text"] and d["version"] == vecgpt.__version__
    assert d["spent"]["requests"] > 0 and d["spent"]["positions_read"] == 4  # the prompt, then three tokens
    ref = Reference(weights.load(str(tiny_model_dir), dtype=np.float64), np.float64)
    logits = ref.logits(made["text_tokens"][:-1])
    assert [c["position"] for c in d["candidates"]] == [1, 2, 3, 4]
    for c in d["candidates"]:
        rows, p = c["rows"], c["position"]
        assert [r["id"] for r in rows if r["chosen"]] == [made["text_tokens"][p]] and len(rows) == 40
        assert max(abs(r["logit"] - logits[p - 1, r["id"]]) for r in rows) < 1e-4  # the store against numpy
        assert abs(sum(r["probability"] for r in rows) - 1) < 1e-12
    code, out, _ = run(capsys, "texts", *store, "show", made["text_id"])
    assert code == 0 and "Hello" + made["text"] in out and "temperature 0.8, top-k 40, seed 3" in out
    assert "spent so far:" in out and len(out.splitlines()) == 4 + 4 + 1


def test_step_back_retry_and_branch_say_their_cost(capsys, store, tiny_model_dir):
    made = kept(capsys, store, tiny_model_dir, 5, "--seed", "3")
    tid, tokens = made["text_id"], made["text_tokens"]
    code, out, err = run(capsys, "texts", *store, "step-back", tid, "4")
    requests, _, read = cost_of(err, "step-back")
    assert code == 0 and requests > 0 and read == 0  # nothing read: the text is cut
    assert [t["id"] for t in show(capsys, store, tid)["tokens"]] == tokens[:4]

    code, out, err = run(capsys, "texts", *store, "retry", tid, "--seed", "11", "--json")
    d = json.loads(out)
    last = show(capsys, store, tid)["candidates"][-1]
    c = Candidates(np.array([r["id"] for r in last["rows"]]), np.array([r["logit"] for r in last["rows"]]))
    assert code == 0 and d["settings"]["seed"] == 11 and d["cost"]["positions_read"] == 0
    assert d["tokens"][3]["id"] == choose(c, 0.8, 40, draw(11, 3))
    assert [t["id"] for t in d["tokens"][:3]] == tokens[:3] and cost_of(err, "retry")[2] == 0

    other = next(r["id"] for r in last["rows"] if not r["chosen"])
    code, out, err = run(capsys, "texts", *store, "branch", tid, "3", str(other))
    child = out.strip()
    assert code == 0 and re.fullmatch(r"[0-9a-f]{12}", child) and child != tid and cost_of(err, "branch")[2] == 0
    assert [t["id"] for t in show(capsys, store, child)["tokens"]] == tokens[:3] + [other]
    assert [t["id"] for t in show(capsys, store, tid)["tokens"]] == [t["id"] for t in d["tokens"]]  # untouched
    code, out, _ = run(capsys, "generate", *store, "--resume", child, "-n", "2", "--json")
    assert code == 0 and json.loads(out)["text_tokens"][:4] == tokens[:3] + [other]
    listed = {t["id"] for t in json.loads(run(capsys, "texts", *store, "--json")[1])}
    assert listed == {tid, child}


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["show", "nosuchtext"], "has no text nosuchtext"),
        (["show"], "texts show takes TEXT_ID"),
        (["step-back", "{id}", "99"], "position 99 is not a generated token"),
        (["step-back", "{id}", "0"], "position 0 is not a generated token"),
        (["step-back", "{id}", "two"], "POSITION must be a whole number"),
        (["branch", "{id}", "2"], "texts branch takes TEXT_ID POSITION TOKEN"),
        (["branch", "{id}", "7", "5"], "position 7 is not a generated token"),
        (["branch", "{id}", "2", "50257"], "token id 50257 is outside the model's vocabulary"),
        (["retry", "{id}", "--seed", "-1"], "--seed must be 0 or more"),
        (["show", "{id}", "extra"], "texts show takes TEXT_ID"),
        (["list", "{id}"], "texts list takes no"),
    ],
)
def test_bad_operands_are_one_line(capsys, store, tiny_model_dir, argv, needle):
    tid = kept(capsys, store, tiny_model_dir, 3, "--seed", "1")["text_id"]
    code, _, err = run(capsys, "texts", *store, *[w.replace("{id}", tid) for w in argv])
    assert_one_line_error(code, err, needle)


def test_a_closed_text_and_one_with_nothing_generated(capsys, store, tiny_model_dir):
    tid = kept(capsys, store, tiny_model_dir, 0, "--seed", "1")["text_id"]
    assert_one_line_error(*run(capsys, "texts", *store, "retry", tid)[::2], "retry needs a generated token")
    assert show(capsys, store, tid)["candidates"] == []
    assert run(capsys, "texts", *store, "close", tid)[0] == 0
    for action in (["show"], ["step-back", "1"], ["retry"], ["branch", "1", "5"]):
        code, _, err = run(capsys, "texts", *store, action[0], tid, *action[1:])
        assert_one_line_error(code, err, f"has no text {tid}")
