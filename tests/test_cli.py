"""The command line: results on stdout, one-line errors and a non-zero exit on bad input."""

import fcntl
import json
import os
import stat
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pytest

import vecgpt
from vecgpt import api, tokenizer, weights
from vecgpt.cli import main
from vecgpt.sampling import Candidates


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, needle):
    assert code != 0
    lines = [l for l in err.splitlines() if l.startswith("vecgpt: error")]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


@pytest.fixture
def store_args(tmp_path):
    return ["--backend", "faiss", "--config", str(write_config(tmp_path, f'[store]\npath = "{tmp_path / "faiss"}"\n'))]


def write_config(tmp_path, text, name="c.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_generate_json_shape(capsys, store_args, tiny_model_dir):
    code, out, err = run(capsys, "generate", *store_args, "--model", str(tiny_model_dir), "Hello", "-n", "3", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["prompt_tokens"] == [15496] and len(d["tokens"]) == 3 and d["backend"] == "faiss"
    assert d["steps"][0]["token"] == d["tokens"][0] and len(d["steps"][0]["candidates"]) == 40
    assert d["requests"]["total"] == sum(d["requests"]["by_kind"].values()) and len(d["requests"]["per_token"]) == 3
    assert d["model_fingerprint"] and isinstance(d["text"], str)


def make_other(capsys, tmp_path) -> str:
    run(
        capsys,
        "make-model",
        str(tmp_path / "other"),
        "--layers",
        "1",
        "--heads",
        "2",
        "--embd",
        "8",
        "--ctx",
        "16",
        "--vocab",
        "50257",
    )
    return str(tmp_path / "other")


def test_load_is_idempotent_and_a_second_model_sits_beside_the_first(capsys, store_args, tiny_model_dir, tmp_path):
    assert run(capsys, "load", *store_args, "--model", str(tiny_model_dir))[0] == 0
    assert run(capsys, "load", *store_args, "--model", str(tiny_model_dir))[0] == 0
    other = make_other(capsys, tmp_path)
    code, out, _ = run(capsys, "generate", *store_args, "--model", other, "x", "-n", "1", "--json")
    assert code == 0 and json.loads(out)["model_fingerprint"] == weights.load(other).fingerprint
    code, out, _ = run(capsys, "ls", *store_args)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2, out
    for model in (str(tiny_model_dir), other):
        line = next(x for x in lines if f"  {model}  " in x)
        # the default encoding and layout for FAISS: inner products (its fastest exact one), five (in process)
        assert line.startswith(weights.load(model).fingerprint + "-e") and "metric=ip  layout=five" in line
        assert " docs " in line
        assert " MB " in line and "loaded 20" in line
    code, out, _ = run(capsys, "drop", *store_args, "--model", other)
    assert code == 0 and out.startswith("dropped " + weights.load(other).fingerprint)
    code, out, _ = run(capsys, "ls", *store_args)
    assert len(out.splitlines()) == 1 and f"  {tiny_model_dir}  " in out
    assert_one_line_error(*run(capsys, "drop", *store_args, "--model", other)[::2], "holds no model")
    assert_one_line_error(*run(capsys, "drop", *store_args)[::2], "--model")


def test_store_option_names_the_location(capsys, tmp_path, tiny_model_dir):
    """--store is the backend's path (schema, prefix): two locations, two stores."""
    for where in ("a", "b"):
        args = ["--backend", "faiss", "--store", str(tmp_path / where)]
        if where == "a":
            assert run(capsys, "load", *args, "--model", str(tiny_model_dir))[0] == 0
        out = run(capsys, "ls", *args)[1]
        assert ("metric=" in out) == (where == "a") and (tmp_path / where).exists() == (where == "a")


def test_a_store_in_the_previous_layout_is_one_line(capsys, store_args, tmp_path, tiny_model_dir):
    from vecgpt.backends.base import get_store

    old = get_store("faiss", path=str(tmp_path / "faiss"))
    old.create("wte", 8, "l2")  # what the previous layout named a model's token table
    old.close()
    for command in (["ls"], ["load", "--model", str(tiny_model_dir)]):
        assert_one_line_error(*run(capsys, command[0], *store_args, *command[1:])[::2], "drop --old-layout")
    assert run(capsys, "drop", *store_args, "--old-layout")[0] == 0
    assert run(capsys, "load", *store_args, "--model", str(tiny_model_dir))[0] == 0


def test_compare_prints_scores_side_by_side(capsys, store_args, tiny_model_dir):
    code, out, _ = run(
        capsys, "compare", *store_args, "--model", str(tiny_model_dir), "Hello world", "-n", "4", "--json"
    )
    d = json.loads(out)
    assert code == 0 and len(d["scores"]) == 40 and d["max_abs_error"] < 1e-4 and d["identical_steps"] == 4


def test_tokenize(capsys):
    assert run(capsys, "tokenize", "Hello world", "--json")[1].strip() == "[15496, 995]"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["generate", "--model", "/nonexistent/folder", "hi"], "no such model folder"),
        (["generate", "--model", "someone/not-on-this-machine", "hi"], "--model PATH"),
        (["generate", "--backend", "nosuchstore", "hi"], "known backends: "),
        (["generate", "--top-k", "60000", "hi"], "--top-k 60000"),
        (["generate", "-n", "100", "hi"], "context of 64"),
        (["generate", "--store", "~nosuchuser0/faiss", "hi"], "no such user's home"),
        (["generate", "--model", "~nosuchuser0/model", "hi"], "no such user's home"),
    ],
)
def test_bad_input_one_line(capsys, tiny_model_dir, args, needle, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if "--model" not in args:
        args = args[:1] + ["--model", str(tiny_model_dir)] + args[1:]
    assert_one_line_error(*run(capsys, *args)[::2], needle)


@pytest.mark.parametrize(
    "text, needle",
    [
        ('backend = "faiss"\ncolour = "red"\n', "unknown key 'colour'"),
        ('top_k = "forty"\n', "top_k = 'forty' has the wrong type"),
        ('metric = "cosine"\n', "metric must be"),
        ('backend = "faiss"\n[store]\nhost = "x"\n', "takes no option 'host'"),
        ("backend = \n", "not valid TOML"),
    ],
)
def test_bad_config_one_line(capsys, tmp_path, tiny_model_dir, text, needle):
    config = write_config(tmp_path, text)
    assert_one_line_error(
        *run(capsys, "generate", "--config", str(config), "--model", str(tiny_model_dir), "hi")[::2], needle
    )


def test_missing_config_file(capsys, tmp_path):
    assert_one_line_error(*run(capsys, "ls", "--config", str(tmp_path / "none.toml"))[::2], "does not exist")


def test_compare_loads_the_model_it_is_given_beside_another(capsys, store_args, tiny_model_dir, tmp_path):
    assert run(capsys, "load", *store_args, "--model", str(tiny_model_dir))[0] == 0
    code, out, _ = run(
        capsys, "compare", *store_args, "--model", make_other(capsys, tmp_path), "x", "-n", "1", "--json"
    )
    assert code == 0 and json.loads(out)["identical_steps"] == 1


def test_console_script_stdout_is_only_the_result(tiny_model_dir, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vecgpt",
            "generate",
            "--backend",
            "memory",
            "--model",
            str(tiny_model_dir),
            "Hi",
            "-n",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        env={"XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)  # progress bars went to stderr


# Cases a new user hit; each once gave a traceback or silently did something else than asked.


def test_config_path_that_is_a_folder(capsys, tmp_path):
    assert_one_line_error(*run(capsys, "ls", "--config", str(tmp_path))[::2], "is a folder, not a TOML file")


def test_ls_into_a_reader_that_closes_early_exits_quietly(tmp_path):
    """`vecgpt ls | head`: the reader is gone before anything is written, so the write meets EPIPE."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "vecgpt", "ls", "--backend", "memory"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 0 and err == "", err


def test_both_encodings_of_one_model_sit_side_by_side(capsys, store_args, tiny_model_dir):
    assert run(capsys, "load", *store_args, "--model", str(tiny_model_dir))[0] == 0  # FAISS's default: ip
    code, out, _ = run(
        capsys, "generate", *store_args, "--model", str(tiny_model_dir), "--metric", "l2", "hi", "-n", "1", "--json"
    )
    assert code == 0 and json.loads(out)["metric"] == "l2"
    assert sorted(line.split("metric=")[1][:2] for line in run(capsys, "ls", *store_args)[1].splitlines()) == [
        "ip",
        "l2",
    ]
    code, out, _ = run(capsys, "drop", *store_args, "--model", str(tiny_model_dir), "--metric", "l2")
    assert code == 0 and out.strip().endswith("-l2-five")
    assert [line.split("metric=")[1][:2] for line in run(capsys, "ls", *store_args)[1].splitlines()] == ["ip"]


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_temperature_must_be_a_non_negative_number(capsys, tiny_model_dir, value):
    code, _, err = run(capsys, "generate", "--reference", "--model", str(tiny_model_dir), "--temperature", value, "hi")
    assert_one_line_error(code, err, "--temperature must be 0 (greedy) or a positive number")


def test_top_k_zero_is_refused_not_replaced(capsys, tiny_model_dir):
    code, _, err = run(capsys, "generate", "--reference", "--model", str(tiny_model_dir), "--top-k", "0", "hi")
    assert_one_line_error(code, err, "--top-k 0 must be between 1")


def test_tpuf_gc_needs_a_turbopuffer_config(capsys, store_args):
    assert_one_line_error(*run(capsys, "tpuf-gc", *store_args[2:])[::2], "tpuf-gc needs a turbopuffer config")


def test_typo_of_a_shipped_model_is_not_sent_to_the_hub(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run(capsys, "generate", "--reference", "--model", "shakespear", "hi")
    assert_one_line_error(code, err, "did you mean 'shakespeare'? Shipped models: shakespeare")


def test_unknown_model_lists_the_shipped_ones(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run(capsys, "generate", "--reference", "--model", "someone/not-on-this-machine", "hi")
    assert_one_line_error(code, err, "shipped models: shakespeare")


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_make_model_files_follow_the_umask(capsys, tmp_path, umask):
    old = os.umask(umask)
    try:
        assert (
            run(
                capsys,
                "make-model",
                str(tmp_path / "m"),
                "--layers",
                "1",
                "--heads",
                "2",
                "--embd",
                "8",
                "--ctx",
                "4",
                "--vocab",
                "16",
            )[0]
            == 0
        )
    finally:
        os.umask(old)
    for name in ("config.json", "model.safetensors"):
        assert stat.S_IMODE((tmp_path / "m" / name).stat().st_mode) == 0o666 & ~umask, name


def test_make_model_too_large_is_refused_before_allocating(capsys, tmp_path):
    code, _, err = run(capsys, "make-model", str(tmp_path / "m"), "--layers", "10000000", "--embd", "768")
    assert_one_line_error(code, err, "choose smaller")


@pytest.mark.parametrize(
    "option, needle",
    [
        ("path = 5", "path = 5 has the wrong type"),
        ("threads = -2", "threads must be 0 or more"),
        ('path = "a\\u0000b"', "must not contain a NUL"),
    ],
)
def test_store_option_of_the_wrong_type(capsys, tmp_path, option, needle):
    config = write_config(tmp_path, f'backend = "faiss"\n[store]\n{option}\n')
    assert_one_line_error(*run(capsys, "ls", "--config", str(config))[::2], needle)


def test_every_subcommand_is_listed_whatever_runs(capsys):
    from vecgpt import cli

    names = [c.name for c in cli.COMMANDS]
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    assert all(name in listed for name in names)
    for only in (None, "tokenize"):  # parsing one subcommand builds only its arguments, still lists them all
        sub = next(a for a in cli.parser(only)._actions if a.dest == "command")
        assert list(sub.choices) == names


def test_a_missing_extra_is_an_install_hint_when_its_subcommand_runs(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # `import uvicorn` fails as if it were not installed
    code, _, err = run(capsys, "tpuf-local", "--host", "127.0.0.1", "--port", "0")
    assert code == 2
    assert_one_line_error(code, err, "tpuf-local needs uvicorn: pip install 'vecgpt[turbopuffer]'")
    code, _, err = run(capsys, "serve", "--port", "0")  # the playground needs the server's extra alone
    assert_one_line_error(code, err, "serve needs uvicorn: pip install 'vecgpt[serve]'")


def test_any_other_import_error_is_loud(monkeypatch):
    monkeypatch.setitem(sys.modules, "numpy", None)  # a required dependency, not an optional extra
    with pytest.raises(ModuleNotFoundError, match="numpy"):
        main(["softmax-walk", "1", "2"])


def test_tokenize_loads_no_numpy():
    code = "import sys; from vecgpt.cli import main; main(['tokenize', 'Hello world']); print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["15496", "995", "False"]


# Streaming: `generate` prints text as it is made; stdout ends as `print(prompt + text)` did.


class Scripted:
    """A reader whose best candidate is the next of `ids`: generate's decoding, apart from any model."""

    def __init__(self, ids):
        self.ids = iter(ids)

    def read(self, tokens, k):
        return Candidates(np.array([next(self.ids)]), np.array([0.0]))


def test_generate_streams_a_character_split_over_two_tokens_once(capsys):
    ids = tokenizer.encode(" 😀 日本")  # the emoji's bytes span two tokens, 日's too
    pieces = []
    gen = api.generate(Scripted(ids), [0], len(ids), top_k=1, on_text=pieces.append)
    assert gen.tokens == ids and "".join(pieces) == gen.text == " 😀 日本" and "\ufffd" not in gen.text
    assert pieces[:2] == [" ", "😀"]  # the emoji comes with the token holding its last byte, not before
    assert gen.steps[0]["candidates"][0][2] == " \ufffd"  # a candidate alone: its part of a character is U+FFFD


def test_streamed_stdout_is_the_text_of_the_json(capsys, store_args, tiny_model_dir):
    argv = [
        "generate",
        *store_args,
        "--model",
        str(tiny_model_dir),
        "Hello",
        "-n",
        "6",
        "--no-stop",
        "--temperature",
        "0",
    ]
    code, out, _ = run(capsys, *argv, "--json")
    d = json.loads(out)
    assert code == 0 and run(capsys, *argv)[1] == "Hello" + d["text"] + "\n"
    assert [d[k] for k in ("seed", "temperature", "top_k", "version")] == [0, 0.0, 40, vecgpt.__version__]
    assert d["store"] == {"backend": "faiss", "path": store_args[-1].replace("c.toml", "faiss")}
    assert len(d["text_id"]) == 12 and not d["kept"]
    assert all(c[2] == tokenizer.decode([c[0]]) for s in d["steps"] for c in s["candidates"])


def test_the_first_token_reaches_stdout_while_the_rest_are_made(tmp_path):
    """Shipped model, memory store, 20 tokens, stdout a pipe with room for the prompt and the first piece only.

    Streaming, the child writes those and then waits on the full pipe: seeing them while it runs proves the
    first piece came before the last token. Printed at the end, nothing fits and nothing would ever arrive."""
    root = str(Path(vecgpt.__file__).parent.parent)  # this checkout's vecgpt, also in the child
    env = {"XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": root}
    argv = [
        sys.executable,
        "-m",
        "vecgpt",
        "generate",
        "--backend",
        "memory",
        "ROMEO:",
        "-n",
        "20",
        "--no-stop",
        "--seed",
        "1",
    ]
    final = json.loads(subprocess.run([*argv, "--json"], capture_output=True, env=env, check=True).stdout)
    first = ("ROMEO:" + tokenizer.TextStream().feed(final["tokens"][0])).encode()
    r, w = os.pipe()
    size = fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)  # one page; a write that does not fit waits whole
    os.write(w, b"x" * (size - len(first)))
    with open(tmp_path / "err", "wb") as err:
        proc = subprocess.Popen(argv, stdout=w, stderr=err, env=env)
    os.close(w)
    deadline = time.monotonic() + 300  # reached only by a child that never streams
    while waiting(r) < size and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert waiting(r) == size and proc.poll() is None, (tmp_path / "err").read_text()  # the child waits on us
    with os.fdopen(r, "rb") as out:
        seen = out.read()
    assert proc.wait() == 0, (tmp_path / "err").read_text()
    assert seen[size - len(first) :].decode() == "ROMEO:" + final["text"] + "\n"


def waiting(fd: int) -> int:
    """Bytes in a pipe, not yet read."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["serve", "--port", "70000"], "--port must be 0..65535"),
        (["serve", "--config", "no/such.toml"], "config file no/such.toml does not exist"),
    ],
)
def test_serve_refuses_bad_options_in_one_line(capsys, argv, words):
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, words)


def test_serve_listens_on_this_machine_only_by_default():
    from vecgpt.cli import parser

    args = parser("serve").parse_args(["serve"])
    assert (args.host, args.port, args.workers) == ("127.0.0.1", 8000, 1)


def test_kept_texts_resume_list_and_close_from_the_cli(capsys, store_args, tiny_model_dir):
    base = ["--model", str(tiny_model_dir)]
    code, out, err = run(capsys, "generate", *store_args, *base, "Hello", "-n", "2", "--keep", "--json")
    text_id = json.loads(out)["text_id"]
    assert code == 0 and f"text {text_id} is kept" in err
    code, out, _ = run(capsys, "texts", *store_args, "--json")
    assert [t["id"] for t in json.loads(out)] == [text_id] and json.loads(out)[0]["tokens"] == 3
    code, out, _ = run(capsys, "generate", *store_args, "--resume", text_id, "-n", "2")
    assert code == 0 and out.endswith("\n")
    assert json.loads(run(capsys, "texts", *store_args, "--json")[1])[0]["tokens"] == 5
    assert json.loads(run(capsys, "texts", "ls", *store_args, "--json")[1])[0]["tokens"] == 5  # as `vecgpt ls`
    assert run(capsys, "texts", *store_args, "close", text_id)[0] == 0
    assert json.loads(run(capsys, "texts", *store_args, "--json")[1]) == []


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["generate", "-n", "2"], "give a prompt, or --resume"),
        (["generate", "--resume", "nosuchtext"], "has no text nosuchtext"),
        (["generate", "--reference", "Hi", "--keep"], "--reference keeps no text"),
        (["texts", "gc", "--older-than", "soon"], "--older-than 'soon'"),
        (["texts", "close"], "name the text to close"),
        (["texts", "close", "nosuchtext"], "has no text nosuchtext"),
    ],
)
def test_text_commands_refuse_bad_input_in_one_line(capsys, store_args, argv, needle):
    code, _, err = run(capsys, argv[0], *store_args, *argv[1:])
    assert_one_line_error(code, err, needle)
