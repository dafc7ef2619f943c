"""Texts that any process can continue, step back, retry and branch, on every backend.

The resume tests drive the real CLI in separate processes (see procs.py); the others use vecgpt.text
directly. Equality here is exact: a resumed text reads what the uninterrupted one read, in the same
order, from keys and values the store holds bit for bit.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from procs import ROOT, cli, env, finish, store_config, wait_for

from vecgpt import api, tokenizer, tolerance, weights
from vecgpt.backends.base import get_store, one_process
from vecgpt.config import auto_layout, load_config
from vecgpt.engine import Engine
from vecgpt.errors import VecgptError
from vecgpt.loading import drop, push, store_fingerprint
from vecgpt.sampling import choose, draw
from vecgpt.text import FLUSH_EVERY, Text, gc_texts, list_texts

from conftest import SLOW, tiny_params

PROMPT = "Hello world"
SAMPLING = {"temperature": 0.8, "seed": 5}  # every CLI run here samples so, to its -n (SAMPLED: as arguments)
SAMPLED = ["--temperature", str(SAMPLING["temperature"]), "--seed", str(SAMPLING["seed"]), "--no-stop"]
LONG = weights.HParams(n_layer=2, n_head=4, n_embd=64, n_ctx=256, n_vocab=50257)  # room for a 200-token text


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    return weights.load(str(weights.save(tmp_path_factory.mktemp("long"), LONG, tiny_params(LONG, seed=3))))


def run_json(*argv: str) -> dict:
    rc, out, err = finish(cli(*argv), timeout=300)
    assert rc == 0, err
    return json.loads(out)


def uninterrupted(args: list[str], n: int) -> list[int]:
    """The text of `generate PROMPT -n n *args *SAMPLED` run whole, in this process (what the CLI calls): one
    process start fewer a test (Milvus Lite's take seconds)."""
    named = dict(zip(args[::2], args[1::2]))  # --config C --model M [--yes]
    assert set(named) == {"--config", "--model"}, args
    config = load_config(named["--config"])
    whole = api.generate_text(PROMPT, n, config, named["--model"], **SAMPLING, stop=False)
    return whole["prompt_tokens"] + whole["tokens"]


def loaded_config(backend, tmp_path, pushed, model) -> tuple:
    """store_config's config and options, its store holding `model` where a copy can (conftest.Pushed) as the CLI
    loads it (l2, the config's layout): the processes find it loaded."""
    config, options = store_config(backend, tmp_path)
    pushed.copy_to(options.get("path"), backend, model, "l2", auto_layout(backend, options))
    return config, options


@pytest.mark.parametrize("backend", ["memory", "faiss"])  # every store: the Ctrl-C and kill -9 resumes below
def test_a_kept_text_continues_in_another_process(backend, tmp_path, pushed, tiny_model, tiny_model_dir):
    """A kept text that ended cleanly, continued by a second process: the first's tokens, then the rest as one
    uninterrupted run. The store's part (its keys read back by another process) is the resume tests' on every store."""
    config, _ = loaded_config(backend, tmp_path, pushed, tiny_model)
    args = ["--config", str(config), "--model", str(tiny_model_dir), "--yes"]  # --yes: a billed store loads too
    a = run_json("generate", PROMPT, "-n", "5", "--keep", "--json", *args, *SAMPLED)
    assert a["kept"] and len(a["tokens"]) == 5
    b = run_json("generate", "--resume", a["text_id"], "-n", "5", "--json", *args)
    assert b["positions_reread"] == 0 and b["text_id"] == a["text_id"]
    assert b["text_tokens"] == uninterrupted(args, 10)
    assert a["tokens"] + b["tokens"] == b["text_tokens"][-10:]


def interrupt_a_writer(backend, tmp_path, pushed, model, sig: int) -> tuple[list[str], int, str, dict]:
    """`generate -n 200 --keep` stopped by `sig` once at least 4 tokens are drawn: CLI args, its exit code and
    stderr, and the text's record as the store holds it then. A store one process at a time may open is watched
    through the writer's output (each token's text as it is drawn), and opened once the writer has stopped."""
    config, options = loaded_config(backend, tmp_path, pushed, model)
    args = ["--config", str(config), "--model", model.source, "--yes"]
    writer = cli("generate", PROMPT, "-n", "200", "--keep", *args, *SAMPLED)
    alone = one_process(backend, options)
    store = None if alone else get_store(backend, **options)
    try:
        if alone:
            assert printed(writer, len(PROMPT) + 40, timeout=120), finish(writer)[2]
        else:
            assert wait_for(lambda: progressed(store), timeout=120, step=0.005), finish(writer)[2]
        assert writer.poll() is None, "the writer finished before it could be stopped"
        writer.send_signal(sig)
        rc, _, err = finish(writer)
        store = store or get_store(backend, **options)
        (text_id,) = store.texts()
        return args, rc, err, {**store.read_text(text_id), "id": text_id}
    finally:
        if store is not None:
            store.close()


def progressed(store) -> bool:  # a text's record holds 4 tokens drawn
    records = [store.read_text(t) for t in store.texts()]
    return any(r and len(r["tokens"]) >= r["prompt_len"] + 4 for r in records)


def printed(proc, chars: int, timeout: float) -> bool:
    """Whether the process printed `chars` characters within `timeout` seconds (its output read meanwhile)."""
    got, deadline = 0, time.monotonic() + timeout
    while got < chars and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            piece = os.read(proc.stdout.fileno(), chars - got)
            if not piece:
                return False
            got += len(piece.decode(errors="replace"))
    return got >= chars


def test_after_kill_9_a_resume_reads_again_only_what_was_lost(backend, tmp_path, pushed, long_model):
    args, _, _, held = interrupt_a_writer(backend, tmp_path, pushed, long_model, signal.SIGKILL)
    b = run_json("generate", "--resume", held["id"], "-n", "3", "--json", *args)
    assert b["text_tokens"][: len(held["tokens"])] == held["tokens"]  # nothing the record held is lost
    assert b["positions_reread"] == len(held["tokens"]) - 1 - held["written"]
    assert b["text_tokens"] == uninterrupted(args, len(b["text_tokens"]) - len(b["prompt_tokens"]))


def test_ctrl_c_leaves_a_kept_text_complete(backend, tmp_path, pushed, long_model):
    args, rc, err, held = interrupt_a_writer(backend, tmp_path, pushed, long_model, signal.SIGINT)
    assert rc == 130 and "interrupted" in err and "Traceback" not in err, err
    # every drawn token but the last was read and landed; the last too if the signal came between its read
    # (which also files the next position's candidates) and the next draw
    assert len(held["tokens"]) - 1 <= held["written"] <= len(held["tokens"])
    b = run_json("generate", "--resume", held["id"], "-n", "2", "--json", *args)
    assert b["positions_reread"] == 0
    assert b["text_tokens"] == uninterrupted(args, len(b["text_tokens"]) - len(b["prompt_tokens"]))


KILLER = """
import os, signal, sys
from vecgpt import text_record
from vecgpt.cli import main
at, drawn, keep_up = int(os.environ["KILL_AT_TOKEN"]), [0], text_record.Record.keep_up
def kept_up(self, *args):
    keep_up(self, *args)
    drawn[0] += 1
    if drawn[0] == at:
        os.kill(os.getpid(), signal.SIGKILL)
text_record.Record.keep_up = kept_up
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("store_backend", ["memory", "faiss", "lancedb"])  # LanceDB: writes from a thread of their own
def test_kill_9_loses_only_the_tokens_after_the_last_record_and_a_resume_equals_the_solo_run(
    store_backend, tmp_path, pushed, long_model
):
    """`generate -n 60 --keep` SIGKILLs itself once its 40th token is drawn (its writes queued so far, the record
    perhaps among them): the record in the store claims only what it holds; a resume fetches those positions' keys and
    candidates, reads the rest again and ends as the uninterrupted run, token for token and logit for logit."""
    config, options = loaded_config(store_backend, tmp_path, pushed, long_model)
    argv = ["generate", PROMPT, "-n", "60", "--keep", "--config", str(config), "--model", long_model.source, *SAMPLED]
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, *argv], env={**env(), "KILL_AT_TOKEN": "40"}, cwd=ROOT, capture_output=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    store = get_store(store_backend, **options)
    (text_id,) = store.texts()
    held = store.read_text(text_id)
    drawn = len(held["tokens"]) - held["prompt_len"]
    if not getattr(store, "concurrent", False):  # writes ride with the rounds: the record is at most a flush behind
        assert 40 - FLUSH_EVERY - 1 <= drawn < 40, held
    solo = config.with_name("solo.toml")
    solo.write_text(config.read_text().replace(str(tmp_path / store_backend), str(tmp_path / "solo")))
    pushed.copy_to(str(tmp_path / "solo"), store_backend, long_model, "l2", auto_layout(store_backend, options))
    alone = api.generate_text(PROMPT, 60, load_config(solo), long_model.source, temperature=0.8, seed=5, stop=False)
    text = Text.resume(Engine(store, model=held["model"]), text_id)
    assert text.tokens == alone["text_tokens"][: len(text.tokens)]
    known = [text.candidates(p) for p in range(text.prompt_len, len(text.tokens))]
    assert known == [s["candidates"] for s in alone["steps"][:drawn]]  # fetched: every claimed row is there
    text.generate(60 - drawn, stop=False)
    assert text.tokens == alone["text_tokens"]
    n_held = len(held["tokens"])  # read again: the held positions without keys, then each token drawn but the last
    assert text.cost["positions_read"] == n_held - min(held["written"], n_held - 1) + 60 - drawn - 1
    assert [text.candidates(p) for p in range(text.prompt_len, len(text.tokens))] == [
        s["candidates"] for s in alone["steps"]
    ]
    store.close()


@pytest.fixture
def engine_of(make_store):
    def make(backend, model):
        store = make_store.loaded(backend, model, "l2")
        return Engine(store, model=store_fingerprint(model, "l2"))

    return make


def test_loading_and_dropping_another_model_leaves_a_text_unchanged(backend, engine_of, tiny_model, long_model):
    engine = engine_of(backend, tiny_model)
    ids = tokenizer.encode(PROMPT)
    with Text.start(engine, ids, temperature=0.8, seed=2) as alone:
        alone.generate(9, stop=False)
    with Text.start(engine, ids, temperature=0.8, seed=2) as text:
        text.generate(3, stop=False)
        push(engine.store, long_model, "l2", progress=False)
        text.generate(3, stop=False)
        drop(engine.store, store_fingerprint(long_model, "l2"))
        text.generate(3, stop=False)
        assert text.tokens == alone.tokens


def test_step_back_and_retry_read_nothing_again(backend, engine_of, tiny_model):
    engine = engine_of(backend, tiny_model)
    with Text.start(engine, tokenizer.encode(PROMPT), temperature=0.8, seed=4) as text:
        text.generate(6, stop=False)
        first, p = list(text.tokens), text.prompt_len + 3
        text.step_back(p)
        assert text.tokens == first[:p] and text.cost["positions_read"] == 0
        text.generate(3, stop=False)  # the same draws at the same positions: the same tokens
        assert text.tokens == first and text.cost["positions_read"] == 2
        last = len(text.tokens) - 1
        token = text.retry(seed=11)
        want = choose(text._candidates[last], 0.8, 40, draw(11, last))
        assert token == want == text.tokens[-1] and text.cost["positions_read"] == 0
        assert text.settings["seed"] == 11


def test_branching_late_reads_only_the_positions_after_the_branch(backend, engine_of, long_model):
    engine = engine_of(backend, long_model)
    n = 60 if backend in SLOW else 200  # the text's length; conftest.SLOW: a shorter one
    ids = (tokenizer.encode(PROMPT) * n)[: n - 15]  # read in blocks: the branch is late, the test quick
    with Text.start(engine, ids) as text:
        text.generate(15, stop=False)
        p = n - 10
        second = text.candidates(p)[1][0]
        with text.branch(p, second) as child:
            assert not {"key_write", "restore", "key_search"} & set(text.cost["by_kind"])  # no key passed the client
            assert child.tokens == text.tokens[:p] + [second]
            child.generate(10, stop=False)
            assert child.cost["positions_read"] == 10  # 190..199: the branch's token and the ones drawn after it
            assert len(child.tokens) == n + 1 and text.tokens[:p] == child.tokens[:p]
            check_against_numpy(child, long_model, backend)
        assert len(text.tokens) == n  # the parent is untouched


def check_against_numpy(text: Text, model, backend: str) -> None:
    """Each generated position's candidates against float64 numpy on the same tokens, by the derived rule."""
    m64 = weights.load(model.source, dtype=np.float64)
    exact, tol = tolerance.block_tolerance(m64, text.tokens[:-1], "l2", tolerance.unit_roundoff(backend))
    for p in range(len(text.tokens) - 10, len(text.tokens)):
        assert not tolerance.disagreements(text._candidates[p], exact[p - 1], 40, tol[p - 1]), p


def test_two_processes_never_interleave_edits(backend, engine_of, tiny_model, make_store):
    engine = engine_of(backend, tiny_model)
    text = Text.start(engine, tokenizer.encode(PROMPT), temperature=0.8, seed=1)
    text.generate(2, stop=False)
    other_store = make_store(backend)
    other = Text.resume(Engine(other_store, model=engine.key), text.id)
    text.generate(2, stop=False)  # the other copy is now behind: its next operation catches up first
    other.generate(2, stop=False)
    with Text.start(engine, tokenizer.encode(PROMPT), temperature=0.8, seed=1) as alone:
        alone.generate(6, stop=False)
    assert other.tokens == alone.tokens
    if hasattr(other_store, "text_lock"):
        with other_store.text_lock(text.id), pytest.raises(VecgptError, match="open in another process"):
            text.generate(1)
    text.close()
    with pytest.raises(VecgptError, match="closed by another process"):
        other.generate(1)


def test_texts_are_listed_and_abandoned_ones_collected(backend, engine_of, tiny_model):
    engine = engine_of(backend, tiny_model)
    old = Text.start(engine, tokenizer.encode(PROMPT))
    old.generate(2)
    time.sleep(1.2)
    new = Text.start(engine, tokenizer.encode(PROMPT))
    listed = {t["id"]: t for t in list_texts(engine.store)}
    assert listed[old.id]["tokens"] == len(old.tokens) and listed[old.id]["model"] == engine.key
    assert listed[old.id]["bytes"] > 0 and listed[old.id]["age_s"] >= 1
    assert gc_texts(engine.store, older_than_s=1.0) == [old.id]
    assert [t["id"] for t in list_texts(engine.store)] == [new.id]
    assert f"text-{old.id}" not in engine.store.collections()
    new.close()
    assert list_texts(engine.store) == []
