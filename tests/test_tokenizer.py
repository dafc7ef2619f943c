from vecgpt import tokenizer


def test_hello_world():
    assert tokenizer.encode("Hello world") == [15496, 995]


def test_empty_prompt_starts_from_endoftext():
    assert tokenizer.encode("") == [50256]


def test_round_trip_and_vocabulary():
    text = "ROMEO:\nBut soft, what light through yonder window breaks? 1234 ünïcödé"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encoding().n_vocab == 50257


def test_bpe_files_match_tiktoken_hashes():
    assert set(tokenizer.bpe_files()) == {"encoder.json", "vocab.bpe"}


def test_rank_cache_is_checked_and_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = tokenizer.ranks()  # no cache yet: built from the BPE files, then cached
    (cache,) = (tmp_path / "vecgpt").iterdir()
    assert tokenizer.ranks() == built
    cache.write_bytes(cache.read_bytes()[:-1] + b"x")  # a cache that does not hash right is not trusted
    assert tokenizer.ranks() == built
    assert tokenizer.unpack_ranks(cache.read_bytes()) == built
