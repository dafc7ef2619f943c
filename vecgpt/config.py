"""Run configuration: a TOML file lists only what differs from these defaults."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from vecgpt.errors import VecgptError
from vecgpt.policy import Policy
from vecgpt.policy import check as check_policy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# "four": a layer is four rounds (engine.Session); "three": weight products made at load, three (vecgpt.three_rounds);
# "five": the textbook order, attention's c_proj one search of the whole matrix (vecgpt.five_rounds)
LAYOUTS = ("four", "three", "five")
# "auto" (the default) picks one for the store (auto_layout): a store behind a network pays for each round trip,
# an in-process one for each request (docs/layouts.md has both counts for each layout)
AUTO = "auto"


@dataclass
class Config:
    backend: str = "faiss"  # a module in vecgpt/backends
    # "l2": padded documents under squared L2; "ip": plain inner product; unset: the backend's fastest exact one
    metric: str | None = None
    layout: str = AUTO  # "four" rounds a layer; "three": weight products made at load; "five"; "auto": see AUTO
    model: str | None = None  # local folder, shipped model name or hub name; None: the shipped demo
    top_k: int = 40  # candidates the token search returns
    prompt_block: bool = True  # read a prompt in blocks of queries per search (false: a token at a time)
    prefill_chunk: int = 64  # a prompt's tokens read in one step (a block), so a long one holds up no other text
    # each head's key search returns its K best earlier keys by q.k (softmax over them and the query's own); unset: all
    attention_top_k: int | None = None
    attention_index: str | None = (
        None  # with attention_top_k: the store's approximate index of keys ("hnsw"); unset: exact
    )
    # or every key whose scaled score is within beta of the best (vecgpt.policy); both choose between the first
    # attention_sinks and the last attention_window earlier positions, always kept
    attention_threshold: float | None = None
    attention_sinks: int | None = None
    attention_window: int | None = None
    store: dict = field(default_factory=dict)  # keyword arguments of the backend's connect()

    def __post_init__(self):
        self.metric = self.metric or preferred_metric(self.backend)
        if self.metric not in ("l2", "ip"):
            raise VecgptError(f"metric must be 'l2' or 'ip', not {self.metric!r}")
        if self.layout not in (*LAYOUTS, AUTO):
            raise VecgptError(f"layout must be one of {', '.join(LAYOUTS)} or {AUTO}, not {self.layout!r}")
        self.auto = self.layout == AUTO  # the model may change the pick (settle_layout)
        if self.auto:
            self.layout = auto_layout(self.backend, self.store)
        if self.top_k < 1:
            raise VecgptError(f"top_k must be at least 1, not {self.top_k}")
        if self.prefill_chunk < 1:
            raise VecgptError(f"prefill_chunk must be 1 or more tokens, not {self.prefill_chunk}")
        check_policy(self.policy(), n_ctx=1 << 30)  # the model's context is checked when it is known
        if self.attention_index is not None and self.attention_top_k is None:
            raise VecgptError(
                f"attention_index = {self.attention_index!r} searches an index for each query's K best keys: "
                f"set attention_top_k too (--attention-top-k K)"
            )

    def policy(self) -> Policy:
        """The earlier keys each query keeps (vecgpt.policy)."""
        return Policy(self.attention_top_k, self.attention_threshold, self.attention_sinks, self.attention_window)


def preferred_metric(backend: str) -> str:
    """The encoding a backend runs fastest exactly (its module's PREFERRED_METRIC, docs/speed.md); else l2, which
    every store ranks by. An unknown or uninstalled backend: l2 (opening the store says what is wrong)."""
    from vecgpt.backends.base import extra

    try:
        return extra(backend, "PREFERRED_METRIC") or "l2"
    except (VecgptError, KeyError):
        return "l2"


def auto_layout(backend: str, store: dict, rotary: bool = False) -> str:
    """The layout "auto" picks: behind a network (the backend module's NETWORKED, a bool or a function of the [store]
    options: turbopuffer; pgvector given a DSN; Milvus given a server's URI) the fewest round trips, three, or four for
    a family with rotary positions (`rotary`: Llama, Qwen2, Mistral), which has no layout three (docs/llama-engine.md);
    in process (memory, FAISS, LanceDB, SQLite, DuckDB, pgvector's own local server, Milvus Lite) the fewest requests,
    five. An unknown or uninstalled backend: five (opening the store says what is wrong)."""
    from vecgpt.backends.base import extra

    try:
        said = extra(backend, "NETWORKED")
    except (VecgptError, KeyError, ImportError):
        return "five"
    if not (said(**store) if callable(said) else said):
        return "five"
    return "four" if rotary else "three"


def settle_layout(config: Config, hparams) -> str:
    """The layout a config runs a model of shape `hparams` in: "auto" picked again now that the model is known (a
    rotary family behind a network takes four where GPT-2 takes three), else the one the config names."""
    if getattr(config, "auto", False):
        config.layout = auto_layout(config.backend, config.store, rotary=hasattr(hparams, "rope_theta"))
    return config.layout


TYPES = {
    "backend": str,
    "metric": str,
    "layout": str,
    "model": (str, type(None)),
    "top_k": int,
    "prompt_block": bool,
    "prefill_chunk": int,
    "attention_top_k": int,
    "attention_index": str,
    "attention_threshold": (float, int),
    "attention_sinks": int,
    "attention_window": int,
    "store": dict,
}


def read_toml(path: str | Path, what: str = "config file", hint: str = "") -> dict:
    """A TOML file as a dict; a missing or malformed file is a one-line VecgptError."""
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise VecgptError(f"{what} {path} does not exist{hint}") from None
    except IsADirectoryError:
        raise VecgptError(f"{what} {path} is a folder, not a TOML file{hint}") from None
    except OSError as e:
        raise VecgptError(f"cannot read {what} {path} ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise VecgptError(f"{path}: not valid TOML (not UTF-8 text)") from None
    except tomllib.TOMLDecodeError as e:
        raise VecgptError(f"{path}: not valid TOML ({e})") from None


def load_config(path: str | Path | None = None, **overrides) -> Config:
    values = read_toml(path, hint=" (see configs/ for examples)") if path is not None else {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in fields(Config)}
    for key, value in values.items():
        if key not in known:
            raise VecgptError(f"{path or 'config'}: unknown key {key!r}; known keys: {', '.join(sorted(known))}")
        expected = TYPES[key]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise VecgptError(
                f"{path or 'config'}: {key} = {value!r} has the wrong type "
                f"(expected {getattr(expected, '__name__', 'string')})"
            )
    return Config(**values)


def open_store(config: Config):
    """The config's store, which remembers the encoding it was opened for: `loading.push` loads in it unless told."""
    from vecgpt.backends.base import get_store

    store = get_store(config.backend, **config.store)
    store.opened_for = (config.metric, config.layout)
    return store
