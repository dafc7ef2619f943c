"""`vecgpt` command line: stdout carries only results; progress and warnings go to stderr.

Every subcommand is a `Command` in COMMANDS, naming ("module:function") the function that adds its
arguments and the one that runs it. Both are imported only when that subcommand is parsed or run, so
`vecgpt tokenize` loads no numpy. Nothing is skipped on an import error: a missing optional extra is a
one-line install hint when its subcommand runs (exit 2); any other import error is a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass

from vecgpt.errors import VecgptError

# top-level module -> the extra of pyproject.toml that installs it
EXTRAS = {
    "turbopuffer": "turbopuffer",
    "starlette": "turbopuffer",
    "uvicorn": "turbopuffer",
    "matplotlib": "plots",
    "faiss": "faiss",
    "lancedb": "lancedb",
    "pyarrow": "lancedb",
    "psycopg": "pgvector",
    "pgvector": "pgvector",
    "pgserver": "pgvector",
    "hnswlib": "ann",
    "numba": "fused",
    "transformers": "transformers",
    "torch": "transformers",
}


def attribute(ref: str):
    """The object a "module:name" reference names (importing the module)."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    arguments: str  # "module:function" adding its arguments to the subparser
    run: str  # "module:function" taking the parsed arguments, returning the exit status
    extras: tuple = ()  # (module, extra) pairs this command installs otherwise than EXTRAS says

    def add_to(self, subparsers, with_arguments: bool = True) -> None:
        p = subparsers.add_parser(self.name, help=self.help)
        if with_arguments:
            attribute(self.arguments)(p)
        p.set_defaults(func=self)

    def __call__(self, args) -> int:
        try:
            return attribute(self.run)(args)
        except ModuleNotFoundError as e:
            extra = {**EXTRAS, **dict(self.extras)}.get((e.name or "").split(".")[0])
            if extra is None:
                raise
            raise VecgptError(f"{self.name} needs {e.name}: pip install 'vecgpt[{extra}]'") from None


STORE, MODEL, ATTENTION = "vecgpt.cli.store", "vecgpt.cli.model", "vecgpt.cli.attention"
TPUF = "vecgpt.backends.turbopuffer"
COMMANDS = (
    Command("load", "push a model into a store", f"{STORE}:load_arguments", f"{STORE}:cmd_load"),
    Command("ls", "every model a store holds", f"{STORE}:add_store_args", f"{STORE}:cmd_ls"),
    Command("drop", "remove one model from a store", f"{STORE}:drop_arguments", f"{STORE}:cmd_drop"),
    Command("generate", "continue a prompt through a store", f"{STORE}:generate_arguments", f"{STORE}:cmd_generate"),
    Command(
        "compare", "store against numpy: scores and greedy tokens", f"{STORE}:compare_arguments", f"{STORE}:cmd_compare"
    ),
    Command(
        "texts",
        "the texts a store keeps: list, show, step back, retry, branch, gc, close",
        "vecgpt.cli.texts:add_arguments",
        "vecgpt.cli.texts:run",
    ),
    Command(
        "tokenize",
        "token ids of a text (GPT-2's, or --model's)",
        f"{MODEL}:tokenize_arguments",
        f"{MODEL}:cmd_tokenize",
    ),
    Command(
        "make-model",
        "write a random GPT-2-shaped checkpoint",
        f"{MODEL}:make_model_arguments",
        f"{MODEL}:cmd_make_model",
    ),
    Command(
        "attention-memory",
        "bytes of the full score table vs the streaming working set",
        f"{ATTENTION}:memory_arguments",
        f"{ATTENTION}:run_attention_memory",
    ),
    Command(
        "softmax-walk",
        "streaming softmax, position by position",
        f"{ATTENTION}:walk_arguments",
        f"{ATTENTION}:run_softmax_walk",
    ),
    Command(
        "experiment",
        "run an experiment; writes JSON, a table and a plot",
        "vecgpt.cli.experiments:add_arguments",
        "vecgpt.cli.experiments:run",
    ),
    Command(
        "serve",
        "the playground and the streaming-attention page in a browser",
        "vecgpt.cli.serve:add_arguments",
        "vecgpt.cli.serve:run",
        (("starlette", "serve"), ("uvicorn", "serve")),  # the server alone, not turbopuffer's client with it
    ),
    Command(
        "tpuf-local",
        "run a local server speaking turbopuffer's HTTP API (for tests)",
        f"{TPUF}.server.serve:add_arguments",
        f"{TPUF}.server.serve:run_args",
    ),
    Command(
        "tpuf-gc",
        "list (and --remove) text namespaces left behind in turbopuffer",
        f"{TPUF}.gc:add_arguments",
        f"{TPUF}.gc:run",
    ),
)


def parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand; with `only`, the arguments of that one alone (the others are not imported)."""
    from vecgpt import __version__

    root = argparse.ArgumentParser(prog="vecgpt", description="GPT-2 where every matrix multiply is a vector search")
    root.add_argument("--version", action="version", version=f"vecgpt {__version__}")
    sub = root.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_to(sub, with_arguments=only is None or only == command.name)
    return root


def chosen(argv: list[str]) -> str | None:
    """The subcommand an argv names (its first word that is not an option), if any."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser(chosen(argv)).parse_args(argv)
    try:
        code = args.func(args) or 0
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's final flush
        return code
    except VecgptError as e:
        print(f"vecgpt: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `vecgpt ls | head`: the reader has what it wanted
        quiet_stdout()
        return 0
    except OSError as e:  # a path that is a folder, unreadable, on a full disk: the user's to fix
        print(f"vecgpt: error: {os_error(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vecgpt: interrupted", file=sys.stderr)
        return 130


def quiet_stdout() -> None:
    """Point stdout at /dev/null so the buffered rest is dropped instead of raising again at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no real file (captured in tests)
        pass


def os_error(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{e.strerror or e}"
