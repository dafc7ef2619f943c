"""What the experiments share: provenance and run folders (record), the stores and models they compare
(subjects), recorded residual streams (tracing), plots; and `main`, which runs an experiment as a script.

Each experiment is a folder NN_name/ whose run.py defines NAME, HELP, add_arguments(parser) and
run(args) -> int; `python experiments/NN_name/run.py` and `vecgpt experiment NAME` run the same code.
"""

from __future__ import annotations

import argparse
import sys


def main(module, argv: list[str] | None = None) -> int:
    """Run an experiment module as a script: errors that say what to do print as one line, exit 2."""
    from vecgpt.errors import VecgptError

    parser = argparse.ArgumentParser(prog=f"python {sys.argv[0]}", description=module.HELP)
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return module.run(args) or 0
    except VecgptError as e:
        print(f"vecgpt: error: {e}", file=sys.stderr)
        return 2
