"""Issue 7: the output layer as an ANN search. Same as `vecgpt experiment output-layer`.

    python experiments/05_output_layer/run.py [--config experiments/05_output_layer/grid.toml]
        [--model random|shipped|gpt2|PATH ...] [--kinds hnswlib faiss-ivf ...] [--out results/05_output_layer]

BLAS threads are pinned to 1 (OMP/OPENBLAS/MKL_NUM_THREADS, unless set) before numpy loads.
"""

import os

# One BLAS thread: the exact product is then timed on one core like the index searches (batch 1), and
# a shared machine's load does not stall a second BLAS thread (on the 2-core VM that tripled its time).
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

from vecgpt.experiments.output_layer import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
