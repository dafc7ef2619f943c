"""Experiment 03: the same as `vecgpt experiment storage` (see README.md and docs/experiments.md).

    python experiments/03_storage/run.py [--configs A.toml B.toml ...] [--model M] [--store-root DIR] [--out DIR]
"""

import sys

from vecgpt.cli import main

if __name__ == "__main__":
    sys.exit(main(["experiment", "storage", *sys.argv[1:]]))
