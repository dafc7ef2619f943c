"""python -m vecgpt.backends.turbopuffer.server [--port 8765] [--latency-ms 25] ..."""

import argparse
import sys

from vecgpt.backends.turbopuffer.server import __doc__ as DOC
from vecgpt.backends.turbopuffer.server import add_arguments, run_args
from vecgpt.errors import VecgptError

if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m vecgpt.backends.turbopuffer.server", description=DOC.split("\n")[0]
    )
    add_arguments(parser)
    try:
        raise SystemExit(run_args(parser.parse_args()))
    except VecgptError as e:
        print(f"vecgpt: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
