"""Every experiment without matplotlib (simulated: sys.modules says it is absent) writes its JSON and tables, says
once which plots it skipped and the extra that brings them, and names only files it wrote; a --corpus given is
used or refused (issue 55, item 3)."""

import json
import re
import sys

import pytest

from vecgpt.cli import main

EXTRA = "pip install 'vecgpt[plots]'"


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)


def written_files(err: str) -> list[str]:
    (line,) = [line for line in err.splitlines() if line.startswith("wrote ")]
    return [file_name(word) for word in line[len("wrote ") :].split(", ")]


def file_name(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def check_no_plots(out, err: str, stems: list[str]) -> None:
    said = [line for line in err.splitlines() if "matplotlib" in line]
    assert len(said) == 1 and EXTRA in said[0], err
    assert all(stem in said[0] for stem in stems)
    files = written_files(err)
    assert not any(f.endswith(".png") for f in files) and not list(out.glob("*.png"))
    assert all((out / f).is_file() for f in files), files
    assert any(f.endswith(".json") for f in files) and any(f.endswith(".md") for f in files)


@pytest.mark.parametrize(
    "name, extra, stem",
    [
        ("agreement", ["-n", "2", "--prompts", "Hello"], "agreement"),
        ("numpy-comparison", ["-n", "2"], "numpy_comparison"),
        ("storage", [], "storage"),
        ("requests", ["-n", "2"], "requests"),
    ],
)
def test_a_store_experiment_runs_without_matplotlib(name, extra, stem, tmp_path, tiny_model_dir, capsys, no_matplotlib):
    config = tmp_path / "memory.toml"
    config.write_text('backend = "memory"\nmetric = "l2"\n')
    out = tmp_path / "out"
    argv = ["experiment", name, "--model", str(tiny_model_dir), "--configs", str(config), "--no-swap"]
    code = main([*argv, "--store-root", str(tmp_path / "stores"), "--out", str(out), "--quiet", *extra])
    err = capsys.readouterr().err
    assert code == 0, err
    check_no_plots(out, err, [f"{stem}.png"])
    assert json.loads((out / f"{stem}.json").read_text())["provenance"]


def test_topk_attention_runs_without_matplotlib(tmp_path, capsys, no_matplotlib):
    out = tmp_path / "out"
    assert main(["experiment", "topk-attention", "--quick", "--quiet", "--out", str(out)]) == 0
    check_no_plots(out, capsys.readouterr().err, ["topk_attention.png"])


def test_quick_refuses_a_corpus_that_is_not_there(tmp_path, capsys):
    missing = tmp_path / "nowhere.txt"
    argv = ["experiment", "topk-attention", "--quick", "--quiet", "--corpus", str(missing), "--out", str(tmp_path)]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert re.match(rf"vecgpt: error: no corpus at {re.escape(str(missing))}", line)


def test_quick_reads_the_corpus_given(tmp_path, capsys):
    corpus = tmp_path / "mine.txt"
    corpus.write_text("To be, or not to be, that is the question. " * 200)
    out = tmp_path / "out"
    argv = ["experiment", "topk-attention", "--quick", "--quiet", "--corpus", str(corpus), "--out", str(out)]
    assert main(argv) == 0
    assert str(corpus) in json.loads((out / "topk_attention.json").read_text())["settings"]["corpus"]
