"""What every output-layer index is: OutputIndex (build, set, search, exact_search), and its helpers.

`search(h [m, d], k) -> (ids [m, k] int64, scores [m, k] float64)`: see output_index (this folder).
"""

from __future__ import annotations

import time

import numpy as np

from vecgpt import encoding

EXTRAS = {"hnswlib": "ann", "faiss": "faiss", "lancedb": "lancedb", "psycopg": "pgvector", "turbopuffer": "turbopuffer"}


class Unavailable(Exception):
    """This index kind cannot run here (a missing library or server); the message says why."""


class OutputIndex:
    kind = "?"
    search_params: tuple[str, ...] = ()  # parameters set per search; the rest are build parameters
    defaults: dict = {}
    exact_scores = True
    exact_label = "exact"  # what exact_search is, for tables

    def __init__(self, threads: int = 2, **params):
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise ValueError(
                f"index kind {self.kind!r} takes no parameter {sorted(unknown)[0]!r}; "
                f"it takes {', '.join(sorted(self.defaults))}"
            )
        self.params = {**self.defaults, **params}
        self.threads = threads
        self.build_seconds: float | None = None

    @property
    def label(self) -> str:
        return self.kind + " " + " ".join(f"{k}={v}" for k, v in self.params.items() if k not in ("path", "dsn"))

    def build(self, vectors: np.ndarray) -> OutputIndex:
        vectors = np.ascontiguousarray(vectors, np.float32)
        self.n, self.dim = vectors.shape
        t = time.perf_counter()
        try:
            self._build(vectors)
        except ImportError as e:  # the kind is skipped, saying what to install
            raise Unavailable(
                f"{self.kind} needs {e.name}: pip install 'vecgpt[{EXTRAS.get(e.name, e.name)}]'"
            ) from None
        self.build_seconds = time.perf_counter() - t
        return self

    def set(self, **search) -> None:
        unknown = set(search) - set(self.search_params)
        if unknown:
            raise ValueError(f"{sorted(unknown)[0]!r} is not a search parameter of {self.kind!r}")
        self.params.update(search)

    def search(self, h: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def exact_search(self, h: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The same store's exact search (a flat scan), for latency comparisons."""
        raise NotImplementedError

    def memory_bytes(self) -> int | None:
        return None

    def close(self) -> None:
        pass

    def _build(self, vectors):
        raise NotImplementedError


def as_queries(h) -> np.ndarray:
    h = np.asarray(h, np.float32)
    return np.ascontiguousarray(h[None] if h.ndim == 1 else h)


def padded(vectors):  # documents (w, 0, pad) and their M^2; see vecgpt.encoding
    return encoding.encode_rows(vectors.T, None, "l2")


def no_hits(m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """ids [m, k] of -1 and scores [m, k] of -inf: the missing slots an index that finds fewer than k leaves."""
    return np.full((m, k), -1, np.int64), np.full((m, k), -np.inf)
