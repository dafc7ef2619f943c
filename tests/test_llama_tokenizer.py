"""A Llama folder's own tokenizer everywhere (issue 54): a random checkpoint of 300 tokens, not GPT-2's 50,257, with a
byte-level BPE tokenizer.json trained here on a few lines. `vecgpt generate` (CLI and API, --batch, compare, a kept
text resumed, `texts show`, `tokenize --model`) encode its prompts and decode its tokens with that tokenizer; the
store's manifest names the file (path and SHA-256), so a text reopened later reads the same one; a folder of another
vocabulary without tokenizer.json is refused in one line before anything is written."""

from __future__ import annotations

import json
import shutil

import pytest

from vecgpt import api, families, tokenizer, weights
from vecgpt.backends.base import get_store
from vecgpt.cli import main
from vecgpt.config import Config
from vecgpt.loading import models

HP = families.LlamaHParams(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, n_inner=48, n_ctx=48, n_vocab=300, tied=True)
LINES = ["ROMEO: But soft, what light through yonder window breaks?", "JULIET: O Romeo, Romeo, wherefore art thou?"]
PROMPT = "ROMEO: O soft light"


def train(path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=HP.n_vocab, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(LINES * 10, trainer)
    tok.save(str(path))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = weights.make_llama_model(tmp_path_factory.mktemp("tok") / "m", HP, seed=2, std=0.2)
    train(out / "tokenizer.json")
    return out


@pytest.fixture
def own(folder):
    return tokenizer.FileTokenizer(folder / "tokenizer.json")


def cli(capsys, tmp_path, folder, *argv) -> tuple[int, str, str]:  # folder None: the store's manifest decides
    model = ["--model", str(folder)] if folder else []
    code = main([*argv, "--backend", "memory", "--store", str(tmp_path / "store"), *model])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_folders_tokenizer_is_not_gpt2s(own):
    ids = own.encode(PROMPT)
    assert ids != tokenizer.encode(PROMPT) and max(ids) < HP.n_vocab and own.decode(ids) == PROMPT


def test_the_cli_encodes_and_decodes_with_the_folders_tokenizer(capsys, tmp_path, folder, own):
    code, out, _ = cli(capsys, tmp_path, folder, "generate", PROMPT, "-n", "8", "--json", "--temperature", "0")
    assert code == 0
    got = json.loads(out)
    assert got["prompt_tokens"] == own.encode(PROMPT)
    assert got["text"] == own.decode([t for t in got["tokens"] if t != own.eos])
    assert [c[2] for c in got["steps"][0]["candidates"]] == [own.decode([c[0]]) for c in got["steps"][0]["candidates"]]
    code, printed, _ = cli(capsys, tmp_path, folder, "generate", PROMPT, "-n", "8", "--temperature", "0", "--no-stop")
    assert code == 0 and printed == PROMPT + own.decode([t for t in got["tokens"] if t != own.eos]) + "\n"
    (held,) = models(get_store("memory", path=str(tmp_path / "store")))
    assert held["tokenizer"]["path"] == str((folder / "tokenizer.json").resolve())
    code, ids, _ = main(["tokenize", PROMPT, "--json", "--model", str(folder)]), capsys.readouterr()[0], ""
    assert json.loads(ids) == own.encode(PROMPT)


def test_batch_and_compare_read_with_it(capsys, tmp_path, folder, own):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{PROMPT}\nJULIET: O\n")
    code, out, _ = cli(capsys, tmp_path, folder, "generate", "--batch", str(prompts), "-n", "3", "--json")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert [o["prompt_tokens"] for o in lines] == [own.encode(PROMPT), own.encode("JULIET: O")]
    assert all(o["text"] == own.decode([t for t in o["tokens"] if t != own.eos]) for o in lines)
    code, out, _ = cli(capsys, tmp_path, folder, "compare", PROMPT, "-n", "3", "--json")
    got = json.loads(out)
    assert code == 0 and got["prompt_tokens"] == own.encode(PROMPT) and got["max_abs_error"] < 1e-3
    assert [r["text"] for r in got["scores"]] == [own.decode([r["token"]]) for r in got["scores"]]


def test_a_kept_text_is_read_later_with_the_tokenizer_its_manifest_names(capsys, tmp_path, folder, own):
    """The API keeps a text; resumed and shown by the CLI (which names no model: the store's manifest decides); once
    the tokenizer.json it was loaded with changes, the text is refused in one line."""
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    config = Config(backend="memory", store={"path": str(tmp_path / "store")})
    first = api.generate_text(PROMPT, n=3, config=config, model=str(copy), keep=True)
    assert first["prompt_tokens"] == own.encode(PROMPT)
    code, out, _ = cli(capsys, tmp_path, None, "generate", "--resume", first["text_id"], "-n", "2", "--json")
    resumed = json.loads(out)
    assert code == 0 and resumed["text"] == own.decode([t for t in resumed["tokens"] if t != own.eos])
    code, out, _ = cli(capsys, tmp_path, None, "texts", "show", first["text_id"], "--json")
    shown = json.loads(out)
    assert shown["prompt"] == PROMPT and shown["text"] == own.decode(
        resumed["text_tokens"][len(first["prompt_tokens"]) :]
    )
    saved = json.loads((copy / "tokenizer.json").read_text())
    (copy / "tokenizer.json").write_text(json.dumps(saved, indent=1))  # other bytes: not the file it was loaded with
    tokenizer.recorded.cache_clear()
    code, _, err = cli(capsys, tmp_path, None, "texts", "show", first["text_id"])
    assert code == 2 and err.startswith("vecgpt: error: ") and "changed since model" in err
    assert len(err.strip().splitlines()) == 1


def test_another_vocabulary_without_tokenizer_json_is_refused_before_a_write(capsys, tmp_path, folder):
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    (bare / "tokenizer.json").unlink()
    code, out, err = cli(capsys, tmp_path, bare, "generate", PROMPT, "-n", "2")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "its 300 tokens are not GPT-2's; copy the checkpoint's tokenizer.json" in err
    assert not (tmp_path / "store").exists() or not models(get_store("memory", path=str(tmp_path / "store")))
