"""Llama-family checkpoints: config.json as transformers 4 and 5 write it, tensors read by name, a checkpoint's
tokenizer.json, one-line refusals of what vecgpt does not run, and load --dry-run's shapes of hub models."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vecgpt import families, tokenizer, weights
from vecgpt.cli import main
from vecgpt.errors import VecgptError
from vecgpt.loading import plan

HP = families.LlamaHParams(n_layer=2, n_head=6, n_kv_head=2, n_embd=48, n_inner=64, n_ctx=128, n_vocab=512)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the fingerprint cache
    return weights.make_llama_model(tmp_path / "m", HP, seed=3)


def rewrite_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not ...}))


def test_a_folder_loads_as_a_llama_tensor_by_tensor(folder):
    model = weights.load(str(folder))
    assert isinstance(model, weights.LlamaModel) and model.family is families.LLAMA
    assert model.hparams == HP and model.hparams.head_dim == 8 and model.hparams.group == 3
    assert model.tensor("model.layers.1.self_attn.k_proj.weight").shape == (16, 48)  # [out, in]
    assert model.rows("model.embed_tokens.weight", 10, 12).shape == (2, 48)
    block = model.block(1)
    assert set(block) == {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"}
    assert block["mlp"]["down_proj"]["weight"].shape == (48, 64)
    assert model._params is None  # nothing above read the whole checkpoint
    np.testing.assert_array_equal(
        model.params["model"]["layers"][1]["mlp"]["down_proj"]["weight"], block["mlp"]["down_proj"]["weight"]
    )
    assert model.fingerprint == weights.load(str(folder)).fingerprint == weights.fingerprint(model.params)


def test_transformers_4_and_5_configs_read_alike(folder):
    scaling = dict(families.LLAMA3_ROPE)
    rewrite_config(folder, rope_theta=500000.0, rope_scaling=scaling)  # transformers 4
    four = weights.read_config(folder)
    rewrite_config(folder, rope_theta=..., rope_scaling=..., rope_parameters={**scaling, "rope_theta": 500000.0})
    five = weights.read_config(folder)
    assert four == five and five.rope_theta == 500000.0 and five.scaling["factor"] == 32.0
    rewrite_config(folder, rope_parameters=..., rope_scaling={"type": "linear", "factor": 2.0})  # older transformers 4
    assert weights.read_config(folder).scaling == {"factor": 2.0, "rope_type": "linear"}


@pytest.mark.parametrize(
    "changes, says",
    [
        (dict(model_type="mistral", sliding_window=64), "sliding-window attention"),
        (dict(model_type="qwen2", use_sliding_window=True, sliding_window=64), "sliding-window attention"),
        (dict(model_type="mixtral", num_local_experts=8), "mixture of experts"),
        (dict(num_local_experts=8), "mixture of experts"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope scaling 'yarn' is not implemented"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
        (dict(num_key_value_heads=4), "not a multiple of num_key_value_heads 4"),
        (dict(intermediate_size=96), "mlp.gate_proj.weight has shape (64, 48), config.json implies (96, 48)"),
        (dict(num_hidden_layers=3), "missing tensor model.layers.2.input_layernorm.weight and 8 more"),
        (dict(vocab_size=500), "model.embed_tokens.weight has shape (512, 48), config.json implies (500, 48)"),
    ],
)
def test_what_vecgpt_does_not_run_is_one_line_before_anything(folder, changes, says, capsys):
    rewrite_config(folder, **changes)
    with pytest.raises(VecgptError) as e:
        weights.load(str(folder))
    assert says in str(e.value) and "\n" not in str(e.value)
    assert main(["load", "--model", str(folder), "--backend", "faiss", "--store", str(folder / "store")]) == 2
    assert says in capsys.readouterr().err and not (folder / "store").exists()


def test_windows_not_used_are_not_refused(folder):
    rewrite_config(folder, model_type="mistral", sliding_window=None)
    assert weights.read_config(folder).family == "mistral"
    rewrite_config(folder, model_type="qwen2", sliding_window=64, use_sliding_window=False)
    assert weights.read_config(folder).biases == families.QKV  # Qwen2's q, k and v biases, wanted in the file
    with pytest.raises(VecgptError, match="missing tensor model.layers.0.self_attn.k_proj.bias and 5 more"):
        weights.load(str(folder))


def test_a_sharded_checkpoint_is_one_line(folder):
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(VecgptError, match="several safetensors files; vecgpt reads one model.safetensors"):
        weights.load(str(folder))


def byte_level_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["ROMEO: But soft, what light through yonder window breaks?"] * 20, trainer)
    tok.save(str(path))


def test_a_checkpoints_tokenizer_json(folder):
    byte_level_tokenizer(folder / "tokenizer.json")
    tok = weights.load(str(folder)).tokenizer
    text = "ROMEO: soft — café"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and tok.eos == 0
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()  # "—" and "é" span tokens: bytes, not text


def test_sentencepiece_pieces_become_bytes(tmp_path):
    from tokenizers import Tokenizer, models

    vocab = {"<unk>": 0, "</s>": 1, "<0xE2>": 2, "▁ROMEO": 3, ":": 4}
    Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>")).save(str(tmp_path / "tokenizer.json"))
    tok = tokenizer.of_folder(tmp_path, 5)
    assert tok.eos == 1 and [tok.token_bytes(i) for i in (2, 3, 4)] == [b"\xe2", b" ROMEO", b":"]


def test_no_tokenizer_json_is_gpt2s_only_at_its_vocabulary(tmp_path):
    assert tokenizer.of_folder(tmp_path, 50257).encode("Hello world") == [15496, 995]
    with pytest.raises(VecgptError, match="no tokenizer.json, and its 512 tokens are not GPT-2's; copy"):
        tokenizer.of_folder(tmp_path, 512)


def test_plan_has_a_document_per_output_row():
    hp = families.SIZES["HuggingFaceTB/SmolLM2-135M"]
    rows = plan(hp, "ip", "four")
    per_layer = (9 + 2 * 3) * 64 + 576 * 9 + 2 * 1536 + 576  # q k v, o by head, gate and up, down
    assert sum(n for _, n, _ in rows) == 30 * per_layer + 49152 + 61
    assert weights.parameter_count(hp) == 134_515_008  # SmolLM2-135M's own count
    untied = families.SIZES["TinyLlama/TinyLlama-1.1B-Chat-v1.0"]
    names = {name: (n, d) for name, n, d in plan(untied, "ip", "five")}
    assert names["lm_head"] == (32000, 2049) and names["embed_tokens"] == (32000, 2048) and "wte" not in names
    assert names["h.0.attn.c_attn"] == ((32 + 2 * 4) * 64, 2049) and names["h.0.attn.c_proj"] == (2048, 2049)
    assert weights.parameter_count(untied) == 1_100_048_384


@pytest.mark.parametrize(
    "name",
    [
        "SmolLM2-135M",
        "HuggingFaceTB/SmolLM2-360M",
        "Qwen2.5-0.5B",
        "TinyLlama-1.1B-Chat-v1.0",
        "meta-llama/Llama-3.2-1B",
    ],
)
def test_dry_run_knows_hub_shapes_offline(name, capsys, monkeypatch, tmp_path):
    import huggingface_hub

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("sent to the hub"))
    assert main(["load", "--dry-run", "--model", name, "--backend", "faiss", "--metric", "ip"]) == 0
    out = capsys.readouterr().out
    hp = families.SIZES[families.known(name)]
    assert f"({hp.n_layer} layers, {hp.n_embd} wide, {hp.n_head} heads" in out
    assert f"sharing {hp.n_kv_head} key/value heads, SwiGLU {hp.n_inner} wide" in out
    layout = out.split("layout ")[1].split(")")[0]
    assert f"documents: {sum(n for _, n, _ in plan(hp, 'ip', layout)):,} in" in out and "memory:" in out


def test_known_sizes_are_their_configs():
    qwen, llama3 = families.SIZES["Qwen/Qwen2.5-0.5B"], families.SIZES["meta-llama/Llama-3.2-1B"]
    assert qwen.family == "qwen2" and qwen.biases == families.QKV and qwen.tied and qwen.eps == 1e-6
    assert llama3.scaling["rope_type"] == "llama3" and llama3.group == 4 and llama3.n_vocab == 128256
    for hp in families.SIZES.values():  # each reads back from the config.json it writes
        assert families.read_llama_hparams(hp.config_json(), "x") == hp


def test_shipped_llama_writes_its_readme_sample(capsys):
    from vecgpt.reference_llama import LlamaReference, generate

    model = weights.load("shakespeare-llama")
    hp = model.hparams
    assert isinstance(model, weights.LlamaModel) and (hp.n_layer, hp.n_head, hp.n_kv_head, hp.n_embd) == (4, 4, 2, 128)
    assert hp.tied and hp.n_vocab == 50257 and isinstance(model.tokenizer, tokenizer.Gpt2Tokenizer)
    assert (weights.SHIPPED / "shakespeare-llama" / "model.safetensors").stat().st_size <= 16 * 2**20
    readme = (weights.SHIPPED / "shakespeare-llama" / "README.md").read_text()
    sample = readme.split('Greedy, 40 tokens from "ROMEO:":\n\n```\n')[1].split("\n```")[0]
    ids = model.tokenizer.encode("ROMEO:")
    assert model.tokenizer.decode(ids + generate(LlamaReference(model, np.float64), ids, 40)) == sample
    assert main(["load", "--dry-run", "--model", "shakespeare-llama", "--backend", "faiss", "--metric", "ip"]) == 0
    assert "family: llama; 4 query heads sharing 2 key/value heads, SwiGLU 344 wide" in capsys.readouterr().out
