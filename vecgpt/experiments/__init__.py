"""Experiments: each module that defines NAME also defines HELP, add_arguments(parser) and run(args) -> int.

`vecgpt experiment <NAME>` runs one; experiments/NN_<name>/run.py is the same as a script.
"""
