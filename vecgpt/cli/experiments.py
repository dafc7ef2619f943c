"""`vecgpt experiment <name>`: one inner subcommand per experiments/NN_name/run.py (the repository's, not the package's)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from vecgpt.errors import VecgptError

MISSING = (
    "the experiments live in the vecgpt repository, not in the installed package: run vecgpt from a "
    "clone of the repository, or set VECGPT_EXPERIMENTS to its experiments/ folder"
)


def folder() -> Path | None:
    """experiments/ beside the package (a clone of the repository), or VECGPT_EXPERIMENTS."""
    given = os.environ.get("VECGPT_EXPERIMENTS")
    path = Path(given) if given else Path(__file__).resolve().parents[2] / "experiments"
    return path if (path / "common").is_dir() else None


def load(run_py: Path):
    """Import one experiment's run.py, with its folder and experiments/ on sys.path (for its modules, common/)."""
    for path in (str(run_py.parent), str(run_py.parents[1])):
        if path not in sys.path:
            sys.path.insert(0, path)
    name = f"experiment_{run_py.parent.name}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, run_py)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def experiments() -> dict:
    """Every experiment by its NAME: the modules experiments/NN_*/run.py."""
    root = folder()
    modules = [load(path) for path in sorted(root.glob("[0-9][0-9]_*/run.py"))] if root else []
    return {module.NAME: module for module in modules}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One inner subcommand per experiment found; none (any arguments taken) when there is no experiments/."""
    found = experiments()
    if not found:
        parser.add_argument("args", nargs=argparse.REMAINDER)
        return
    inner = parser.add_subparsers(dest="experiment", required=True)
    for name, module in found.items():
        module.add_arguments(inner.add_parser(name, help=module.HELP))


def run(args) -> int:
    if folder() is None:
        raise VecgptError(MISSING)
    return experiments()[args.experiment].run(args)
