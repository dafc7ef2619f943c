#!/usr/bin/env bash
# Sets up .venv with the FAISS extra and continues a prompt with the shipped Shakespeare model.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e ".[faiss]"
exec .venv/bin/vecgpt generate "${@:-ROMEO:}" -n 40
