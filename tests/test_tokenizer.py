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


def stream(ids) -> list[str]:
    s = tokenizer.TextStream()
    return [s.feed(t) for t in ids] + [s.end()]


def test_a_character_split_over_tokens_comes_out_once_whole():
    ids = tokenizer.encode("Hi 😀 日本")
    assert [tokenizer.token_bytes(t) for t in ids[1:3]] == [b" \xf0\x9f\x98", b"\x80"]  # the emoji spans two
    pieces = stream(ids)
    assert "".join(pieces) == tokenizer.decode(ids) == "Hi 😀 日本" and "\ufffd" not in "".join(pieces)
    assert pieces[1:6] == [" ", "😀", " ", "", "日"]  # a character comes with its last byte, not before


def test_stream_skips_endoftext_and_ends_a_cut_character_as_decode_does():
    ids = [*tokenizer.encode("a"), tokenizer.ENDOFTEXT, 47249]  # 47249: the first three bytes of 😀
    assert "".join(stream(ids)) == tokenizer.decode([t for t in ids if t != tokenizer.ENDOFTEXT]) == "a\ufffd"
