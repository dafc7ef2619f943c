"""Fault injection: a load killed with SIGKILL, a store stopped mid-text, two generations at once, a damaged folder.

Each test drives the real CLI in subprocesses (this worktree's code, via PYTHONPATH) against real stores:
the shared pgvector and local turbopuffer test servers, or a dedicated one where the test stops it.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from procs import ROOT, assert_one_line_error, cli, env, finish, needs, store_config, wait_for, write_config

from vecgpt import api, encoding, weights
from vecgpt.backends.base import get_store, worst_case_s
from vecgpt.config import Config, load_config
from vecgpt.engine import Engine
from vecgpt.errors import VecgptError
from vecgpt.loading import collection, get, ln_table, matrices, store_fingerprint

from conftest import tiny_params

pytestmark = pytest.mark.fault

LONG = weights.HParams(n_layer=4, n_head=4, n_embd=64, n_ctx=256, n_vocab=50257)  # a text that takes a moment
PROMPT = "Hello world"  # numpy's top-2 gaps on the tiny model: >= 0.048 for 3 steps
GREEDY = ("--temperature", "0")  # the CLI samples by default; these runs are compared with greedy api runs


@pytest.fixture(scope="module")
def long_model(tmp_path_factory) -> Path:
    return weights.save(tmp_path_factory.mktemp("long"), LONG, tiny_params(LONG))


def expected_rows(model: weights.Model, layout: str) -> dict[str, np.ndarray]:
    """Every collection a load of `model` writes ("l2", in `layout`), as float32 rows, by the name the store gives it."""
    out = {}
    for name in matrices(model.hparams, layout):
        p = get(model.params, name, model.hparams.n_head)
        out[name] = encoding.encode_rows(p["weight"].T if name == "wte" else p["weight"], p.get("bias"), "l2")[0]
    out["wpe"], out["ln"] = model.params["wpe"]["weight"], ln_table(model)
    key = store_fingerprint(model, "l2", layout)
    return {collection(key, name): np.asarray(rows, np.float32) for name, rows in out.items()}


def assert_holds_exactly(store, model: weights.Model, layout: str) -> None:
    """The store holds the model's full encoding, row for row, and not a row more."""
    expected = expected_rows(model, layout)
    assert sorted(n for n in store.collections() if not n.startswith("text-")) == sorted(expected)
    for name, rows in expected.items():
        assert store.count(name) == len(rows), name
        np.testing.assert_array_equal(store.fetch(name, np.arange(len(rows))), rows, err_msg=name)


def assert_greedy_matches_numpy(config, model_dir: Path, n: int = 3) -> list[int]:
    """Greedy tokens through the store equal numpy's, at steps where numpy's top-2 gap is far above any store error."""
    ref = api.generate_reference(PROMPT, n=n, model=str(model_dir), stop=False)
    gaps = [s["candidates"][0][1] - s["candidates"][1][1] for s in ref["steps"]]
    assert min(gaps) > 1e-2, f"precondition: numpy's top-2 gaps {gaps} must exceed 1e-2 (a float32 store errs ~1e-5)"
    out = api.generate_text(PROMPT, n=n, config=config, model=str(model_dir), stop=False)
    assert out["tokens"] == ref["tokens"]
    return out["tokens"]


# 1. kill -9 during a load ------------------------------------------------------------------------------------
def kill_midway(load: tuple, store, tries: int = 3) -> int:
    """Start the load, SIGKILL it once it has written a collection; again if it finished first. The try that landed."""
    for attempt in range(1, tries + 1):
        proc = cli(*load)
        wait_for(lambda p=proc: p.poll() is not None or store.collections(), timeout=120, step=0.005)
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode in (0, -signal.SIGKILL), err
        if proc.returncode == -signal.SIGKILL and not store.manifests():
            return attempt
        subprocess.run(
            [sys.executable, "-m", "vecgpt.cli", "drop", *load[1:]],
            env=env(),
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    pytest.fail(f"the load finished before the kill in {tries} tries")


@pytest.mark.parametrize("backend", ["memory", "faiss", "lancedb", "pgvector", "turbopuffer"])
def test_a_load_killed_midway_serves_no_model_and_the_same_load_then_completes(backend, tmp_path, tiny_model_dir):
    path, options = store_config(backend, tmp_path)
    load = ("load", "--config", str(path), "--model", str(tiny_model_dir))
    observer = get_store(backend, **options)
    kill_midway(load, observer)
    with pytest.raises(VecgptError, match="holds no model"):
        Engine(observer)
    observer.close()
    rc, _, err = finish(cli(*load), timeout=120)
    assert rc == 0, err
    store = get_store(backend, **options)
    try:
        assert_holds_exactly(store, weights.load(str(tiny_model_dir)), load_config(path).layout)
    finally:
        store.close()
    assert_greedy_matches_numpy(load_config(path), tiny_model_dir)


# 2. the store stops in the middle of a text -----------------------------------------------------------------
STOP_OPTIONS = {"timeout": 1.0, "max_retries": 2}  # gives up within 3 * 1 + 0.75 s: keeps the test short


@pytest.mark.parametrize("backend", ["pgvector", "turbopuffer"])
def test_default_timeout_and_retries_give_up_within_30_seconds(backend):
    needs(backend)
    import importlib
    import inspect

    defaults = {
        k: p.default
        for k, p in inspect.signature(importlib.import_module(f"vecgpt.backends.{backend}").connect).parameters.items()
        if k in ("timeout", "max_retries")
    }
    assert worst_case_s(**defaults) < 30


def wait_for_text(proc: subprocess.Popen, backend: str, options: dict) -> None:
    """Until the generation has opened its text and gone some tokens into it."""
    observer = get_store(backend, **options)
    try:
        assert wait_for(
            lambda: proc.poll() is not None or any(n.startswith("text-") for n in observer.collections()),
            timeout=60,
            step=0.05,
        )
    finally:
        observer.close()
    time.sleep(0.3)
    assert proc.poll() is None, f"the text ended before the fault: {proc.communicate()[1]}"


def generate_until_stopped(backend: str, tmp_path: Path, options: dict, model_dir: Path, stop) -> None:
    """Load, start a long generation, stop the store once the text exists; the CLI must fail in one line, in time."""
    path = write_config(tmp_path / "s.toml", backend, options)
    api.open_engine(load_config(path), weights.load(str(model_dir)), progress=False).store.close()
    proc = cli("generate", "--config", str(path), "--model", str(model_dir), "-n", "200", "--no-stop", PROMPT)
    wait_for_text(proc, backend, options)
    assert proc.poll() is None, "the text ended before the store was stopped"
    stop()
    stopped = time.monotonic()
    rc, _, err = finish(proc, timeout=60)
    assert_one_line_error(rc, err)
    assert time.monotonic() - stopped < worst_case_s(**STOP_OPTIONS) + 5  # 5 s: process start and exit
    return err


def pg_ctl(server, action: str, mode: str = "fast") -> None:
    import pgserver

    pgserver.pg_ctl(["-w", "-m", mode, action], pgdata=server.pgdata, user=server.system_user)


def test_postgresql_restarted_mid_text_loses_no_token_crashed_or_stopped_fails_in_one_line(
    tmp_path, long_model, monkeypatch
):
    needs("pgvector")
    import tempfile
    import warnings

    monkeypatch.delenv("VECGPT_PG_DSN", raising=False)  # it would win over the dedicated server's DSN
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pgserver = pytest.importorskip("pgserver")

        server = pgserver.get_server(tempfile.mkdtemp(prefix="vecgpt-fault-pg-"), cleanup_mode="delete")
    options = {"dsn": server.get_uri(), "schema": "fault"}
    try:  # restarted within the retries (6: up to 15.75 s of backoff): the text goes on where it was
        path = write_config(tmp_path / "s.toml", "pgvector", {**options, "timeout": 1.0, "max_retries": 6})
        api.open_engine(load_config(path), weights.load(str(long_model)), progress=False).store.close()
        generation = ("generate", "--config", str(path), "--model", str(long_model), "-n", "40", "--no-stop")
        generation += ("--json", *GREEDY, PROMPT)
        proc = cli(*generation)
        wait_for_text(proc, "pgvector", options)
        pg_ctl(server, "restart")
        rc, out, err = finish(proc)
        assert rc == 0, err
        alone = api.generate_text(PROMPT, n=40, config=load_config(path), model=str(long_model), stop=False)
        assert json.loads(out)["tokens"] == alone["tokens"]
        # a crash (immediate stop, WAL replayed at restart) keeps every key whose write returned: same tokens
        proc = cli(*generation)
        wait_for_text(proc, "pgvector", options)
        pg_ctl(server, "restart", "immediate")
        rc, out, err = finish(proc)
        assert rc == 0, err
        assert json.loads(out)["tokens"] == alone["tokens"]
        # stopped for good: one line once the retries are spent
        err = generate_until_stopped(
            "pgvector", tmp_path, {**options, **STOP_OPTIONS}, long_model, lambda: pg_ctl(server, "stop")
        )
    finally:
        server.cleanup()
    assert "PostgreSQL" in err


def test_local_turbopuffer_killed_mid_text_is_a_one_line_error_in_bounded_time(tmp_path, long_model, monkeypatch):
    needs("turbopuffer")
    monkeypatch.setenv("TURBOPUFFER_API_KEY", "local-test-key")
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    server = cli("tpuf-local", "--port", "0", "--api-key", "local-test-key")
    try:
        url = server.stdout.readline().split(" on ")[1].split()[0]
        err = generate_until_stopped(
            "turbopuffer",
            tmp_path,
            {"base_url": url, "prefix": "fault-", **STOP_OPTIONS},
            long_model,
            lambda: server.send_signal(signal.SIGKILL),
        )
    finally:
        server.kill()
        server.communicate()
    assert "turbopuffer" in err


# 3. two processes generate on one store at once ------------------------------------------------------------
@pytest.mark.parametrize("backend", ["memory", "faiss", "lancedb", "pgvector", "turbopuffer"])
def test_two_generations_at_once_each_get_the_tokens_they_get_alone(backend, tmp_path, tiny_model_dir):
    """Both start on an empty store, so both go to load it: the load lock lets one load while the other waits.
    turbopuffer has no lock to take: it starts loaded, and the two processes' slot gates meet 429s and retry."""
    path, options = store_config(backend, tmp_path)
    if backend == "turbopuffer":
        options.pop("max_retries")  # the defaults: 429s are expected here
        write_config(path, backend, options)
        api.open_engine(load_config(path), weights.load(str(tiny_model_dir)), progress=False)
    argv = (
        "generate",
        "--config",
        str(path),
        "--model",
        str(tiny_model_dir),
        "-n",
        "8",
        "--no-stop",
        "--json",
        *GREEDY,
    )
    # prompt blocks of 20+ tokens: 20+ kNN subqueries per matrix search, more slots than a namespace has
    prompts = (
        "But soft, what light through yonder window breaks? It is the east, and Juliet is the sun.",
        "Now is the winter of our discontent made glorious summer by this sun of York.",
    )
    runs = [cli(*argv, prompt) for prompt in prompts]
    results = [finish(p, timeout=120) for p in runs]
    for rc, _, err in results:
        assert rc == 0, err
    alone = [
        api.generate_text(prompt, n=8, config=load_config(path), model=str(tiny_model_dir), stop=False)["tokens"]
        for prompt in prompts
    ]
    assert [json.loads(out)["tokens"] for _, out, _ in results] == alone


# 4. a damaged store folder ------------------------------------------------------------------------------------
def largest_file(folder: Path) -> Path:
    return max(
        (p for p in folder.rglob("*") if p.is_file() and p.parent.name != "manifests"), key=lambda p: p.stat().st_size
    )


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garble(path: Path) -> None:  # the first and last 64 bytes: headers, footers, lengths
    data = bytearray(path.read_bytes())
    data[:64] = data[-64:] = bytes(range(64, 128))[: min(64, len(data))]
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncate the largest file": lambda root: truncate(largest_file(root)),
    "garble the largest file": lambda root: garble(largest_file(root)),
    "delete the largest file": lambda root: largest_file(root).unlink(),
    "garble the manifest": lambda root: garble(next(root.glob("manifests/*.json"))),
    "delete the token table": lambda root: shutil.rmtree(next(p for p in root.rglob("*.wte*") if p.is_dir())),
}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory, tiny_model_dir):
    """A store folder holding the tiny model, per backend, to copy and damage."""
    folders = {}

    def get_folder(backend: str) -> Path:
        if backend not in folders:
            folder = tmp_path_factory.mktemp(backend) / "store"
            api.open_engine(
                load_config(write_config(folder.parent / "s.toml", backend, {"path": str(folder)})),
                weights.load(str(tiny_model_dir)),
                progress=False,
            ).store.close()
            folders[backend] = folder
        return folders[backend]

    return get_folder


@pytest.mark.parametrize("backend", ["memory", "faiss", "lancedb"])
def test_a_damaged_store_folder_is_a_one_line_error(backend, tmp_path, loaded, tiny_model_dir, capsys):
    from vecgpt.cli import main

    needs(backend)
    for what, damage in DAMAGE.items():
        root = tmp_path / what.replace(" ", "-")
        shutil.copytree(loaded(backend), root)
        damage(root)
        config = write_config(tmp_path / "s.toml", backend, {"path": str(root)})
        capsys.readouterr()
        rc = main(["generate", "--config", str(config), "--model", str(tiny_model_dir), "-n", "2", PROMPT])
        err = capsys.readouterr().err
        assert_one_line_error(rc, err)


# 5. the disk fills while a kept text writes -------------------------------------------------------------------
TEXT_DISK_FULL = """
set -u
mount -t tmpfs -o size=64m tmpfs "$STORE"
vecgpt() { "$PY" -m vecgpt.cli "$@" --backend faiss --store "$STORE" --model "$MODEL"; }
vecgpt load >/dev/null || exit 90
used=$(df --output=used -B1 "$STORE" | tail -1)
mount -o remount,size=$((used + 262144)) "$STORE"
vecgpt generate "$PROMPT" -n "$N" --keep --temperature 0.8 --seed 5 --no-stop >/dev/null 2>"$OUT/full.err"
echo $? >"$OUT/full.rc"
mount -o remount,size=64m "$STORE"
"$PY" -c "$RESUME" "$STORE" "$N" >"$OUT/resumed.json"
"""
RESUME = """
import json, sys
from vecgpt.backends.base import get_store
from vecgpt.engine import Engine
from vecgpt.text import Text
store, n = get_store("faiss", path=sys.argv[1]), int(sys.argv[2])
(text_id,) = store.texts()
held = store.read_text(text_id)
text = Text.resume(Engine(store, model=held["model"]), text_id)
known = [text.candidates(p) for p in range(text.prompt_len, len(text.tokens))]
text.generate(n - (len(text.tokens) - text.prompt_len), stop=False)
every = [text.candidates(p) for p in range(text.prompt_len, len(text.tokens))]
print(json.dumps({"id": text_id, "held": held["tokens"], "known": known, "tokens": text.tokens, "every": every}))
"""


def test_a_full_disk_mid_text_is_one_line_and_loses_no_acknowledged_token(tmp_path, long_model):
    """On a real tmpfs (a mount namespace of our own, no root) with 256 KiB free once the model is loaded: the text's
    writes fill it; the record and every row it claims stay; with room, the resumed text ends as the solo run."""
    needs("faiss")
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no unprivileged mount namespaces here (unshare -rm)")
    (tmp_path / "store").mkdir()
    n, names = 150, {"STORE": tmp_path / "store", "MODEL": long_model, "OUT": tmp_path, "PY": sys.executable}
    extra = {**{k: str(v) for k, v in names.items()}, "N": str(n), "PROMPT": PROMPT, "RESUME": RESUME}
    done = subprocess.run(["unshare", "-rm", "bash", "-c", TEXT_DISK_FULL], env={**env(), **extra}, timeout=300)
    assert done.returncode == 0
    err = (tmp_path / "full.err").read_text()
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    lines, text_id, held = err.splitlines(), resumed["id"], resumed["held"]
    assert (tmp_path / "full.rc").read_text().strip() == "2" and len(lines) == 2 and "is kept" in lines[0], err
    assert lines[1] == (
        f"vecgpt: error: the disk filled while writing text {text_id}: its last record ({len(held)} tokens) and "
        f"every row it claims are intact; free room and continue it with `vecgpt generate --resume {text_id}`"
    )
    solo = Config(backend="faiss", store={"path": str(tmp_path / "solo")})  # the CLI's: FAISS's own metric
    alone = api.generate_text(PROMPT, n, solo, str(long_model), temperature=0.8, seed=5, stop=False)
    drawn = len(held) - len(alone["prompt_tokens"])
    assert 0 < drawn < n and held == alone["text_tokens"][: len(held)]  # the kept part of the text, as it was
    assert resumed["known"] == [s["candidates"] for s in alone["steps"][:drawn]]  # its candidates fetched, every bit
    assert resumed["tokens"] == alone["text_tokens"]
    assert resumed["every"] == [s["candidates"] for s in alone["steps"]]
