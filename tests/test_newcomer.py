"""What a researcher meeting vecgpt for the first time tripped over (issue 55): the README's API example against the
CLI, --resume with a prompt, model names, and the CLI's rough edges."""

import json
import re
from pathlib import Path

import pytest

from vecgpt.cli import main
from vecgpt.config import load_config, open_store
from vecgpt.loading import models, push

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_example() -> str:
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    return code.replace('api.generate_text("ROMEO:", n=20,', 'api.generate_text("ROMEO:", n=2,')


def test_the_readme_example_runs_the_model_the_cli_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the configs' stores default to folders under it
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    exec(compile(readme_example(), "README.md", "exec"), scope)
    readme_tokens = scope["text"].tokens
    capsys.readouterr()
    assert (
        main(["generate", "Hello world", "-n", "3", "--temperature", "0", "--config", "configs/faiss.toml", "--json"])
        == 0
    )
    cli = json.loads(capsys.readouterr().out)
    store = open_store(load_config("configs/faiss.toml"))
    try:
        held = models(store)
    finally:
        store.close()
    assert [m["fingerprint"] for m in held] == [scope["key"]]  # one copy: the CLI found the example's
    assert (held[0]["metric"], held[0]["layout"]) == (cli["metric"], cli["layout"]) == ("ip", "five")
    assert cli["text_tokens"] == readme_tokens


def test_push_loads_in_the_encoding_of_the_config_that_opened_the_store(tmp_path, tiny_model):
    config = load_config(ROOT / "configs" / "memory.toml", metric="ip", layout="three")
    config.store["path"] = str(tmp_path / "m")
    store = open_store(config)
    try:
        manifest = push(store, tiny_model, progress=False)
        assert (manifest["metric"], manifest["layout"]) == ("ip", "three")
        told = push(store, tiny_model, "l2", progress=False, layout="four")  # unless told otherwise
        assert (told["metric"], told["layout"]) == ("l2", "four")
    finally:
        store.close()


def test_resume_with_a_prompt_is_refused_in_one_line(tmp_path, capsys):
    store = ["--config", str(ROOT / "configs" / "memory.toml"), "--store", str(tmp_path / "m")]
    assert main(["generate", "ROMEO:", "-n", "1", "--temperature", "0", "--keep", "--json", *store]) == 0
    text_id = json.loads(capsys.readouterr().out)["text_id"]
    assert main(["generate", "extra", "--resume", text_id, "-n", "2", *store]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "--resume" in err and "prompt" in err and "texts" in err


def test_generate_help_says_what_resume_does_with_a_prompt(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert re.search(r"--resume.*refus", capsys.readouterr().out.replace("\n", " "))
