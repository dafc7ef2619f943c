"""What the experiments compare: models by name, the store variants a list of configs gives, engines on them."""

from __future__ import annotations

import argparse
import copy
import inspect
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # the repository's configs/
DEFAULT_CONFIGS = [str(CONFIGS / name) for name in ("memory.toml", "faiss.toml", "faiss-l2.toml")]
RANDOM_SMALL = "random-small"  # alias: random weights at GPT-2 small shape (as benchmarks/per_token.py)
GPT2_SMALL = dict(n_layer=12, n_head=12, n_embd=768, n_ctx=1024, n_vocab=50257)


def load_model(name: str | None, dtype=np.float32):
    """A model by the names `vecgpt --model` takes, plus `random-small` (made once if absent)."""
    from vecgpt import weights

    if name == RANDOM_SMALL:
        name = str(weights.random_gpt2_small())
    return weights.load(name, dtype=dtype)


def model_slug(name: str | None) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name.rstrip("/")).name if name else "shakespeare") or "model"


def is_llama(model) -> bool:
    """A Llama-family model (Llama, Qwen2, Mistral) rather than GPT-2: its numpy side is vecgpt.reference_llama."""
    from vecgpt.families import LlamaHParams

    return isinstance(model.hparams, LlamaHParams)


def reference(model, dtype=np.float64, policy=None):
    """The model's numpy forward pass with a KV cache: reference.Reference for GPT-2, LlamaReference for a Llama."""
    if is_llama(model):
        from vecgpt.reference_llama import LlamaReference

        return LlamaReference(model, dtype, policy=policy)
    from vecgpt.reference import Reference

    return Reference(model, dtype, policy=policy)


def codec(model):
    """encode / decode for the model's text: a Llama folder's own tokenizer (GPT-2's where it has none and GPT-2's
    vocabulary, as shakespeare-llama), else GPT-2's (vecgpt.tokenizer)."""
    from vecgpt import tokenizer

    return model.tokenizer if is_llama(model) else tokenizer


def model_label(model, name: str | None) -> str:
    hp = model.hparams
    heads = f"{hp.n_head} / {hp.n_kv_head} heads ({hp.family})" if is_llama(model) else f"{hp.n_head} heads"
    return (
        f"{name or 'shakespeare (shipped demo)'}: {hp.n_layer} layers, {heads}, {hp.n_embd} wide, "
        f"{hp.n_vocab} tokens, fingerprint {model.fingerprint[:12]}"
    )


@dataclass
class Variant:
    """One store in one encoding: a config, perhaps with its metric swapped and its path moved."""

    config_path: str
    config: object  # vecgpt.config.Config
    note: str = ""
    stats: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.config.backend} ({self.config.metric})"


def _connect_options(backend: str) -> dict:
    """connect()'s parameters and their defaults; {} where the backend's client is not installed."""
    from vecgpt.backends.base import connector

    try:
        params = inspect.signature(connector(backend)).parameters
    except Exception:  # noqa: BLE001 - open_store will say what is missing
        return {}
    return {name: p.default for name, p in params.items()}


def _safe(name: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")


def place(config, name: str, root: str | None = None) -> bool:
    """Give a config's store a place of its own: with root, the folder root/name (stores with a
    `path`), the schema vecgpt_<name> (a `schema`) or the namespace prefix <prefix><name>- (a
    `prefix`); without root, a sibling of its current place with name as suffix. False: neither."""
    options, store = _connect_options(config.backend), dict(config.store)
    if "path" in options:
        current = store.get("path") or options["path"]
        if root is None and not current:
            from vecgpt.config import open_store

            s = open_store(config)
            current = str(getattr(s, "path", "") or "")
            s.close()
        if root is None and not current:
            return False
        store["path"] = str(
            Path(root) / name
            if root is not None
            else Path(current).expanduser().with_name(Path(current).expanduser().name + f"-{name}")
        )
    elif "schema" in options:
        store["schema"] = (
            f"vecgpt_{_safe(name)}" if root is not None else f"{store.get('schema') or options['schema']}_{_safe(name)}"
        )
    elif "prefix" in options:
        store["prefix"] = f"{store.get('prefix') or options['prefix']}{_safe(name)}-"
    else:
        return False
    config.store = store
    return True


def variants(config_paths, store_root: str | None = None, both_metrics: bool = True) -> list[Variant]:
    """The configs as given, plus, where a store offers the other encoding and no config asks for it,
    the same store in that encoding in a place of its own (see `place`). With store_root, every
    store is placed by its config's name: store_root/<config name> for folder stores."""
    from vecgpt.config import load_config, open_store

    out: list[Variant] = []
    for path in config_paths:
        config = load_config(path)
        if store_root:
            place(config, Path(path).stem, store_root)
        out.append(Variant(str(path), config))
    if not both_metrics:
        return out
    have = {(v.config.backend, v.config.metric) for v in out}
    for v in list(out):
        other = "ip" if v.config.metric == "l2" else "l2"
        if (v.config.backend, other) in have:
            continue
        try:
            store = open_store(v.config)
            offers = tuple(getattr(store, "metrics", ()))
            store.close()
        except Exception as e:  # noqa: BLE001 - an unreachable store is reported when it is used
            print(f"{v.config_path}: cannot open to ask its encodings ({e})", file=sys.stderr)
            continue
        if other not in offers:
            continue
        config = copy.deepcopy(v.config)
        config.metric = other
        if not place(config, other):
            print(
                f"{v.config_path}: {v.config.backend} also offers {other}; give a config with metric = "
                f"'{other}' and a store of its own to compare encodings",
                file=sys.stderr,
            )
            continue
        out.append(Variant(v.config_path, config, note=f"metric swapped to {other}"))
        have.add((config.backend, other))
    order = {p: i for i, p in enumerate(config_paths)}
    return sorted(out, key=lambda v: (order[v.config_path], v.config.metric != "l2"))


def open_engine(variant: Variant, model, progress: bool = False):
    """An Engine on the variant's store holding `model` (loaded first where the store lacks it)."""
    from vecgpt.api import config_engine
    from vecgpt.config import open_store

    store = open_store(variant.config)
    t = time.perf_counter()
    try:
        key = push_in_family_layout(store, variant, model, progress)
    except BaseException:
        store.close()
        raise
    variant.stats["push_s"] = time.perf_counter() - t
    return config_engine(store, variant.config, key)


def push_in_family_layout(store, variant: Variant, model, progress: bool) -> str:
    """The model pushed in the config's layout, or in five where a Llama-family model is refused in that one (not
    built for the family yet: the refusal comes before anything is written); the variant's note says so."""
    from vecgpt.errors import VecgptError
    from vecgpt.loading import push

    c = variant.config
    try:
        return push(store, model, c.metric, progress=progress, layout=c.layout)["fingerprint"]
    except VecgptError:
        if not is_llama(model) or c.layout == "five":
            raise
    c.layout = "five"
    variant.note = ", ".join(filter(None, [variant.note, "layout five (the Llama family's)"]))
    return push(store, model, c.metric, progress=progress, layout=c.layout)["fingerprint"]


def describe_variant(v: Variant) -> dict:
    c = v.config
    return {
        "label": v.label,
        "config": v.config_path,
        "backend": c.backend,
        "metric": c.metric,
        "layout": c.layout,
        "store": c.store,
        "top_k": c.top_k,
        "prompt_block": c.prompt_block,
        "note": v.note,
    }


def add_common_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument(
        "--configs",
        nargs="+",
        default=DEFAULT_CONFIGS,
        help="store configs (TOML), one subject each (default: configs/memory, faiss, faiss-l2)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="model folder, shipped name, hub name such as gpt2, or "
        f"'{RANDOM_SMALL}' (random weights at GPT-2 small shape); default: the shipped demo",
    )
    p.add_argument(
        "--store-root",
        default=None,
        help="put each path-based store under DIR/<config name> "
        "instead of the config's path (so runs do not clobber each other)",
    )
    p.add_argument("--no-swap", action="store_true", help="only the configs' own encodings (no l2/ip comparison)")
    p.add_argument("--seed", type=int, default=0, help="recorded in the provenance (greedy runs draw nothing)")
    p.add_argument("--out", default=None, help=f"results folder (default: a new ./results/{name}/<timestamp>)")
    p.add_argument("--quiet", action="store_true", help="no load progress bars")
