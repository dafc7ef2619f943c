"""Experiment 04: the same as `vecgpt experiment requests` (see README.md and docs/experiments.md).

    python experiments/04_requests/run.py [--configs A.toml B.toml ...] [--model M] [--store-root DIR] [--out DIR]
"""

import sys

from vecgpt.cli import main

if __name__ == "__main__":
    sys.exit(main(["experiment", "requests", *sys.argv[1:]]))
