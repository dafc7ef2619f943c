"""Experiment 01: the same as `vecgpt experiment agreement` (see README.md and docs/experiments.md).

    python experiments/01_agreement/run.py [--configs A.toml B.toml ...] [--model M] [--store-root DIR] [--out DIR]
"""

import sys

from vecgpt.cli import main

if __name__ == "__main__":
    sys.exit(main(["experiment", "agreement", *sys.argv[1:]]))
