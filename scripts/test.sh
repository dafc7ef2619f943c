#!/usr/bin/env bash
# Sets up .venv with every store's extra, checks lint and formatting (ruff), and runs the test suite.
# A PostgreSQL with pgvector is started by the tests themselves (pgserver) unless VECGPT_PG_DSN names one.
# The browser tests drive Debian's chromium: installed here with apt-get when missing and this user may install
# packages (root or passwordless sudo); otherwise they skip (under CI they fail).
set -euo pipefail
cd "$(dirname "$0")/.."

install_chromium() {
  command -v chromium >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 || return 0
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    sudo -n true 2>/dev/null || return 0
    sudo="sudo -n"
  fi
  echo "test.sh: installing chromium for the browser tests" >&2
  { $sudo apt-get install -y -qq chromium || { $sudo apt-get update -qq && $sudo apt-get install -y -qq chromium; }; } \
    >/dev/null 2>&1 || echo "test.sh: could not install chromium; the browser tests will skip" >&2
}

install_chromium
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e ".[all,test,lint]"
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
exec .venv/bin/python -m pytest "$@"
