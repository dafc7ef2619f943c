"""The numpy Llama reference: its parts by hand, its KV cache, and pinned to transformers on random checkpoints
that transformers makes (skipped where torch and transformers are not installed: pip install 'vecgpt[transformers]').

transformers computes RMSNorm and the rotary angles in float32 even in a float64 model (LlamaRMSNorm,
LlamaRotaryEmbedding), so its float64 logits carry float32 rounding there: the reference, float64 throughout, is
within TOLERANCE of them. With those two parts of transformers made float64 (the angles from the reference's own
inverse frequencies), everything else (the rotation's halves, grouped-query heads, SwiGLU, biases, the output
matrix) agrees to TIGHT."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from vecgpt import families, weights
from vecgpt.reference_llama import LlamaReference, generate, inv_freq, rms_norm, rotary, silu

TOLERANCE = 1e-5  # logits of order 1 to 10; transformers' float32 norm and angles move its own by about 1e-6
TIGHT = 1e-11
IDS = [5, 17, 300, 2, 41, 999, 7, 7, 1023, 64, 3, 250]  # below every test vocabulary


def tiny(tmp_path, std=0.2, **changes):
    hp = families.LlamaHParams(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, n_inner=48, n_ctx=64, n_vocab=1024)
    hp = families.LlamaHParams(**{**hp.__dict__, **changes})
    weights.make_llama_model(tmp_path / "m", hp, seed=1, std=std)
    return weights.load(str(tmp_path / "m"), dtype=np.float64)


def test_kv_cache_equals_full_recompute(tmp_path):
    model = tiny(tmp_path, family="qwen2", biases=families.QKV)
    full = LlamaReference(model, np.float64).logits(IDS[:8])
    ref = LlamaReference(model, np.float64)
    step = np.vstack([ref.logits(IDS[:3])] + [ref.logits([i]) for i in IDS[3:8]])
    np.testing.assert_allclose(step, full, atol=1e-12)
    ref.truncate(4)
    np.testing.assert_allclose(ref.logits(IDS[4:8]), full[4:], atol=1e-12)


def test_float32_stays_float32_and_near_float64(tmp_path):
    model = tiny(tmp_path)
    l32, l64 = LlamaReference(model, np.float32).logits(IDS[:5]), LlamaReference(model, np.float64).logits(IDS[:5])
    assert l32.dtype == np.float32
    np.testing.assert_allclose(l32, l64, atol=1e-4)


def test_rms_norm_and_silu_by_hand():
    x = np.array([[3.0, -4.0]])  # rms 5 / sqrt(2)
    np.testing.assert_allclose(rms_norm(x, np.array([1.0, 2.0]), 0.0), [[3 * math.sqrt(2) / 5, -8 * math.sqrt(2) / 5]])
    np.testing.assert_allclose(silu(np.array([0.0, 1.0, -800.0])), [0.0, 1 / (1 + math.exp(-1)), 0.0], atol=1e-15)


def test_rotary_scores_depend_on_distance_only():
    rng, freq = np.random.default_rng(0), inv_freq(16, 10000.0, {})
    q, k = rng.standard_normal((1, 16)), rng.standard_normal((1, 16))
    at = lambda x, p: rotary(x, np.array([float(p)]), freq)  # noqa: E731
    np.testing.assert_allclose(at(q, 0), q)  # position 0 is not turned
    np.testing.assert_allclose(np.linalg.norm(at(q, 9)), np.linalg.norm(q))
    np.testing.assert_allclose(at(q, 7) @ at(k, 3).T, at(q, 104) @ at(k, 100).T, rtol=1e-12)
    assert not np.allclose(at(q, 7) @ at(k, 3).T, at(q, 7) @ at(k, 5).T)


def test_llama3_scaling_bands():
    scaling = dict(families.LLAMA3_ROPE)
    plain, scaled = inv_freq(64, 500000.0, {}), inv_freq(64, 500000.0, scaling)
    wavelen = 2 * math.pi / plain
    short, long = wavelen < 8192 / 4, wavelen > 8192 / 1
    np.testing.assert_array_equal(scaled[short], plain[short])
    np.testing.assert_allclose(scaled[long], plain[long] / 32)
    middle = ~short & ~long
    assert middle.any() and np.all(scaled[middle] < plain[middle]) and np.all(scaled[middle] > plain[middle] / 32)


def test_grouped_query_heads_share_keys(tmp_path):
    """With every key/value head copied to the query heads it serves, grouped-query attention equals full
    multi-head attention."""
    model = tiny(tmp_path, n_head=4, n_kv_head=2)
    params = weights.unflatten(weights.flatten(model.params), blocks=False)  # a copy to change
    params["model"]["layers"] = [params["model"]["layers"][i] for i in range(2)]
    full = families.LlamaHParams(**{**model.hparams.__dict__, "n_kv_head": 4})
    for block in params["model"]["layers"]:
        for name in ("k_proj", "v_proj"):
            heads = np.split(block["self_attn"][name]["weight"], 2)
            block["self_attn"][name]["weight"] = np.vstack([heads[0], heads[0], heads[1], heads[1]])
    mha = weights.LlamaModel(full, params)
    np.testing.assert_allclose(
        LlamaReference(mha, np.float64).logits(IDS), LlamaReference(model, np.float64).logits(IDS), atol=1e-12
    )


def test_generate_is_greedy_and_stops_at_eos(tmp_path):
    model = tiny(tmp_path)
    ref = LlamaReference(model, np.float64)
    out = generate(ref, IDS[:3], 6)
    want, ids = [], list(IDS[:3])
    for _ in range(6):
        want.append(int(np.argmax(LlamaReference(model, np.float64).logits(ids + want)[-1])))
    assert out == want
    assert generate(LlamaReference(model, np.float64), IDS[:3], 6, eos=want[1]) == want[:2]


# transformers' own random checkpoints: SmolLM2-135M's shape, scaled-down ones with grouped-query ratios 1, 3 and 4,
# an untied output matrix, Llama 3's rope scaling, and Qwen2 with biases on q, k and v
SMOLLM2 = dict(
    hidden_size=576,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    intermediate_size=1536,
    vocab_size=49152,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
)
SCALED = dict(SMOLLM2, hidden_size=144, num_hidden_layers=3, intermediate_size=384, vocab_size=3072)
CASES = {
    "ratio 3 (SmolLM2 scaled)": ("LlamaConfig", SCALED),
    "ratio 1": ("LlamaConfig", dict(SCALED, num_key_value_heads=9)),
    "ratio 4, untied": (
        "LlamaConfig",
        dict(SCALED, hidden_size=128, num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False),
    ),
    "llama3 rope": (
        "LlamaConfig",
        dict(SCALED, num_key_value_heads=1, rope_theta=500000.0, rope_scaling=dict(families.LLAMA3_ROPE)),
    ),
    "qwen2 biases": (
        "Qwen2Config",
        dict(SCALED, num_attention_heads=6, num_key_value_heads=2, hidden_size=96, rms_norm_eps=1e-6),
    ),
}


def transformers_checkpoint(folder, config_class: str, values: dict, seed: int = 0):
    """A random checkpoint as transformers saves it, its weights widened from the 0.02 initialisation (so every
    layer moves the logits) and its norms moved off 1."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**copy.deepcopy(values))  # it writes rope_theta into rope_scaling
    hf = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.08 * torch.randn_like(p))
    hf.save_pretrained(folder)
    return hf.double().eval()


def compare(folder, hf, ids) -> float:
    import torch

    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()  # float64
    ref = LlamaReference(weights.load(str(folder), dtype=np.float64), np.float64)
    got = np.vstack([ref.logits(ids[:5])] + [ref.logits([i]) for i in ids[5:]])  # the cache, a token at a time
    assert np.abs(want).max() > 1  # logits that say something
    return float(np.abs(got - want).max())


def float64_norm_and_rotary(monkeypatch, hf, scaling, theta):
    """transformers' RMSNorm and rotary tables in float64, the inverse frequencies the reference's."""
    import torch
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2

    def norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def tables(self, x, position_ids):
        emb = torch.cat([position_ids[..., None].double() * self.inv_freq] * 2, dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    for module in (modeling_llama.LlamaRMSNorm, modeling_qwen2.Qwen2RMSNorm):
        monkeypatch.setattr(module, "forward", norm)
    for module in (modeling_llama.LlamaRotaryEmbedding, modeling_qwen2.Qwen2RotaryEmbedding):
        monkeypatch.setattr(module, "forward", tables)
    hd = hf.config.hidden_size // hf.config.num_attention_heads
    hf.model.rotary_emb.inv_freq = torch.tensor(inv_freq(hd, theta, scaling))


@pytest.mark.parametrize("case", CASES)
def test_matches_transformers(tmp_path, case, monkeypatch):
    config_class, values = CASES[case]
    hf = transformers_checkpoint(tmp_path / "m", config_class, values)
    assert compare(tmp_path / "m", hf, IDS) < TOLERANCE
    float64_norm_and_rotary(monkeypatch, hf, values.get("rope_scaling") or {}, values["rope_theta"])
    assert compare(tmp_path / "m", hf, IDS) < TIGHT


@pytest.mark.slow
def test_matches_transformers_at_smollm2_135m_shape(tmp_path, monkeypatch):
    hf = transformers_checkpoint(tmp_path / "m", "LlamaConfig", SMOLLM2)
    assert weights.load(str(tmp_path / "m")).hparams == families.SIZES["HuggingFaceTB/SmolLM2-135M"]
    assert compare(tmp_path / "m", hf, IDS[:6]) < 3 * TOLERANCE  # 30 layers: more float32 roundings on its side
    float64_norm_and_rotary(monkeypatch, hf, {}, SMOLLM2["rope_theta"])
    assert compare(tmp_path / "m", hf, IDS[:6]) < TIGHT
