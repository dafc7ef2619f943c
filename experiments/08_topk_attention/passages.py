"""Passages of held-out text: the last tenth of Tiny Shakespeare's characters, which the shipped model never saw.

A passage is `longest + steps` tokens. Step s of context length C reads the C tokens before the passage's token
`longest + s` (teacher forcing: the passage's own tokens, never the model's), so every context length predicts the
same tokens and every step's context is exactly C tokens long.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CORPUS_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
CORPUS_PLACES = ("data/tinyshakespeare.txt", "/work/shared/data/tinyshakespeare.txt")  # the first is the repo's
HELD_OUT = 0.9  # the shipped model trained on the first 90% of characters (its config.json: "split")

# The held-out tenth's first lines: the quick mode's one passage, so the test needs no corpus.
QUICK_TEXT = (
    "GREMIO:\nGood morrow, neighbour Baptista.\n\nBAPTISTA:\nGood morrow, neighbour Gremio.\n"
    "God save you, gentlemen!\n\nPETRUCHIO:\nAnd you, good sir! Pray, have you not a daughter\n"
    "Call'd Katharina, fair and virtuous?\n\nBAPTISTA:\nI have a daughter, sir, called Katharina.\n"
)


def find_corpus(given: str | None, root: Path) -> Path:
    from vecgpt.errors import VecgptError

    places = [Path(given)] if given else [root / CORPUS_PLACES[0], Path(CORPUS_PLACES[1])]
    for path in places:
        if path.is_file():
            return path
    raise VecgptError(
        f"no corpus at {places[0]}: download Tiny Shakespeare ({CORPUS_URL}) there, or give --corpus PATH"
    )


def held_out_tokens(path: Path) -> np.ndarray:
    from vecgpt import tokenizer

    text = path.read_text()
    return np.asarray(tokenizer.encode(text[int(len(text) * HELD_OUT) :]), np.int64)


def cut(tokens: np.ndarray, n: int, length: int) -> np.ndarray:
    """n passages of `length` tokens, evenly spaced over tokens (apart where there is room) -> [n, length]."""
    from vecgpt.errors import VecgptError

    if len(tokens) < length:
        raise VecgptError(f"the held-out text has {len(tokens)} tokens, fewer than a passage's {length}")
    starts = np.linspace(0, len(tokens) - length, n).astype(np.int64) if n > 1 else np.zeros(1, np.int64)
    return np.stack([tokens[s : s + length] for s in starts])


def windows(passage: np.ndarray, context: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The `steps` windows of `context` tokens before each of the passage's last `steps` tokens, and those tokens."""
    longest = len(passage) - steps
    idx = np.arange(steps)[:, None] + np.arange(longest - context, longest)[None, :]
    return passage[idx], passage[longest:]
