"""The output layer through an index: Head (candidates rescored exactly), final_hidden, AnnReader."""

from __future__ import annotations

import numpy as np

from vecgpt.sampling import Candidates, ordered

from output_index.base import OutputIndex


class Head:
    """The output layer through an index: k candidates plus the always-scored tokens, rescored exactly."""

    def __init__(self, index: OutputIndex, vectors: np.ndarray, k: int = 50, always: np.ndarray | None = None):
        self.index, self.k = index, k
        self.vectors = np.asarray(vectors, np.float32)
        self.always = np.unique(np.asarray([] if always is None else always, np.int64))
        self.always = self.always[self.always < len(self.vectors)]

    def candidates(self, h: np.ndarray) -> Candidates:
        """Candidates for one final vector h [d], best first, with exact float64 logits."""
        ids, _ = self.index.search(h, self.k)
        return self._rescore(ids[0], h)

    def candidates_many(self, H: np.ndarray) -> tuple[np.ndarray, list[Candidates]]:
        """The index's raw ids [m, k] (one batched search) and the Candidates of every row of H [m, d]."""
        raw, _ = self.index.search(H, self.k)
        return raw, [self._rescore(r, h) for r, h in zip(raw, H)]

    def _rescore(self, found, h) -> Candidates:
        ids = np.union1d(found[found >= 0], self.always)
        return ordered(ids, self.vectors[ids].astype(np.float64) @ np.asarray(h, np.float64).ravel())


def final_hidden(ref, ids) -> np.ndarray:
    """Feed tokens to a `vecgpt.reference.Reference`; ln_f of the new positions [m, d], before the output product."""
    return ref.hidden(ids)


class AnnReader:
    """A reader for `vecgpt.api.generate`: the numpy reference body with the output layer through a Head.

    Greedy decoding, temperature and top-k sampling run unchanged on its Candidates: the softmax
    is over the candidates only, so tokens outside them can never be drawn.
    """

    def __init__(self, ref, head: Head):
        self.ref, self.head = ref, head

    def read(self, ids, k: int = 40) -> Candidates:
        return self.head.candidates(final_hidden(self.ref, ids)[-1])
