"""GPT-2 checkpoints in the Hugging Face layout: load, check, write, make at random.

Parameters live in a nested dict built by splitting safetensors keys on ".":
`h.3.attn.c_attn.weight` becomes `params["h"][3]["attn"]["c_attn"]["weight"]`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from vecgpt import families
from vecgpt.errors import VecgptError
from vecgpt.paths import expand, read_cache

SHIPPED = Path(__file__).parent / "models"
DEFAULT_MODEL = "shakespeare"
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
LLAMA_FILES = ("config.json", "model.safetensors", "tokenizer.json")


@dataclass(frozen=True)
class HParams:
    n_layer: int
    n_head: int
    n_embd: int
    n_ctx: int
    n_vocab: int
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:  # as families.LlamaHParams names it
        return self.n_embd // self.n_head

    def config_json(self) -> dict:
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_embd": self.n_embd,
            "n_positions": self.n_ctx,
            "n_ctx": self.n_ctx,
            "vocab_size": self.n_vocab,
            "layer_norm_epsilon": self.eps,
            "activation_function": "gelu_new",
            "bos_token_id": 50256,
            "eos_token_id": 50256,
        }


class Model:
    """A checkpoint's shape and where it came from. `params` (every tensor, nested) is read on first use; code
    that streams asks `tensor(name)` for one at a time, so a load never holds the weights whole."""

    def __init__(self, hparams: HParams, params: dict | None = None, source: str = "", checkpoint=None, dtype=None):
        self.hparams, self.source, self.checkpoint = hparams, source, checkpoint
        self.dtype = np.dtype(dtype or np.float32)
        self._params, self._fingerprint = params, None

    @property
    def params(self) -> dict:
        if self._params is None:
            self._params = unflatten({name: self.tensor(name) for name in expected_shapes(self.hparams)})
        return self._params

    def tensor(self, name: str) -> np.ndarray:
        """One parameter by its flat name ("h.3.mlp.c_fc.weight"): from memory if held, else read alone."""
        if self._params is not None or self.checkpoint is None:
            return lookup(self.params, name)
        return self.checkpoint.read(name, self.dtype)

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows start..stop of a parameter (along its first axis), read alone when not held."""
        if self._params is not None or self.checkpoint is None:
            return lookup(self.params, name)[start:stop]
        return self.checkpoint.read(name, self.dtype, (start, stop))

    def block(self, layer: int) -> dict:
        """Layer `layer`'s parameters, nested as in params["h"][layer]."""
        if self._params is not None or self.checkpoint is None:
            return self.params["h"][layer]
        names = expected_shapes_of_block(self.hparams)
        return unflatten({n: self.tensor(f"h.{layer}.{n}") for n in names}, blocks=False)

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            if self._params is not None or self.checkpoint is None:
                self._fingerprint = fingerprint(self.params)
            else:
                self._fingerprint = self.checkpoint.fingerprint()
        return self._fingerprint


class LlamaModel(Model):
    """A Llama, Mistral or Qwen2 checkpoint (families.LlamaHParams) under Hugging Face's names, weights [out, in].
    `params` nests them as named: params["model"]["layers"][3]["self_attn"]["q_proj"]["weight"]; a separate output
    matrix is params["lm_head"]."""

    @property
    def family(self) -> families.Family:
        return families.FAMILIES[self.hparams.family]

    @property
    def params(self) -> dict:
        if self._params is None:
            flat = {name: self.tensor(name) for name in expected_shapes(self.hparams)}
            params = unflatten(flat, blocks=False)
            params["model"]["layers"] = [params["model"]["layers"][i] for i in range(self.hparams.n_layer)]
            self._params = params
        return self._params

    def block(self, layer: int) -> dict:
        """Layer `layer`'s parameters, nested as in params["model"]["layers"][layer]."""
        if self._params is not None or self.checkpoint is None:
            return self.params["model"]["layers"][layer]
        names = families.block_shapes(self.hparams)
        return unflatten({n: self.tensor(f"model.layers.{layer}.{n}") for n in names}, blocks=False)

    @property
    def tokenizer(self):
        """The checkpoint's tokenizer.json, else GPT-2's for a model of its 50,257 tokens (shakespeare-llama)."""
        from vecgpt import tokenizer

        return tokenizer.of_folder(Path(self.source), self.hparams.n_vocab)


def parameter_count(hp: HParams) -> int:
    """Numbers in a checkpoint (without building its shapes, which can be huge for a typo'd size)."""
    if isinstance(hp, families.LlamaHParams):
        return families.parameter_count(hp)
    d = hp.n_embd
    return (hp.n_vocab + hp.n_ctx) * d + hp.n_layer * (12 * d * d + 13 * d) + 2 * d


def expected_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    if isinstance(hp, families.LlamaHParams):
        return families.expected_shapes(hp)
    shapes = {"wte.weight": (hp.n_vocab, hp.n_embd), "wpe.weight": (hp.n_ctx, hp.n_embd)}
    for i in range(hp.n_layer):
        shapes.update({f"h.{i}.{name}": shape for name, shape in expected_shapes_of_block(hp).items()})
    shapes["ln_f.weight"] = shapes["ln_f.bias"] = (hp.n_embd,)
    return shapes


def expected_shapes_of_block(hp: HParams) -> dict[str, tuple[int, ...]]:
    d = hp.n_embd
    return {
        "ln_1.weight": (d,),
        "ln_1.bias": (d,),
        "ln_2.weight": (d,),
        "ln_2.bias": (d,),
        "attn.c_attn.weight": (d, 3 * d),
        "attn.c_attn.bias": (3 * d,),
        "attn.c_proj.weight": (d, d),
        "attn.c_proj.bias": (d,),
        "mlp.c_fc.weight": (d, 4 * d),
        "mlp.c_fc.bias": (4 * d,),
        "mlp.c_proj.weight": (4 * d, d),
        "mlp.c_proj.bias": (d,),
    }


def read_hparams(config: dict, where: str) -> HParams:
    try:
        hp = HParams(
            n_layer=int(config["n_layer"]),
            n_head=int(config["n_head"]),
            n_embd=int(config["n_embd"]),
            n_ctx=int(config.get("n_positions", config.get("n_ctx"))),
            n_vocab=int(config["vocab_size"]),
            eps=float(config.get("layer_norm_epsilon", 1e-5)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise VecgptError(f"{where}: config.json lacks or mangles a GPT-2 hyper-parameter ({e})") from None
    if min(hp.n_layer, hp.n_head, hp.n_embd, hp.n_ctx, hp.n_vocab) < 1:
        raise VecgptError(f"{where}: config.json gives a size below 1 ({describe(hp)}); not a GPT-2 checkpoint")
    if hp.n_embd % hp.n_head:
        raise VecgptError(f"{where}: n_embd {hp.n_embd} is not divisible by n_head {hp.n_head}")
    act = config.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise VecgptError(f"{where}: activation_function {act!r} is not GPT-2's tanh GELU (gelu_new)")
    return hp


def resolve(model: str | None, files: tuple = ("config.json", "model.safetensors")) -> Path:
    """A local folder, a model shipped with vecgpt, or a Hugging Face hub name."""
    model = model or DEFAULT_MODEL
    if (full := families.known(model)) and not expand(model).is_dir():
        return download(full, LLAMA_FILES)
    if (folder := expand(model)).is_dir():
        return folder
    if (SHIPPED / model / "config.json").is_file():
        return SHIPPED / model
    if model.startswith(("/", ".", "~")) or Path(model).exists():
        raise VecgptError(f"{model}: no such model folder (a GPT-2 folder holds config.json and model.safetensors)")
    known = [*shipped_names(), *SIZES]
    close = difflib.get_close_matches(model, known, n=1, cutoff=0.7) if "/" not in model else []
    if close and model not in SIZES:  # a typo of a shipped or a hub GPT-2 name is not sent to the hub
        raise VecgptError(
            f"no model {model!r}; did you mean {close[0]!r}? Shipped models: {', '.join(shipped_names())}; "
            f"GPT-2 on the Hugging Face hub: {', '.join(SIZES)}"
        )
    return download(model, files)


def shipped_names() -> list[str]:
    return sorted(p.parent.name for p in SHIPPED.glob("*/config.json"))


def download(name: str, files: tuple = ("config.json", "model.safetensors")) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, allow_patterns=list(files)))
    except Exception as e:  # offline, unknown repo, bad name, auth: each a line saying what to do
        raise VecgptError(f"cannot fetch {name!r} from the Hugging Face hub: {hub_failure(name, e)}") from None


# what huggingface_hub, requests and httpx raise when no answer came back (by name: their modules move)
UNREACHED = {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectionError", "ConnectError", "Timeout"}
UNREACHED |= {"ConnectTimeout", "ReadTimeout", "TimeoutException", "TimeoutError", "ProxyError", "SSLError"}


def hub_failure(name: str, e: Exception) -> str:
    """Why a hub download failed, in plain words, and what works instead."""
    offline = f"shipped models: {', '.join(shipped_names())}; or --model PATH, a folder holding config.json and "
    offline += "model.safetensors"
    kinds = {c.__name__ for c in type(e).__mro__}
    if kinds & UNREACHED:
        return f"the hub is not reachable from here; a folder or a shipped model works offline ({offline})"
    if "RepositoryNotFoundError" in kinds:
        return f"the Hugging Face hub has no model {name!r} (GPT-2's names there: {', '.join(SIZES)}); {offline}"
    if "GatedRepoError" in kinds:
        return f"{name} is gated: accept its terms on huggingface.co and log in (hf auth login); {offline}"
    return f"{type(e).__name__}; {offline}"


def load(model: str | None = None, dtype=np.float32) -> Model:
    """A checkpoint checked from its header (names, shapes, sizes against the file's), its tensors read when asked.
    Its fingerprint is known at once: from the cache of fingerprints, else from one streaming read of the file."""
    folder = resolve(model)
    tensors_path = folder / "model.safetensors"
    hp = read_config(folder)
    if not tensors_path.is_file() and (folder / "model.safetensors.index.json").is_file():
        raise VecgptError(f"{folder}: a checkpoint in several safetensors files; vecgpt reads one model.safetensors")
    if not tensors_path.is_file():
        raise VecgptError(
            f"{folder}: missing {tensors_path.name} (a GPT-2 folder holds config.json and model.safetensors)"
        )
    checkpoint = Checkpoint(tensors_path, hp)
    model = (LlamaModel if isinstance(hp, families.LlamaHParams) else Model)(hp, None, str(folder), checkpoint, dtype)
    model.fingerprint  # noqa: B018 (a damaged file fails here, before anything uses it)
    return model


def read_config(folder: Path) -> HParams:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise VecgptError(f"{folder}: missing config.json (a GPT-2 folder holds config.json and model.safetensors)")
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise VecgptError(f"{config_path}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise VecgptError(f"{config_path}: not a GPT-2 config.json (a JSON object of hyper-parameters)")
    if families.family_of(config) is not None:  # Llama, Mistral, Qwen2
        return families.read_llama_hparams(config, str(folder))
    return read_hparams(config, str(folder))


def shape(model: str | None = None) -> tuple[HParams, str]:
    """A model's shape without its weights: a GPT-2 size by hub name (SIZES), else its config.json alone (a
    folder, a shipped model, or the hub's config.json only). Also what it is: the folder, or the hub name."""
    name = model or DEFAULT_MODEL
    if name in SIZES and not expand(name).is_dir():
        return SIZES[name], name
    if (full := families.known(name)) and not expand(name).is_dir():
        return families.SIZES[full], full
    folder = resolve(name, files=("config.json",))
    return read_config(folder), str(folder)


# safetensors dtype codes numpy reads as they are; BF16 is widened to float32 by a shift
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}


class Checkpoint:
    """A safetensors file read tensor by tensor: the header parsed and checked against the file's size, each
    tensor read with np.fromfile at its offset into an array of its own (no memory map, so nothing of the file
    stays resident once a tensor is converted and dropped)."""

    def __init__(self, path: Path, hp: HParams):
        self.path, self.hp = path, hp
        self.size, header, self.start = read_header(path)
        raw = {k.removeprefix("transformer."): k for k in header}
        raw = {k: v for k, v in raw.items() if not k.endswith(IGNORED_SUFFIXES)}
        self.entries = {name: header[key] for name, key in raw.items()}
        check_tensors({k: tuple(v["shape"]) for k, v in self.entries.items()}, hp, str(path))

    def read(self, name: str, dtype=np.float32, rows: tuple[int, int] | None = None) -> np.ndarray:
        """A tensor, or rows start..stop of it (along its first axis), in `dtype`."""
        entry = self.entries[name]
        code, shape, (begin, _) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        row = int(np.prod(shape[1:], dtype=np.int64))
        start, stop = rows or (0, shape[0] if shape else 1)
        offset = self.start + begin + start * row * np.dtype(DTYPES[code]).itemsize
        with open(self.path, "rb") as f:
            a = np.fromfile(f, DTYPES[code], (stop - start) * row, offset=offset)
        if code == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        return a.reshape((stop - start, *shape[1:]) if rows else shape).astype(dtype, copy=False)

    def fingerprint(self) -> str:
        """`fingerprint` of the weights, from the cache when this file (path, size, mtime) was read before, else
        read tensor by tensor in name order (lm_head checked against wte on the way) and filed in the cache."""
        stat = self.path.stat()
        key = [str(self.path.resolve()), stat.st_size, stat.st_mtime_ns]
        cached = read_fingerprints().get(key[0])
        if cached and cached[:2] == key[1:]:
            return cached[2]
        digest = hashlib.sha256()
        for name in sorted(expected_shapes(self.hp)):
            digest.update(name.encode())
            for rows in self.row_blocks(name):  # the same bytes in the same order as the whole tensor's
                value = self.read(name, np.float32, rows)
                digest.update(np.ascontiguousarray(value).data)
                if name == "wte.weight" and "lm_head.weight" in self.entries:
                    if not np.array_equal(self.read("lm_head.weight", np.float32, rows), value):
                        raise VecgptError(
                            f"{self.path}: lm_head.weight differs from wte.weight; GPT-2 ties them and vecgpt needs that"
                        )
        value = digest.hexdigest()[:16]
        file_fingerprint(key, value)
        return value

    def row_blocks(self, name: str, size: int = 1 << 24) -> list[tuple[int, int]]:
        """A tensor's rows in blocks of about `size` bytes as float32 (a 1-d tensor: one block)."""
        shape = self.entries[name]["shape"]
        if len(shape) < 2:
            return [(0, shape[0] if shape else 1)]
        step = max(1, size // (4 * int(np.prod(shape[1:], dtype=np.int64))))
        return [(a, min(a + step, shape[0])) for a in range(0, shape[0], step)]


def read_header(path: Path) -> tuple[int, dict, int]:
    """(file size, {name: entry} without __metadata__, where the data starts); a header that cannot be parsed, an
    unknown dtype, or tensors that run past the end of the file are each one line."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n < 2 or 8 + n > size:
                raise ValueError(f"header of {n:,} bytes in a file of {size:,}")
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        ends = [int(e["data_offsets"][1]) for e in header.values()]
        for name, e in header.items():
            if e["dtype"] not in DTYPES:
                raise ValueError(f"{name} is {e['dtype']}; vecgpt reads {', '.join(DTYPES)}")
            begin, end = e["data_offsets"]
            if end - begin != int(np.prod(e["shape"], dtype=np.int64)) * np.dtype(DTYPES[e["dtype"]]).itemsize:
                raise ValueError(f"{name}'s offsets disagree with its shape")
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise VecgptError(f"{path}: not a readable safetensors file ({str(e).splitlines()[0][:120]})") from None
    need = 8 + n + max(ends, default=0)
    if need > size:
        raise VecgptError(
            f"{path}: cut short: its header declares {need:,} bytes, the file holds {size:,}; download or copy it again"
        )
    return size, header, 8 + n


def fingerprints_path() -> Path:
    return default_models_dir().parent / "fingerprints.json"


def read_fingerprints() -> dict:
    return read_cache(fingerprints_path())


def file_fingerprint(key: list, value: str) -> None:
    """File a checkpoint's fingerprint under its absolute path with its size and mtime; entries of files gone are
    dropped. Written whole to a file of its own, then renamed: a reader sees the old cache or the new."""
    held = {p: v for p, v in read_fingerprints().items() if Path(p).is_file()}
    held[key[0]] = [*key[1:], value]
    path = fingerprints_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.part")
        tmp.write_text(json.dumps(held, indent=1) + "\n")
        tmp.replace(path)
    except OSError:  # a read-only cache only costs a read of the weights next time
        pass


def check_tensors(shapes: dict[str, tuple], hp: HParams, where: str) -> None:
    """Names and shapes as GPT-2 with these hyper-parameters has them (lm_head, tied to wte, may be there)."""
    if isinstance(hp, families.LlamaHParams):
        return families.check_tensors(shapes, hp, where)
    flat = {k: v for k, v in shapes.items() if k != "lm_head.weight"}
    expected = expected_shapes(hp)
    missing = sorted(set(expected) - set(flat))
    if missing:
        raise VecgptError(
            f"{where}: missing tensor {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )
    extra = sorted(set(flat) - set(expected))
    if extra:
        raise VecgptError(f"{where}: unexpected tensor {extra[0]} (not part of GPT-2 with {hp.n_layer} layers)")
    for name, shape in expected.items():
        if flat[name] != shape:
            raise VecgptError(f"{where}: {name} has shape {flat[name]}, config.json implies {shape}")
    if "lm_head.weight" in shapes and shapes["lm_head.weight"] != expected["wte.weight"]:
        raise VecgptError(f"{where}: lm_head.weight differs from wte.weight; GPT-2 ties them and vecgpt needs that")


def lookup(params: dict, name: str) -> np.ndarray:
    node = params
    for part in name.split("."):
        node = node[int(part)] if part.isdigit() else node[part]
    return node


def unflatten(flat: dict[str, np.ndarray], blocks: bool = True) -> dict:
    params: dict = {}
    for key, value in flat.items():
        node, parts = params, [int(p) if p.isdigit() else p for p in key.split(".")]
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    if blocks:
        params["h"] = [params["h"][i] for i in sorted(params.get("h", {}))]
    return params


def flatten(params: dict, prefix: str = "") -> dict[str, np.ndarray]:
    items = enumerate(params) if isinstance(params, list) else params.items()
    flat: dict[str, np.ndarray] = {}
    for key, value in items:
        name = f"{prefix}{key}"
        flat.update(flatten(value, name + ".") if isinstance(value, (dict, list)) else {name: value})
    return flat


def fingerprint(params: dict) -> str:
    digest = hashlib.sha256()
    for name, value in sorted(flatten(params).items()):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(value, dtype=np.float32).tobytes())
    return digest.hexdigest()[:16]


def save(out: str | Path, hp: HParams, params: dict, dtype=np.float32, extra_config: dict | None = None) -> Path:
    """Write config.json + model.safetensors; files appear only once complete."""
    from safetensors.numpy import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "model.safetensors.part"
    save_file({k: np.ascontiguousarray(v, dtype=dtype) for k, v in flatten(params).items()}, str(tmp))
    os.chmod(tmp, 0o666 & ~current_umask())  # safetensors creates its file readable by the owner only
    tmp.replace(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({**hp.config_json(), **(extra_config or {})}, indent=2) + "\n")
    return out


def current_umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it; put it straight back
    os.umask(mask)
    return mask


def make_params(hp: HParams, seed: int = 0) -> dict:
    """Random weights at GPT-2's initialisation scale (normal 0.02; residual projections 0.02/sqrt(2L))."""
    rng = np.random.default_rng(seed)
    d, std, res_std = hp.n_embd, 0.02, 0.02 / np.sqrt(2 * hp.n_layer)

    def normal(shape, s=std):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(s)

    def ln():
        return {"weight": np.ones(d, np.float32), "bias": np.zeros(d, np.float32)}

    def dense(n_in, n_out, s=std):  # small random biases, so the encoding's bias term is exercised
        return {"weight": normal((n_in, n_out), s), "bias": normal((n_out,), s)}

    blocks = [
        {
            "ln_1": ln(),
            "attn": {"c_attn": dense(d, 3 * d), "c_proj": dense(d, d, res_std)},
            "ln_2": ln(),
            "mlp": {"c_fc": dense(d, 4 * d), "c_proj": dense(4 * d, d, res_std)},
        }
        for _ in range(hp.n_layer)
    ]
    return {
        "wte": {"weight": normal((hp.n_vocab, d))},
        "wpe": {"weight": normal((hp.n_ctx, d), 0.01)},
        "h": blocks,
        "ln_f": ln(),
    }


def make_model(out: str | Path, hp: HParams, seed: int = 0) -> Path:
    return save(out, hp, make_params(hp, seed), extra_config={"vecgpt": {"random_seed": seed}})


def default_models_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vecgpt" / "models"


GPT2_SMALL = HParams(n_layer=12, n_head=12, n_embd=768, n_ctx=1024, n_vocab=50257)
# The four GPT-2 checkpoints, by their names on the Hugging Face hub; every head is 64 wide
SIZES = {
    "gpt2": GPT2_SMALL,
    "gpt2-medium": HParams(n_layer=24, n_head=16, n_embd=1024, n_ctx=1024, n_vocab=50257),
    "gpt2-large": HParams(n_layer=36, n_head=20, n_embd=1280, n_ctx=1024, n_vocab=50257),
    "gpt2-xl": HParams(n_layer=48, n_head=25, n_embd=1600, n_ctx=1024, n_vocab=50257),
}


def size_shape(name: str, scale: int = 1) -> HParams:
    """A GPT-2 size's shape (SIZES), or at `scale` > 1 the same shape scaled down and keeping its ratios: the heads
    (12, 16, 20, 25) as they are, each head 64 / scale wide, a twelfth of the layers for scale 16 and more (so every
    size keeps its 1:2:3:4 depths), the context and vocabulary divided by `scale` (at least 16 and 256)."""
    if name not in SIZES:
        raise VecgptError(f"no GPT-2 size {name!r}; sizes: {', '.join(SIZES)}")
    hp = SIZES[name]
    if scale == 1:
        return hp
    if scale < 1 or 64 % scale:
        raise VecgptError(f"--scale must divide a head's 64 columns (1, 2, 4, 8, 16, 32 or 64), not {scale}")
    layers = hp.n_layer // 12 if scale >= 16 else hp.n_layer
    return HParams(layers, hp.n_head, hp.n_embd // scale, max(16, hp.n_ctx // scale), max(256, hp.n_vocab // scale))


def random_gpt2_small(seed: int = 0) -> Path:
    """A checkpoint of random weights at GPT-2 small shape, written once to the cache (for benchmarks)."""
    import sys

    path = default_models_dir() / f"gpt2-small-random-s{seed}"
    if not (path / "model.safetensors").is_file():
        print(f"writing a random GPT-2 small checkpoint to {path}", file=sys.stderr)
        make_model(path, GPT2_SMALL, seed=seed)
    return path


def describe(hp: HParams) -> str:
    return ", ".join(f"{k}={v}" for k, v in asdict(hp).items())


def make_llama_params(hp: families.LlamaHParams, seed: int = 0, std: float = 0.02) -> dict:
    """Random weights for a Llama-family shape, nested as LlamaModel.params: matrices and biases normal(std),
    norm weights near 1."""
    rng = np.random.default_rng(seed)
    flat = {}
    for name, shape in families.expected_shapes(hp).items():
        noise = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        flat[name] = 1 + noise if "norm" in name else noise
    return unflatten(flat, blocks=False)


def make_llama_model(out: str | Path, hp: families.LlamaHParams, seed: int = 0, std: float = 0.02) -> Path:
    return save(out, hp, make_llama_params(hp, seed, std), extra_config={"vecgpt": {"random_seed": seed}})
