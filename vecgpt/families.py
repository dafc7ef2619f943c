"""Model families: what a block is made of, as plain data, and the shapes of the Llama-family checkpoints.

A family says which norm a block uses, its projections (grouped by the input they share, so each group is one
round of searches), which of them carry a bias, how positions enter, the feed-forward's activation, and how query
heads map to key heads. GPT-2 and Llama are two families; Qwen2 is Llama with biases on q, k and v; Mistral is
Llama (its sliding window, where a checkpoint uses one, is refused). Llama-family checkpoints keep Hugging Face's
names and nn.Linear's [out, in] layout: `model.layers.3.self_attn.q_proj.weight`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from vecgpt.errors import VecgptError


@dataclass(frozen=True)
class Family:
    name: str
    norm: str  # "layer": (x - mean) / std * weight + bias; "rms": x / rms(x) * weight
    block_norms: tuple[str, str]  # before attention, before the feed-forward
    final_norm: str
    rounds: tuple[tuple[str, ...], ...]  # a block's projections, grouped by the input they share, in order
    biases: tuple[str, ...]  # the projections that add a bias
    positions: str  # "table": a learned row added to the token's; "rotary": q and k rotated by position
    activation: str  # "gelu_tanh" (GPT-2's gelu_new) or "silu"
    feed_forward: str  # "mlp": down(act(up x)); "swiglu": down(act(gate x) * up x)
    embedding: str
    prefix: str = ""  # in front of every checkpoint name


GPT2 = Family(
    name="gpt2",
    norm="layer",
    block_norms=("ln_1", "ln_2"),
    final_norm="ln_f",
    rounds=(("attn.c_attn",), ("attn.c_proj",), ("mlp.c_fc",), ("mlp.c_proj",)),
    biases=("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
    positions="table",
    activation="gelu_tanh",
    feed_forward="mlp",
    embedding="wte",
)
QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
LLAMA = Family(
    name="llama",
    norm="rms",
    block_norms=("input_layernorm", "post_attention_layernorm"),
    final_norm="norm",
    rounds=(QKV, ("self_attn.o_proj",), ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",)),
    biases=(),
    positions="rotary",
    activation="silu",
    feed_forward="swiglu",
    embedding="embed_tokens",
    prefix="model.",
)
QWEN2 = replace(LLAMA, name="qwen2", biases=QKV)
MISTRAL = replace(LLAMA, name="mistral")
FAMILIES = {f.name: f for f in (GPT2, LLAMA, QWEN2, MISTRAL)}
# model types transformers has for families vecgpt does not run, and why
UNSUPPORTED = {
    "mixtral": "a mixture of experts",
    "qwen2_moe": "a mixture of experts",
    "qwen3_moe": "a mixture of experts",
    "olmoe": "a mixture of experts",
    "gemma": "Gemma's own norm and activation",
    "gemma2": "Gemma's own norm, activation and sliding window",
    "phi3": "fused qkv and gate_up projections",
}
ROPE_TYPES = ("default", "linear", "llama3")


def key_head(h: int, n_head: int, n_kv_head: int) -> int:
    """The key/value head query head h reads: consecutive query heads share one (grouped-query attention)."""
    return h // (n_head // n_kv_head)


@dataclass(frozen=True)
class LlamaHParams:
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    n_inner: int
    n_ctx: int
    n_vocab: int
    head_dim: int = 0  # 0: n_embd // n_head
    eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple = ()  # sorted (key, value) pairs of rope_scaling with its rope_type; () for none
    tied: bool = False
    family: str = "llama"
    biases: tuple[str, ...] = field(default=())  # projections with a bias, as the config asks

    def __post_init__(self):
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.n_embd // max(1, self.n_head))

    @property
    def group(self) -> int:  # query heads a key head serves
        return self.n_head // self.n_kv_head

    @property
    def scaling(self) -> dict:
        return dict(self.rope_scaling)

    def config_json(self) -> dict:
        """config.json as transformers 4 writes it (rope_theta at the top); transformers 5 reads it too."""
        architecture = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
        return {
            "model_type": self.family,
            "architectures": [architecture[self.family]],
            "hidden_size": self.n_embd,
            "intermediate_size": self.n_inner,
            "num_hidden_layers": self.n_layer,
            "num_attention_heads": self.n_head,
            "num_key_value_heads": self.n_kv_head,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.n_ctx,
            "rms_norm_eps": self.eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.scaling or None,
            "tie_word_embeddings": self.tied,
            "vocab_size": self.n_vocab,
        } | ({} if self.family == "qwen2" else self.bias_flags())

    def bias_flags(self) -> dict:  # a Llama's biases: on q, k, v and o together, on the feed-forward together
        return {"attention_bias": "self_attn.o_proj" in self.biases, "mlp_bias": "mlp.down_proj" in self.biases}


def family_of(config: dict) -> Family | None:
    """The family a config.json names by its model_type: None for GPT-2's (or none given: GPT-2 configs of old
    lack one); a family vecgpt does not run is refused in one line."""
    kind = config.get("model_type")
    if kind in (None, "gpt2") or not isinstance(kind, str):
        return None
    if kind in UNSUPPORTED or config.get("num_local_experts") or config.get("num_experts"):
        why = UNSUPPORTED.get(kind, "a mixture of experts")
        raise VecgptError(f"model_type {kind!r} is {why}, which vecgpt does not run; it runs {', '.join(FAMILIES)}")
    return FAMILIES.get(kind)


def read_llama_hparams(config: dict, where: str) -> LlamaHParams:
    """A Llama, Mistral or Qwen2 config.json as transformers 4 (rope_theta at the top) or 5 (rope_parameters)
    writes it; a feature vecgpt does not implement is refused in one line naming it."""
    family = family_of(config)
    refuse_unsupported(config, where)
    theta, scaling = rope_of(config, where)
    try:
        hp = LlamaHParams(
            n_layer=int(config["num_hidden_layers"]),
            n_head=int(config["num_attention_heads"]),
            n_kv_head=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
            n_embd=int(config["hidden_size"]),
            n_inner=int(config["intermediate_size"]),
            n_ctx=int(config.get("max_position_embeddings", 2048)),
            n_vocab=int(config["vocab_size"]),
            head_dim=int(config.get("head_dim") or 0),
            eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            tied=bool(config.get("tie_word_embeddings", False)),
            family=family.name,
            biases=biases_of(config, family),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise VecgptError(f"{where}: config.json lacks or mangles a {family.name} hyper-parameter ({e})") from None
    check_sizes(hp, where)
    return hp


def refuse_unsupported(config: dict, where: str) -> None:
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise VecgptError(f"{where}: hidden_act {act!r} is not supported; vecgpt's Llama family runs silu (SwiGLU)")
    if sliding_window_used(config):
        raise VecgptError(
            f"{where}: sliding-window attention (sliding_window {config.get('sliding_window')}) is not supported; "
            f"vecgpt attends to every earlier position"
        )
    if float(config.get("partial_rotary_factor", 1.0)) != 1.0:
        raise VecgptError(f"{where}: partial rotary embeddings (partial_rotary_factor) are not supported")


def sliding_window_used(config: dict) -> bool:
    """Qwen2 says whether it uses its window (use_sliding_window, layer_types); Mistral uses one when it is set
    shorter than its context."""
    if "sliding_attention" in (config.get("layer_types") or []):
        return True
    if config.get("model_type") == "qwen2":
        return bool(config.get("use_sliding_window"))
    window = config.get("sliding_window")
    return window is not None and int(window) < int(config.get("max_position_embeddings", 0))


def rope_of(config: dict, where: str) -> tuple[float, tuple]:
    """(theta, scaling) from transformers 5's rope_parameters or transformers 4's rope_theta and rope_scaling."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", config.get("rope_theta", 10000.0)))
    kind = params.pop("rope_type", params.pop("type", "default"))
    if kind not in ROPE_TYPES:
        raise VecgptError(
            f"{where}: rope scaling {kind!r} is not implemented (vecgpt implements {', '.join(ROPE_TYPES)})"
        )
    return theta, () if kind == "default" else tuple(sorted({**params, "rope_type": kind}.items()))


def biases_of(config: dict, family: Family) -> tuple[str, ...]:
    """Qwen2's q, k and v biases; a Llama config's attention_bias (q, k, v and o) and mlp_bias (gate, up, down)."""
    attention = (*QKV, "self_attn.o_proj") if config.get("attention_bias") else ()
    mlp = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj") if config.get("mlp_bias") else ()
    return tuple(dict.fromkeys((*family.biases, *attention, *mlp)))


def check_sizes(hp: LlamaHParams, where: str) -> None:
    if min(hp.n_layer, hp.n_head, hp.n_kv_head, hp.n_embd, hp.n_inner, hp.n_ctx, hp.n_vocab, hp.head_dim) < 1:
        raise VecgptError(f"{where}: config.json gives a size below 1 ({describe(hp)})")
    if hp.n_head % hp.n_kv_head:
        raise VecgptError(
            f"{where}: num_attention_heads {hp.n_head} is not a multiple of num_key_value_heads {hp.n_kv_head}"
        )
    if hp.head_dim % 2:
        raise VecgptError(f"{where}: head_dim {hp.head_dim} is odd; rotary positions rotate pairs")


def describe(hp: LlamaHParams) -> str:
    return ", ".join(f"{k}={v}" for k, v in asdict(hp).items() if k not in ("rope_scaling", "biases"))


def block_shapes(hp: LlamaHParams) -> dict[str, tuple[int, ...]]:
    """A layer's tensors by their names inside it, [out, in] as nn.Linear holds them."""
    d, q, kv, inner = hp.n_embd, hp.n_head * hp.head_dim, hp.n_kv_head * hp.head_dim, hp.n_inner
    weights = {
        "self_attn.q_proj": (q, d),
        "self_attn.k_proj": (kv, d),
        "self_attn.v_proj": (kv, d),
        "self_attn.o_proj": (d, q),
        "mlp.gate_proj": (inner, d),
        "mlp.up_proj": (inner, d),
        "mlp.down_proj": (d, inner),
    }
    shapes = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,)}
    shapes |= {f"{name}.weight": shape for name, shape in weights.items()}
    return shapes | {f"{name}.bias": (weights[name][0],) for name in hp.biases}


def expected_shapes(hp: LlamaHParams) -> dict[str, tuple[int, ...]]:
    """Every tensor of a checkpoint by its Hugging Face name; lm_head only when the output matrix is its own."""
    shapes = {"model.embed_tokens.weight": (hp.n_vocab, hp.n_embd), "model.norm.weight": (hp.n_embd,)}
    for i in range(hp.n_layer):
        shapes |= {f"model.layers.{i}.{name}": shape for name, shape in block_shapes(hp).items()}
    return shapes if hp.tied else shapes | {"lm_head.weight": (hp.n_vocab, hp.n_embd)}


def check_tensors(shapes: dict[str, tuple], hp: LlamaHParams, where: str) -> None:
    """Names and shapes as this config implies (a tied checkpoint may also hold lm_head, the table's shape)."""
    expected = expected_shapes(hp)
    held = {k: v for k, v in shapes.items() if not k.endswith("rotary_emb.inv_freq")}
    if hp.tied and "lm_head.weight" in held:
        expected = {**expected, "lm_head.weight": (hp.n_vocab, hp.n_embd)}
    missing, extra = sorted(set(expected) - set(held)), sorted(set(held) - set(expected))
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise VecgptError(f"{where}: missing tensor {missing[0]}{more}; is config.json this checkpoint's?")
    if extra:
        raise VecgptError(f"{where}: unexpected tensor {extra[0]} (not part of {hp.family} with {hp.n_layer} layers)")
    for name, shape in expected.items():
        if tuple(held[name]) != shape:
            raise VecgptError(
                f"{where}: {name} has shape {tuple(held[name])}, config.json implies {shape}; "
                f"the config.json beside it belongs to another checkpoint"
            )


def parameter_count(hp: LlamaHParams) -> int:
    per_layer = sum(int(_product(s)) for s in block_shapes(hp).values())
    table = hp.n_vocab * hp.n_embd
    return table * (1 if hp.tied else 2) + hp.n_layer * per_layer + hp.n_embd


def _product(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


LLAMA3_ROPE = (
    ("factor", 32.0),
    ("high_freq_factor", 4.0),
    ("low_freq_factor", 1.0),
    ("original_max_position_embeddings", 8192),
    ("rope_type", "llama3"),
)
QWEN_BIASES = QKV
# Llama-family checkpoints on the Hugging Face hub, by name, as their config.json gives them
SIZES = {
    "HuggingFaceTB/SmolLM2-135M": LlamaHParams(30, 9, 3, 576, 1536, 8192, 49152, 64, 1e-5, 100000.0, (), True),
    "HuggingFaceTB/SmolLM2-360M": LlamaHParams(32, 15, 5, 960, 2560, 8192, 49152, 64, 1e-5, 100000.0, (), True),
    "Qwen/Qwen2.5-0.5B": LlamaHParams(
        24, 14, 2, 896, 4864, 32768, 151936, 64, 1e-6, 1000000.0, (), True, "qwen2", QWEN_BIASES
    ),
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": LlamaHParams(22, 32, 4, 2048, 5632, 2048, 32000, 64, 1e-5, 10000.0),
    "meta-llama/Llama-3.2-1B": LlamaHParams(
        16, 32, 8, 2048, 8192, 131072, 128256, 64, 1e-5, 500000.0, LLAMA3_ROPE, True
    ),
}


def known(name: str) -> str | None:
    """A hub name of SIZES, also by its part after the slash ("SmolLM2-135M")."""
    if name in SIZES:
        return name
    return next((full for full in SIZES if full.split("/")[1] == name), None)
