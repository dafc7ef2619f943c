"""Experiment 02: the same as `vecgpt experiment numpy-comparison` (see README.md and docs/experiments.md).

    python experiments/02_numpy_comparison/run.py [--configs A.toml B.toml ...] [--model M] [--store-root DIR] [--out DIR]
"""

import sys

from vecgpt.cli import main

if __name__ == "__main__":
    sys.exit(main(["experiment", "numpy-comparison", *sys.argv[1:]]))
