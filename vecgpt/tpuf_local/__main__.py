"""python -m vecgpt.tpuf_local [--port 8765] [--latency-ms 25] ..."""

import argparse

from vecgpt.tpuf_local import __doc__ as DOC
from vecgpt.tpuf_local import add_arguments, run_args

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m vecgpt.tpuf_local", description=DOC.split("\n")[0])
    add_arguments(parser)
    raise SystemExit(run_args(parser.parse_args()))
