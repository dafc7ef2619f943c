"""What a researcher meeting vecgpt for the first time tripped over (issue 55): the README's API example against the
CLI, --resume with a prompt, model names, and the CLI's rough edges."""

import json
import re
from pathlib import Path

import pytest

from vecgpt import weights
from vecgpt.cli import main
from vecgpt.config import load_config, open_store
from vecgpt.errors import VecgptError
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


def memory_store(tmp_path) -> list[str]:
    return ["--config", str(ROOT / "configs" / "memory.toml"), "--store", str(tmp_path / "m")]


@pytest.mark.parametrize("bad", [["-n", "-1"], ["--top-k", "0"], ["--model", "./no/such/folder"]])
def test_a_refused_sampled_run_says_no_seed(tmp_path, capsys, bad):
    assert main(["generate", "ROMEO:", *memory_store(tmp_path), *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vecgpt: error:") and "seed" not in err


def test_a_sampled_run_says_its_seed_once(tmp_path, capsys):
    assert main(["generate", "ROMEO:", "-n", "2", *memory_store(tmp_path)]) == 0
    assert len(re.findall(r"^vecgpt: seed: \d+ ", capsys.readouterr().err, re.M)) == 1


def test_texts_lists_each_model_key_whole(tmp_path, capsys):
    store = memory_store(tmp_path)
    assert main(["generate", "ROMEO:", "-n", "1", "--temperature", "0", "--keep", "--json", *store]) == 0
    capsys.readouterr()
    assert main(["texts", *store, "--json"]) == 0
    (text,) = json.loads(capsys.readouterr().out)
    assert main(["texts", *store]) == 0
    (line,) = capsys.readouterr().out.splitlines()[1:]
    assert line.split()[:2] == [text["id"], text["model"]]  # the store's key whole: fingerprint, encoding, layout


@pytest.mark.parametrize(
    "action, says",
    [("show", "TEXT_ID"), ("step-back", "POSITION"), ("retry", "--seed"), ("branch", "TOKEN"), ("gc", "--older-than")],
)
def test_each_texts_action_has_its_own_help(capsys, action, says):
    with pytest.raises(SystemExit):
        main(["texts", action, "--help"])
    out = capsys.readouterr().out
    assert out.startswith(f"usage: vecgpt texts {action}") and says in out


def test_compare_n_has_help(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("-n N")]
    assert len(line.split()) > 2


class FakeTurbopuffer:
    def __init__(self, url):
        self.url = url


@pytest.mark.parametrize("url", ["http://127.0.0.1:8765", "http://localhost:9000", "http://[::1]:8765"])
def test_a_local_turbopuffer_server_loads_without_asking(url, monkeypatch, capsys):
    from argparse import Namespace

    from vecgpt.cli.store import implicit_load

    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    config = load_config(ROOT / "configs" / "turbopuffer.toml")
    implicit_load(Namespace(model=None, yes=False), config)(FakeTurbopuffer(url))
    assert "--yes" not in capsys.readouterr().err


def test_the_service_still_asks_for_yes(monkeypatch):
    from argparse import Namespace

    from vecgpt.cli.store import implicit_load
    from vecgpt.errors import VecgptError

    config = load_config(ROOT / "configs" / "turbopuffer.toml")
    with pytest.raises(VecgptError, match="--yes"):
        implicit_load(Namespace(model=None, yes=False), config)(
            FakeTurbopuffer("https://gcp-us-central1.turbopuffer.com")
        )


@pytest.mark.parametrize("typo, meant", [("gtp2", "gpt2"), ("gpt2-xxl", "gpt2-xl"), ("gpt-2", "gpt2")])
def test_a_typo_of_a_gpt2_name_is_not_sent_to_the_hub(typo, meant, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("sent to the hub"))
    with pytest.raises(VecgptError, match=f"did you mean '{meant}'"):
        weights.load(typo)


def offline(*args, **kwargs):
    from huggingface_hub.errors import LocalEntryNotFoundError

    raise LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder")


def test_an_unreachable_hub_is_said_in_plain_words(monkeypatch, capsys):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    assert main(["generate", "hi", "--model", "gpt2", "--reference"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "the hub is not reachable from here; a folder or a shipped model works offline" in line
    assert "LocalEntryNotFoundError" not in line


def test_a_name_the_hub_lacks_is_said_so(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    def missing(*args, **kwargs):
        error = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # its __init__ wants an HTTP response
        Exception.__init__(error, "404")
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", missing)
    with pytest.raises(VecgptError, match="the Hugging Face hub has no model 'someone/nothing'"):
        weights.load("someone/nothing")


def stores_table() -> list[dict]:
    text = README.read_text().split("## Stores", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("|")]
    head = [c.strip() for c in rows[0]]
    return [dict(zip(head, (c.strip() for c in row))) for row in rows[2:]]


def test_the_stores_table_names_each_stores_pip_extra():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    rows = stores_table()
    assert len(rows) == 8
    for row in rows:
        backend = row["backend"].split("`")[1]
        wanted = f"`vecgpt[{backend}]`" if backend in extras else "none"
        assert row["pip extra"] == wanted, row


def test_the_readme_says_where_stores_live():
    stores = README.read_text().split("## Stores", 1)[1].split("\n## ", 1)[0]
    assert all(word in stores for word in ("~/.cache/vecgpt", "XDG_CACHE_HOME", "--store"))
