"""`vecgpt generate --batch FILE` and batch.generate_many: each text as it is alone, the shared requests split
among the texts, a bad batch file refused in one line naming the line, before any search, and a kept batch
(`--keep`) that kill -9 or Ctrl-C leaves with every text resumable, each then ending as its uninterrupted solo run.

The tiny model on FAISS and memory folders. Tokens and candidates' logits are compared bit for bit: every store
computes each query of a shared search alone (vecgpt.stepper), so a text's numbers do not depend on what else reads.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pytest
from procs import ROOT, default_sigint, env
from stepping import assert_alone_as_together, reading
from test_cli import assert_one_line_error, run

from vecgpt import api, batch, tokenizer
from vecgpt.api import open_engine
from vecgpt.backends.base import get_store
from vecgpt.config import Config
from vecgpt.engine import Engine
from vecgpt.stepper import Stepper
from vecgpt.text import FLUSH_EVERY, Text

PROMPTS = ["Hello", "The history of the vector database", "A", "Once upon a time, in a land far away, a"]


@pytest.fixture(params=["faiss", "memory"])
def store(request, tmp_path):
    return ["--backend", request.param, "--store", str(tmp_path / request.param)]


def batch_file(tmp_path, lines: list[str] | bytes, name="prompts.txt"):
    path = tmp_path / name
    path.write_bytes(lines if isinstance(lines, bytes) else "".join(line + "\n" for line in lines).encode())
    return str(path)


def test_each_line_of_a_batch_is_its_text_alone(capsys, tmp_path, store, tiny_model_dir):
    common = [*store, "--model", str(tiny_model_dir), "-n", "5", "--seed", "7", "--no-stop", "--json"]
    code, out, err = run(capsys, "generate", *common, "--batch", batch_file(tmp_path, PROMPTS), "--at-once", "3")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [tokenizer.decode(d["prompt_tokens"]) for d in lines] == PROMPTS  # the file's order
    for prompt, d in zip(PROMPTS, lines):
        code, out, err = run(capsys, "generate", *common, prompt)
        alone = json.loads(out)
        assert code == 0 and d.keys() == alone.keys()  # the solo schema
        assert d["tokens"] == alone["tokens"] and d["text"] == alone["text"]
        for a, b in zip(d["steps"], alone["steps"]):
            assert a["candidates"] == b["candidates"]  # ids and logits, floats compared exactly


def test_a_batch_prints_each_text_after_its_prompt(capsys, tmp_path, store, tiny_model_dir):
    args = [*store, "--model", str(tiny_model_dir), "-n", "3", "--temperature", "0", "--batch"]
    code, out, err = run(capsys, "generate", *args, batch_file(tmp_path, PROMPTS[:2]))
    texts = out.split("\n\n")
    assert code == 0 and texts[0].startswith(PROMPTS[0]) and texts[1].startswith(PROMPTS[1]), out


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (["Hello", "", "world"], "prompts.txt:2: an empty line"),
        (["Hello", "   "], "prompts.txt:2: an empty line"),
        (b"Hello\nworld\n\xff\xfe bad\n", "prompts.txt:3: not UTF-8"),
        (["Hello", "word " * 200], "prompts.txt:2: the prompt's"),
        (b"", "holds no prompt"),
    ],
)
@pytest.mark.parametrize("keep", [[], ["--keep"]])
def test_a_bad_batch_file_is_refused_before_any_search(capsys, tmp_path, tiny_model_dir, content, needle, keep):
    folder = tmp_path / "faiss"
    args = ["--backend", "faiss", "--store", str(folder), "--model", str(tiny_model_dir), "-n", "4", *keep]
    code, out, err = run(capsys, "generate", *args, "--batch", batch_file(tmp_path, content))
    assert_one_line_error(code, err, needle)
    assert out == "" and not folder.exists()  # nothing loaded, no text started


def test_batch_refuses_a_prompt_beside_it_and_a_missing_file(capsys, tmp_path, tiny_model_dir):
    args = ["generate", "--backend", "faiss", "--store", str(tmp_path / "f"), "--model", str(tiny_model_dir)]
    assert_one_line_error(*run(capsys, *args, "Hi", "--batch", batch_file(tmp_path, ["a"]))[::2], "drop a prompt")
    assert_one_line_error(*run(capsys, *args, "--batch", str(tmp_path / "none.txt"))[::2], "cannot read the batch")
    bad = run(capsys, *args, "--batch", batch_file(tmp_path, ["a"]), "--at-once", "0")
    assert_one_line_error(bad[0], bad[2], "--at-once must be 1 or more")


def decode_tokens(out: dict) -> list[dict]:
    return out["requests"]["per_token"][1:]  # after the prompt's read


def test_texts_stepped_together_split_each_shared_request(tmp_path, tiny_model_dir):
    """Two texts with prompts of one length share every round: each is counted half of each model search's
    request, and waits for as many round trips as alone."""
    config = Config(backend="memory", store={"path": str(tmp_path / "m")})
    prompts = ["The cat", "The dog"]
    assert len({len(tokenizer.encode(p)) for p in prompts}) == 1
    alone = [batch.generate_many([p], n=4, config=config, model=str(tiny_model_dir)) for p in prompts]
    both = batch.generate_many(prompts, n=4, config=config, model=str(tiny_model_dir))
    for (solo,), shared in zip(alone, both):
        assert shared["tokens"] == solo["tokens"]
        for a, b in zip(decode_tokens(shared), decode_tokens(solo)):
            assert a["by_kind"]["matrix"] == b["by_kind"]["matrix"] / 2
            assert a["by_kind"]["key_search"] == b["by_kind"]["key_search"]  # each text's own keys
            assert a["round_trips"] == b["round_trips"]


def test_a_step_sends_one_search_per_matrix(tmp_path, tiny_model):
    """Three texts in one stepper: every step holds all three, and the store gets one search of a matrix for the
    step's rows (the prompts' nine, then one a text)."""
    engine = open_engine(Config(backend="faiss", store={"path": str(tmp_path / "f")}), tiny_model, progress=False)
    sizes, search_many = [], engine.store.search_many

    def counted(searches):
        sizes.extend(len(s.queries) for s in searches if s.collection.endswith("mlp.c_fc"))
        return search_many(searches)

    engine.store.search_many = counted
    sessions, stepper = [engine.open() for _ in range(3)], Stepper()
    for i, s in enumerate(sessions):
        stepper.add(reading(s, [5, 6, 7 + i], 3))
    stepper.run()
    layers = engine.hparams.n_layer
    assert sizes == [9] * layers + [3] * 3 * layers  # the prompts' three queries each, then one each
    assert set(stepper.steps) == {3}
    for s in sessions:
        s.close()


def test_alone_and_stepped_together_agree_bit_for_bit_on_logits(tmp_path, tiny_model):
    """Every logit of the vocabulary, for a text read alone and beside four others of other lengths."""
    engine = open_engine(Config(backend="faiss", store={"path": str(tmp_path / "f")}), tiny_model, progress=False)
    vocab, prompts = engine.hparams.n_vocab, [[3, 4], [9], [1, 2, 3, 4, 5, 6], [7, 7, 7], [11, 12, 13, 14]]
    assert_alone_as_together(engine, prompts, 4, vocab)


# A kept batch --------------------------------------------------------------------------------------------------------
KEPT = re.compile(r"vecgpt: (.+):(\d+): text (\w+) is kept; continue it with --resume \3")


def test_a_kept_batch_says_each_id_before_any_token_and_keeps_every_text(capsys, tmp_path, store, tiny_model_dir):
    args = [*store, "--model", str(tiny_model_dir), "-n", "3", "--seed", "2", "--json", "--keep", "--at-once", "2"]
    code, out, err = run(capsys, "generate", *args, "--batch", batch_file(tmp_path, PROMPTS))
    said = [KEPT.fullmatch(line) for line in err.splitlines() if "is kept" in line]
    assert code == 0 and [int(m[2]) for m in said if m] == [1, 2, 3, 4], err
    outs = [json.loads(line) for line in out.splitlines()]
    assert [d["text_id"] for d in outs] == [m[3] for m in said] and all(d["kept"] for d in outs)
    code, listed, _ = run(capsys, "texts", *store, "--json")
    held = {t["id"]: t["tokens"] for t in json.loads(listed)}
    assert held == {d["text_id"]: len(d["text_tokens"]) for d in outs}


STOPPER = """
import os, signal, sys
from vecgpt import stepper
from vecgpt.backends.memory import MemoryStore
from vecgpt.cli import main
how, at, counted = os.environ["STOP"], int(os.environ["STOP_AT"]), [0]
step, upsert = stepper.Stepper.step, MemoryStore.upsert
def stepped(self):
    step(self)
    counted[0] += 1
    if counted[0] == at:
        os.kill(os.getpid(), signal.SIGKILL if how == "kill -9" else signal.SIGINT)
def upserted(self, name, *args, **kwargs):
    if name.endswith(".c"):
        counted[0] += 1
        if counted[0] == at:
            raise KeyboardInterrupt  # Ctrl-C landing in a round that carries writes
    return upsert(self, name, *args, **kwargs)
if how == "ctrl-c mid-write":
    MemoryStore.upsert = upserted
else:
    stepper.Stepper.step = stepped
sys.exit(main(sys.argv[1:]))
"""
N, SEED = 40, 7
# (how, at, drew): stopped at step 30, the first two texts have drawn 30 tokens (the others wait). Their candidates
# rows go out after their 1st, 2nd, 4th, 8th, 16th and 32nd tokens, two writes in one round each time: the 11th write
# is the first text's at its 32nd token
STOPS = [("kill -9", 30, 30), ("ctrl-c", 30, 30), ("ctrl-c mid-write", 11, 32)]


def stopped_batch(tmp_path, model_dir, how: str, at: int) -> tuple[int, str]:
    """`generate --batch --keep` on memory, two texts at a time, stopped by `how` at its `at`-th step (or write of
    candidates rows); its exit code and stderr."""
    argv = ["generate", "--backend", "memory", "--store", str(tmp_path / "kept"), "--model", str(model_dir)]
    argv += ["-n", str(N), "--seed", str(SEED), "--temperature", "0.8", "--no-stop", "--keep", "--at-once", "2"]
    proc = subprocess.run(
        [sys.executable, "-c", STOPPER, *argv, "--batch", batch_file(tmp_path, PROMPTS)],
        env={**env(), "STOP": how, "STOP_AT": str(at)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=default_sigint,
    )
    return proc.returncode, proc.stderr


@pytest.mark.parametrize(("how", "at", "drew"), STOPS)
def test_a_kept_batch_stopped_midway_leaves_each_text_to_end_as_its_solo_run(tmp_path, tiny_model_dir, how, at, drew):
    rc, err = stopped_batch(tmp_path, tiny_model_dir, how, at)
    assert rc == (-signal.SIGKILL if how == "kill -9" else 130), err
    assert "Traceback" not in err, err
    said = [m for m in map(KEPT.fullmatch, err.splitlines()) if m]
    assert [int(m[2]) for m in said] == [1, 2, 3, 4], err  # every text kept before the first step
    store = get_store("memory", path=str(tmp_path / "kept"))
    solo = Config(backend="memory", store={"path": str(tmp_path / "solo")})
    for number, (prompt, m) in enumerate(zip(PROMPTS, said), 1):
        record = store.read_text(m[3])
        drawn = len(record["tokens"]) - record["prompt_len"]
        if number > 2:  # never admitted: its prompt, nothing read
            assert drawn == 0 and record["written"] == 0, record
        elif how == "ctrl-c":  # stopped between steps: every token drawn landed, and a record claiming it
            assert drawn == drew, record
        else:  # lost: at most the tokens after the last record
            assert drew - drawn <= FLUSH_EVERY + 1 and drawn >= FLUSH_EVERY, record
        alone = api.generate_text(
            prompt, n=N, config=solo, model=str(tiny_model_dir), temperature=0.8, seed=SEED, stop=False
        )
        text = Text.resume(Engine(store, model=record["model"]), m[3])
        assert text.tokens == alone["text_tokens"][: len(text.tokens)]
        known = [text.candidates(p) for p in range(text.prompt_len, len(text.tokens))]  # fetched, none read
        assert known == [s["candidates"] for s in alone["steps"][:drawn]]
        text.generate(N - drawn, stop=False)
        assert text.tokens == alone["text_tokens"]
        assert [text.candidates(p) for p in range(text.prompt_len, len(text.tokens))] == [
            s["candidates"] for s in alone["steps"]
        ]  # every logit, bit for bit
    store.close()
