#!/usr/bin/env bash
# Sets up .venv with every store's extra, checks lint and formatting (ruff), and runs the test suite.
# A PostgreSQL with pgvector is started by the tests themselves (pgserver) unless VECGPT_PG_DSN names one.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e ".[all,test,lint]"
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
exec .venv/bin/python -m pytest "$@"
