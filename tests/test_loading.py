"""Loading a checkpoint as a stream: tensor by tensor, a cached fingerprint, a plan from the shape alone."""

import json

import numpy as np
import pytest

from vecgpt import encoding, loading, weights
from vecgpt.errors import VecgptError

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
    ],
)
def test_a_config_of_another_shape_is_one_line(small, config, message):
    held = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**held, **config}))
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
