"""Loading GPT-2 checkpoints in the Hugging Face layout, and writing random ones."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from vecgpt import weights
from vecgpt.errors import VecgptError

HP = weights.HParams(n_layer=2, n_head=2, n_embd=8, n_ctx=16, n_vocab=50)


def hf_checkpoint(folder, hp=HP, prefix="transformer.", buffers=True, lm_head=True, tweak=None):
    """A checkpoint as transformers' GPT2LMHeadModel.save_pretrained writes it, made by hand here."""
    rng = np.random.default_rng(0)
    tensors = {prefix + k: rng.standard_normal(s).astype(np.float32) for k, s in weights.expected_shapes(hp).items()}
    if buffers:
        for i in range(hp.n_layer):
            tensors[f"{prefix}h.{i}.attn.bias"] = np.tril(np.ones((1, 1, hp.n_ctx, hp.n_ctx), np.float32))
            tensors[f"{prefix}h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    if lm_head:
        tensors["lm_head.weight"] = tensors[prefix + "wte.weight"].copy()
    if tweak:
        tweak(tensors)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    config = {
        "model_type": "gpt2",
        "n_layer": hp.n_layer,
        "n_head": hp.n_head,
        "n_embd": hp.n_embd,
        "n_positions": hp.n_ctx,
        "vocab_size": hp.n_vocab,
        "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder, tensors


def test_loads_hf_layout_with_prefix_buffers_and_tied_head(tmp_path):
    folder, tensors = hf_checkpoint(tmp_path / "m")
    model = weights.load(str(folder))
    assert model.hparams == HP
    np.testing.assert_array_equal(
        model.params["h"][1]["attn"]["c_attn"]["weight"], tensors["transformer.h.1.attn.c_attn.weight"]
    )
    np.testing.assert_array_equal(model.params["wte"]["weight"], tensors["transformer.wte.weight"])
    assert "bias" not in model.params["h"][0]["attn"]  # mask buffers are ignored


def test_loads_without_prefix(tmp_path):
    folder, _ = hf_checkpoint(tmp_path / "m", prefix="", buffers=False, lm_head=False)
    assert weights.load(str(folder)).hparams.n_layer == 2


@pytest.mark.parametrize(
    "tweak, message",
    [
        (lambda t: t.update({"lm_head.weight": t["lm_head.weight"] + 1}), "lm_head.weight differs"),
        (lambda t: t.pop("transformer.h.1.mlp.c_fc.bias"), "missing tensor h.1.mlp.c_fc.bias"),
        (
            lambda t: t.update({"transformer.h.0.attn.c_proj.weight": np.zeros((8, 9), np.float32)}),
            "h.0.attn.c_proj.weight has shape",
        ),
        (
            lambda t: t.update({"transformer.h.2.ln_1.weight": np.zeros(8, np.float32)}),
            "unexpected tensor h.2.ln_1.weight",
        ),
    ],
)
def test_bad_tensors_are_named(tmp_path, tweak, message):
    folder, _ = hf_checkpoint(tmp_path / "m", tweak=tweak)
    with pytest.raises(VecgptError, match=message):
        weights.load(str(folder))


def test_config_disagreeing_with_shapes(tmp_path):
    folder, _ = hf_checkpoint(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_embd": 16, "n_head": 2}))
    with pytest.raises(VecgptError, match="config.json implies"):
        weights.load(str(folder))


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(VecgptError, match="missing config.json"):
        (tmp_path / "empty").mkdir()
        weights.load(str(tmp_path / "empty"))
    folder, _ = hf_checkpoint(tmp_path / "m")
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00garbage")
    with pytest.raises(VecgptError, match="not a readable safetensors"):
        weights.load(str(folder))
    (folder / "config.json").write_text("{not json")
    with pytest.raises(VecgptError, match="not valid JSON"):
        weights.load(str(folder))


def test_hub_name_offline_gives_one_line_advice(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(VecgptError, match="--model PATH"):
        weights.load("someone/no-such-model-here")


def test_make_model_round_trips_and_has_gpt2_scale(tmp_path):
    hp = weights.HParams(n_layer=3, n_head=4, n_embd=32, n_ctx=20, n_vocab=100)
    weights.make_model(tmp_path / "r", hp, seed=3)
    model = weights.load(str(tmp_path / "r"))
    assert model.hparams == hp
    assert abs(model.params["wte"]["weight"].std() - 0.02) < 0.002
    assert abs(model.params["h"][0]["mlp"]["c_proj"]["weight"].std() - 0.02 / np.sqrt(6)) < 0.002
    from safetensors.numpy import load_file

    names = set(load_file(str(tmp_path / "r" / "model.safetensors")))
    assert names == set(weights.expected_shapes(hp))  # hub names, no mask buffers
    assert weights.load(str(tmp_path / "r")).fingerprint == model.fingerprint


def test_full_gpt2_small_shape_has_124m_parameters():
    hp = weights.HParams(n_layer=12, n_head=12, n_embd=768, n_ctx=1024, n_vocab=50257)
    total = sum(int(np.prod(s)) for s in weights.expected_shapes(hp).values())
    assert total == 124_439_808
