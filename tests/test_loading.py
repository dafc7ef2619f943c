"""Loading a checkpoint as a stream: tensor by tensor, a cached fingerprint, a plan from the shape alone."""

import json
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from procs import ROOT, cli, env, finish, store_config

from vecgpt import api, encoding, loading, weights
from vecgpt.backends.base import get_store
from vecgpt.config import load_config
from vecgpt.errors import VecgptError

from conftest import tiny_params

HP = weights.HParams(n_layer=2, n_head=4, n_embd=16, n_ctx=16, n_vocab=256)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def small(tmp_path, cache):
    return weights.make_model(tmp_path / "m", HP, seed=4)


def test_fingerprint_streamed_equals_the_whole_models_and_is_cached(small, monkeypatch):
    model = weights.load(str(small))
    assert model.fingerprint == weights.fingerprint(model.params)  # the value golden files and manifests hold
    monkeypatch.setattr(weights.Checkpoint, "read", lambda *a: pytest.fail("read the weights again"))
    assert weights.load(str(small)).fingerprint == model.fingerprint
    assert weights.shape(str(small))[0] == HP


def test_a_rewritten_checkpoint_is_fingerprinted_again(small):
    before = weights.load(str(small)).fingerprint
    weights.make_model(small, HP, seed=5)
    assert weights.load(str(small)).fingerprint != before


def test_half_precision_checkpoints_read_as_float32(tmp_path, cache):
    params = weights.make_params(HP, 2)
    weights.save(tmp_path / "h", HP, params, dtype=np.float16)
    model = weights.load(str(tmp_path / "h"), dtype=np.float64)
    flat = weights.flatten(params)
    for name in ("wte.weight", "h.1.mlp.c_fc.weight"):
        np.testing.assert_array_equal(model.tensor(name), flat[name].astype(np.float16).astype(np.float64))


def test_bfloat16_is_widened(tmp_path, cache):
    folder = weights.make_model(tmp_path / "b", HP)
    tensors = weights.flatten(weights.make_params(HP, 1))
    bits = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in tensors.items()}
    header = {k: {"dtype": "BF16", "shape": list(v.shape)} for k, v in bits.items()}
    write_raw(folder / "model.safetensors", header, bits)
    got = weights.load(str(folder)).tensor("h.0.attn.c_attn.weight")
    want = (bits["h.0.attn.c_attn.weight"].astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(got, want)


def write_raw(path, header, arrays):
    """A safetensors file written by hand (BF16, which numpy lacks)."""
    offset, blobs = 0, []
    for name in header:
        blob = arrays[name].tobytes()
        header[name]["data_offsets"] = [offset, offset + len(blob)]
        offset += len(blob)
        blobs.append(blob)
    head = json.dumps(header).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


def test_a_truncated_checkpoint_is_one_line_before_any_read(small):
    path = small / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(VecgptError, match=r"cut short: its header declares [\d,]+ bytes, the file holds") as e:
        weights.load(str(small))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"n_embd": 18}, "not divisible by n_head"),
        ({"n_layer": 3}, "missing tensor h.2"),
        ({"vocab_size": 255}, "wte.weight has shape"),
        ({"n_head": "many"}, "lacks or mangles"),
        ({"n_head": 0}, "a size below 1"),
        ([1, 2], "not a GPT-2 config.json"),
    ],
)
def test_a_config_of_another_shape_is_one_line(small, config, message):
    held = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**held, **config} if isinstance(config, dict) else config))
    with pytest.raises(VecgptError, match=message):
        weights.load(str(small))


@pytest.mark.parametrize("layout", ["four", "three", "five"])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_plan_from_the_shape_is_what_the_matrices_give(small, layout, metric):
    model = weights.load(str(small))
    for name, n, dim in loading.plan(HP, metric, layout)[:-2]:
        w = loading.get(model.params, name, HP.n_head)["weight"]
        w = w.T if name == "wte" else w
        assert (n, dim) == (w.shape[1], encoding.doc_dim(w.shape[0], metric))


def test_a_load_reads_a_layer_at_a_time(small, monkeypatch):
    model, read, real = weights.load(str(small)), [], weights.Checkpoint.read
    monkeypatch.setattr(weights.Checkpoint, "read", lambda self, name, *a: read.append(name) or real(self, name, *a))
    reader = loading.Reader(model)
    for name in loading.matrices(HP, "four"):
        reader.get(name) if name != "wte" else None
    assert len(read) == len(set(read)) == 12 * HP.n_layer  # each layer's tensors once
    assert model._params is None


# A load killed part way, then run again -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    """GPT-2's vocabulary (the prompt's tokens), one narrow layer: few collections, so each store's load is short."""
    hp = weights.HParams(n_layer=1, n_head=4, n_embd=16, n_ctx=16, n_vocab=50257)
    return weights.save(tmp_path_factory.mktemp("one"), hp, tiny_params(hp))


KILLER = """
import os, signal, sys
from vecgpt import loading
from vecgpt.cli import main
batches, at = [0], int(os.environ["KILL_AT_BATCH"])
real = loading.Load.advance
def advance(self, docs, size):
    real(self, docs, size)
    batches[0] += 1
    if batches[0] == at:
        os.kill(os.getpid(), signal.SIGKILL)
loading.Load.advance = advance
sys.exit(main(sys.argv[1:]))
"""


def killed_load(path, model_dir, at_batch: int) -> None:
    """`vecgpt load`, SIGKILLed by itself right after its `at_batch`-th batch of documents went to the store."""
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, "load", "--config", str(path), "--model", str(model_dir)],
        env={**env(), "KILL_AT_BATCH": str(at_batch)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


# turbopuffer's local server (10 s) and Milvus Lite (20 s) pass it too; left out to keep the suite short
@pytest.mark.parametrize(
    "backend", ["memory", "faiss", "sqlite", "duckdb", "pgvector"]
)  # LanceDB, turbopuffer, Milvus pass too (17, 10, 20 s)
def test_a_killed_load_resumes_and_generates_as_a_fresh_one(backend, tmp_path, one_layer):
    tiny_model_dir = one_layer
    (tmp_path / "resumed").mkdir(), (tmp_path / "fresh").mkdir()
    path, options = store_config(backend, tmp_path / "resumed")
    model = weights.load(str(tiny_model_dir))
    layout = load_config(path).layout
    rows = loading.plan(model, "l2", layout)
    before_wte = [name for name, _, _ in rows].index("wte")
    killed_load(path, tiny_model_dir, before_wte + 3)  # every matrix but wte written, and 3 batches of wte
    store = get_store(backend, **options)
    assert store.manifests() == []  # nothing a generate would use
    store.close()
    rc, _, err = finish(cli("load", "--config", str(path), "--model", str(tiny_model_dir)), timeout=300)
    # the part of wte written is dropped, and where wte is not there yet (memory and FAISS save a collection once
    # written; a SQL store may not have committed it) the collection before it: the last one a killed load touched
    # may be cut short, and is written again
    said = re.search(r"resuming: (\d+) of (\d+) collections already written", err)
    assert rc == 0 and said and int(said[1]) in (before_wte - 1, before_wte) and int(said[2]) == len(rows), err
    fresh_path, fresh = store_config(backend, tmp_path / "fresh")
    store = get_store(backend, **fresh)
    loading.push(store, model, "l2", progress=False, layout=layout)
    store.close()
    again = [generate(p, tiny_model_dir) for p in (path, fresh_path)]
    assert again[0] == again[1]  # tokens, and every candidate's logit, bit for bit


def generate(path, model_dir) -> tuple:
    out = api.generate_text("Hello world", n=3, config=load_config(path), model=str(model_dir), stop=False)
    return out["tokens"], json.dumps(out["steps"])


# Faults: a full disk, too little memory ---------------------------------------------------------------------------
DISK_FULL = """
set -u
mount -t tmpfs -o size=1m tmpfs "$STORE"
vecgpt() { "$PY" -m vecgpt.cli "$@" --backend faiss --store "$STORE"; }
vecgpt load --model "$SMALL" >/dev/null || exit 90
vecgpt load --model "$BIG" 2>"$OUT/full.err"; echo $? >"$OUT/full.rc"
vecgpt ls >"$OUT/ls.out"
"$PY" -c "$CHECK" "$STORE" "$SMALL" >"$OUT/check.out" 2>&1
mount -o remount,size=16m "$STORE"
vecgpt load --model "$BIG" 2>"$OUT/again.err" >/dev/null; echo $? >"$OUT/again.rc"
"$PY" -c "$CHECK" "$STORE" "$BIG" >>"$OUT/check.out" 2>&1
"""
CHECK = """
import sys
import numpy as np
from vecgpt import encoding, loading, weights
from vecgpt.backends.base import get_store
store, model = get_store("faiss", path=sys.argv[1]), weights.load(sys.argv[2])
key = loading.store_fingerprint(model, "ip", "five")
assert store.read_manifest(key)
for name in loading.matrices(model.hparams, "five"):
    p = loading.get(model.params, name, model.hparams.n_head)
    rows = encoding.encode_rows(p["weight"].T if name == "wte" else p["weight"], p.get("bias"), "ip")[0]
    held = store.fetch(loading.collection(key, name), np.arange(len(rows)))
    assert np.array_equal(held, rows), name
print("intact", sys.argv[2])
"""


def test_a_full_disk_is_one_line_damages_nothing_and_the_rerun_resumes(tmp_path, cache, one_layer):
    """On a real 1 MB tmpfs (a mount namespace of our own, no root): the model held stays intact."""
    pytest.importorskip("faiss")
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no unprivileged mount namespaces here (unshare -rm)")
    small = weights.save(tmp_path / "small", HP, tiny_params(HP))
    (tmp_path / "store").mkdir()
    names = {"STORE": tmp_path / "store", "SMALL": small, "BIG": one_layer, "OUT": tmp_path, "PY": sys.executable}
    extra = {**{k: str(v) for k, v in names.items()}, "CHECK": CHECK}
    done = subprocess.run(["unshare", "-rm", "bash", "-c", DISK_FULL], env={**env(), **extra}, cwd=ROOT, timeout=300)
    assert done.returncode == 0
    err = (tmp_path / "full.err").read_text()
    assert (tmp_path / "full.rc").read_text().strip() == "2", err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and re.fullmatch(
        r"vecgpt: error: the disk filled while writing wte: the rest of this load is [\d.]+ MB .* it resumes", lines[0]
    ), err
    assert str(small) in (tmp_path / "ls.out").read_text() and str(one_layer) not in (tmp_path / "ls.out").read_text()
    again = (tmp_path / "again.err").read_text()
    assert (tmp_path / "again.rc").read_text().strip() == "0" and "resuming: " in again, again
    assert (tmp_path / "check.out").read_text().split() == ["intact", str(small), "intact", str(one_layer)]


def test_a_model_larger_than_free_memory_is_refused_before_writing(tmp_path, small, monkeypatch):
    from vecgpt.cli import attention

    monkeypatch.setattr(attention, "available_bytes", lambda: 10_000)
    store = get_store("memory", path=str(tmp_path / "memory"))
    with pytest.raises(
        VecgptError, match=r"memory holds every vector in memory: this model needs [\d.]+ MB, 0.0 MB is free"
    ):
        loading.push(store, weights.load(str(small)), progress=False)
    assert store.collections() == []


# load --dry-run -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", list(weights.SIZES))
def test_dry_run_of_every_size_reads_no_weights(size, cache, capsys, monkeypatch):
    from vecgpt.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(weights, "resolve", lambda *a, **k: pytest.fail("looked for the model's files"))
    assert main(["load", "--dry-run", "--model", size, "--backend", "faiss", "--metric", "ip"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = loading.plan(weights.SIZES[size], "ip", "five")
    assert lines[1] == f"documents: {sum(n for _, n, _ in rows):,} in {len(rows)} collections (ip, layout five)"
    assert lines[3] == "time: no faiss load measured on this machine yet (each completed load records its rate)"


def test_dry_run_quotes_the_rate_measured_and_a_folder_by_its_config(small, cache, capsys):
    from vecgpt.cli import main

    (small / "model.safetensors").unlink()  # config.json alone
    loading.record_rate("lancedb", 100_000, 200_000_000, 10.0)
    assert main(["load", "--dry-run", "--model", str(small), "--backend", "lancedb"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"model: {small} (2 layers, 16 wide, 4 heads")
    assert lines[3].startswith("time: about 0 s at 20.0 MB/s (10,000 documents/s), the largest lancedb load")


def test_the_progress_bar_shows_rate_and_time_left_only_when_asked_or_on_a_terminal(tmp_path, small, capsys):
    model = weights.load(str(small))
    for progress, where in ((None, "quiet"), (True, "bar")):
        loading.push(get_store("memory", path=str(tmp_path / where)), model, progress=progress)
        err = capsys.readouterr().err
        if progress is None:  # stderr is no terminal here
            assert err == ""
        else:
            assert re.search(
                r"load: 100%\|.*\| [\d.]+k?/[\d.]+k? \[[\d:]+<[\d:]+, [\d.]+k?doc/s, [\d.]+ MB/s\]", err
            ), err
