"""`vecgpt experiment <name>`: one subcommand per module in vecgpt/experiments that defines NAME."""

from __future__ import annotations

import importlib
import pkgutil

import vecgpt.experiments as pkg


def register(subparsers) -> None:
    parser = subparsers.add_parser("experiment", help="run an experiment; writes JSON, a table and a plot")
    inner = parser.add_subparsers(dest="experiment", required=True)
    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"vecgpt.experiments.{info.name}")
        if not hasattr(module, "NAME"):  # shared helpers: common, subjects, tracing, plots, output_*
            continue
        p = inner.add_parser(module.NAME, help=module.HELP)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
