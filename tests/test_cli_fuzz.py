"""No traceback on any input: argv built from the CLI's own grammar, config files from Config's own keys.

Every example runs `main()` in process, offline (the hub offline and its cache empty, PostgreSQL at a
closed port, no turbopuffer key, a socket guard that refuses anything but loopback), and must exit 0
or 2 (argparse's usage errors exit 2 too) with no traceback. Commands that start servers or long jobs
(`tpuf-local`, `serve`, `experiment ...`, `attention-memory --measure`) are only given argv that argparse refuses.
The examples are derandomized so a run on any machine tries the same inputs; set VECGPT_FUZZ_EXAMPLES
to try more, with fresh random ones.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import itertools
import json
import logging
import os
import re
import shutil
import socket
from dataclasses import fields

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vecgpt import cli
from vecgpt.backends.base import available
from vecgpt.config import Config

EXAMPLES = int(os.environ.get("VECGPT_FUZZ_EXAMPLES", "0"))
REFUSED_ONLY = {"tpuf-local", "serve", "experiment"}  # servers and long jobs: argparse must refuse their argv
SLOW_FLAGS = {"--measure"}
JUNK = "--fuzz-no-such-option"

# Paths are placeholders, resolved per example against the `world` folder (see `resolve`).
PATHS = ["@fresh", "@fresh/nested/deeper", "@folder", "@file", "@binary", "@missing", "@model", "@garbage_model", ""]
MODELS = [
    "@model",
    "@garbage_model",
    "@folder",
    "@file",
    "@missing",
    "shakespear",
    "Shakespeare",
    "someone/not-here",
    "gpt2",
    "",
    "/nonexistent/model",
]
ODD = [
    "",
    " ",
    "-",
    "--",
    "-1",
    "0",
    "1",
    "1e309",
    "nan",
    "inf",
    "-inf",
    "0x10",
    "1_000",
    "١٢",
    "\udcff",
    "é" * 3,
    "-h",
    "--help",
    "a" * 300,
]


def ints(clean: bool):
    small = st.integers(1, 6)
    return (
        small
        if clean
        else st.one_of(small, st.integers(-3, 0), st.integers(10**12, 10**30), st.integers(-(10**30), -(10**12)))
    )


def floats(clean: bool):
    small = st.floats(0, 3)
    return small if clean else st.one_of(small, st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3))


def odd_or(valid, clean: bool):
    return valid if clean else st.one_of(valid, st.sampled_from(ODD), st.text(max_size=3000))


def value_of(action: argparse.Action, clean: bool):
    """A value for one option: in a clean example one argparse accepts, else anything."""
    if action.choices:
        return odd_or(st.sampled_from(sorted(action.choices)), clean)
    if action.type is int or getattr(action.type, "__name__", "") == "_positive_int":
        return odd_or(ints(clean).map(str), clean)
    if action.type is float:
        return odd_or(floats(clean).map(str), clean)
    named = {
        "model": st.sampled_from(["@model"] * 3 + MODELS[: 1 + 10 * (not clean)]),
        "config": st.sampled_from(["@config"] if clean else ["@config"] * 4 + PATHS),
        "backend": st.sampled_from(["faiss", "memory"] if clean else available() + ["nosuch", "", "base"]),
        "out": st.sampled_from(PATHS),
        "file": st.sampled_from(PATHS),
        "prompt": st.text(min_size=1, max_size=12),
        "text": st.text(max_size=12),
        "scores": floats(clean).map(str),
    }
    return odd_or(named.get(action.dest, st.text(max_size=30)), clean)


def words_for(action: argparse.Action, clean: bool):
    """The argv words one action contributes: [] or [flag] or [flag, value...] or positional values."""
    if action.nargs == 0:
        return st.sampled_from([[], [action.option_strings[-1]]])
    many = action.nargs in ("*", "+")
    values = (
        st.lists(value_of(action, clean), min_size=0 if action.nargs == "*" else 1, max_size=3)
        if many
        else value_of(action, clean).map(lambda v: [v])
    )
    if action.option_strings:
        given = values.map(lambda v: [action.option_strings[-1], *v])
        return given if clean and action.dest == "config" else st.one_of(st.just([]), given)
    return values if clean else st.one_of(values, st.just([]))


def commands(root: argparse.ArgumentParser) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    out = {}

    def walk(p, path):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out[path] = p
        for name, child in subs[0].choices.items() if subs else ():
            walk(child, path + (name,))

    walk(root, ())
    return out


GRAMMAR = commands(cli.parser())
COMMANDS = sorted(GRAMMAR, key=lambda p: (p[0] in REFUSED_ONLY, p))
COMMANDS = [p for p in COMMANDS for _ in range(1 if p[0] in REFUSED_ONLY else 4)]  # most examples run something


@st.composite
def argvs(draw, clean: bool):
    path = draw(st.sampled_from(COMMANDS))
    actions = [
        a
        for a in GRAMMAR[path]._actions
        if not isinstance(a, argparse._HelpAction) and not set(a.option_strings) & SLOW_FLAGS
    ]
    options = [w for a in actions if a.option_strings for w in draw(words_for(a, clean))]
    positionals = [w for a in actions if not a.option_strings for w in draw(words_for(a, clean))]
    argv = [*path, *options, *(["--"] if positionals else []), *positionals]  # "--": a prompt may start with "-"
    if path[0] in REFUSED_ONLY:
        argv.insert(len(path), JUNK)
    return argv


def store_option_values(clean: bool):
    paths = st.sampled_from(["@fresh", "@fresh/nested"] if clean else PATHS)
    return (
        paths
        if clean
        else st.one_of(
            paths,
            st.text(max_size=20),
            ints(False),
            floats(False),
            st.booleans(),
            st.lists(st.sampled_from(["layer", "head", "x", ""]), max_size=3),
            st.just("a\x00b"),
        )
    )


def store_keys(backend: str) -> list[str]:
    return list(inspect.signature(__import__(f"vecgpt.backends.{backend}", fromlist=["x"]).connect).parameters)


STORE_KEYS = sorted({name for b in available() for name in store_keys(b)} | {"colour"})


def config_values(key: str, clean: bool):
    valid = {
        "backend": st.sampled_from(["faiss", "memory"] if clean else available() + ["nosuch"]),
        "metric": st.sampled_from(["l2", "ip"] + ["cosine"] * (not clean)),
        "layout": st.sampled_from(["four", "three"] + ["two"] * (not clean)),
        "model": st.sampled_from(["@model"] if clean else MODELS),
        "top_k": ints(clean),
        "prompt_block": st.booleans(),
        "prefill_chunk": ints(clean),
        "attention_top_k": ints(clean),
        "attention_threshold": floats(clean),
        "attention_sinks": ints(clean),
        "attention_window": ints(clean),
        "attention_index": st.sampled_from(["hnsw"] + ["ivf"] * (not clean)),
        "store": st.dictionaries(
            st.just("path") if clean else st.sampled_from(STORE_KEYS),
            store_option_values(clean),
            max_size=1 if clean else 4,
        ),
    }
    wrong = st.one_of(st.text(max_size=10), ints(False), floats(False), st.booleans())
    return valid[key] if clean else st.one_of(valid.get(key, wrong), wrong)


@st.composite
def config_texts(draw, clean: bool):
    """A config file: `clean` (sound), or a sound one with any [store] options, or anything."""
    if not clean and draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(["backend = \n", "[store\n", "\x00", "top_k = 1\ntop_k = 2\n", "= 3"]))
    if not clean and draw(st.booleans()):  # a sound config but for its [store] options
        backend = draw(st.sampled_from(available()))
        store = draw(st.dictionaries(st.sampled_from(store_keys(backend)), store_option_values(False), max_size=4))
        return toml({"backend": backend, "model": "@model", "store": store})
    names = [f.name for f in fields(Config)] + ["colour"] * (not clean)
    keys = draw(st.lists(st.sampled_from(names), unique=True, max_size=6))
    return toml({k: draw(config_values(k, clean)) for k in keys})


def toml(values: dict) -> str:
    """Enough TOML for these values; tables last."""
    plain = [f"{k} = {toml_value(v)}" for k, v in values.items() if not isinstance(v, dict)]
    tables = [f"[{k}]\n" + toml(v) for k, v in values.items() if isinstance(v, dict)]
    return "\n".join(plain + tables) + "\n"


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(v), repr(v))
    if isinstance(v, list):
        return "[" + ", ".join(map(toml_value, v)) + "]"
    return json.dumps(v) if isinstance(v, str) else str(v)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("fuzz")
    (root / "folder").mkdir()
    (root / "file").write_text("not a model, not a config\n")
    (root / "binary").write_bytes(b"\xff\xfe\x00garbage")
    (root / "garbage_model").mkdir()
    (root / "garbage_model" / "config.json").write_text('{"n_layer": "two"')
    (root / "garbage_model" / "model.safetensors").write_bytes(b"\x00" * 64)
    # a copy: a fuzzed `make-model --out @model` must not rewrite the session's tiny model under later tests
    model = shutil.copytree(tiny_model_dir, root / "model")
    return {"root": root, "model": model, "counter": itertools.count()}


def resolve(word: str, world: dict, config_text: str) -> str:
    if not word.startswith("@"):
        return word
    name, _, rest = word[1:].partition("/")
    root, n = world["root"], next(world["counter"])
    if name == "fresh":
        return str(root / f"fresh{n}" / rest)
    if name == "config":
        path = root / f"config{n}.toml"
        text = re.sub(
            r"@(fresh|folder|file|binary|missing|model|garbage_model)",
            lambda m: resolve(m.group(0), world, ""),
            config_text,
        )
        path.write_text(text, errors="surrogatepass")
        return str(path)
    return str(world["model"] if name == "model" else root / name)


@pytest.fixture
def offline(monkeypatch, world):
    """No network: hub offline with an empty cache, PostgreSQL at a closed port, no turbopuffer key."""
    root = world["root"]
    monkeypatch.chdir(root)  # a relative path (make-model's out, a store) lands here, never in the checkout
    for name, value in {
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(root / "hf"),
        "XDG_CACHE_HOME": str(root / "cache"),
        "VECGPT_PG_DSN": "postgresql://fuzz@127.0.0.1:1/none?connect_timeout=2",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("TURBOPUFFER_API_KEY", "TURBOPUFFER_BASE_URL", "TURBOPUFFER_REGION"):
        monkeypatch.delenv(name, raising=False)
    with contextlib.suppress(ImportError):
        import huggingface_hub.constants as hub

        monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(hub, "HF_HUB_CACHE", str(root / "hf"))
    attempts = []

    def guard(connect):
        def checked(sock, address):
            host = address[0] if isinstance(address, tuple) else address
            if sock.family != socket.AF_UNIX and host not in ("127.0.0.1", "::1", "localhost"):
                attempts.append(address)
                raise OSError(f"fuzz: network disabled ({address})")
            return connect(sock, address)

        return checked

    monkeypatch.setattr(socket.socket, "connect", guard(socket.socket.connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guard(socket.socket.connect_ex))
    return attempts


def run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err, log = io.StringIO(), io.StringIO(), logging.StreamHandler(io.StringIO())
    logging.getLogger().addHandler(log)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as e:  # argparse: usage errors (2) and --help (0)
                code = e.code
    finally:
        logging.getLogger().removeHandler(log)
    return code, out.getvalue(), err.getvalue() + log.stream.getvalue()


@settings(
    max_examples=EXAMPLES or 150,
    deadline=None,
    derandomize=not EXAMPLES,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
@given(data=st.data())
def test_any_argv_exits_0_or_2_without_traceback(data, world, offline):
    clean = data.draw(st.booleans(), "clean argv")  # half the examples pass argparse and reach the code behind it
    argv, config_text = data.draw(argvs(clean), "argv"), data.draw(config_texts(data.draw(st.booleans())), "config")
    argv = [resolve(w, world, config_text) for w in argv]
    code, _, err = run_main(argv)
    assert code in (0, 2), (argv, code, err[-2000:])
    assert "Traceback" not in err, (argv, err[-2000:])
    if code == 2 and JUNK not in argv:
        assert err.strip(), argv  # a refusal always says why
    assert not offline, f"{argv} tried the network: {offline}"
