"""The turbopuffer API key and a PostgreSQL password never reach stdout, stderr or a log record, even when
a command fails because of them (a rejected key, an unreachable or malformed DSN)."""

from __future__ import annotations

import importlib.util
import logging

import pytest

from vecgpt.cli import main

API_KEY = "tpuf-SECRET-KEY-7f3a9c"
PASSWORD = "pg-SECRET-PASS-41d8e2"


def run_logged(capsys, caplog, *argv) -> tuple[int, str]:
    """Exit code and everything a user or a log collector could see, with every logger at DEBUG."""
    with caplog.at_level(logging.DEBUG):
        code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err + caplog.text


def assert_refused_without(secret, code, seen):
    assert code == 2, seen
    assert secret not in seen
    assert "Traceback" not in seen.split("DEBUG")[0]  # the client logs its own exceptions at DEBUG; fine
    assert sum(line.startswith("vecgpt: error") for line in seen.splitlines()) == 1, seen


@pytest.fixture(scope="module")
def guarded_tpuf():
    pytest.importorskip("turbopuffer")
    from vecgpt.backends.turbopuffer.server import Running

    server = Running(api_key="the-right-key")
    yield server.url
    server.stop()


@pytest.mark.parametrize("command", [["ls"], ["drop", "--model", "0123"], ["tpuf-gc"], ["generate", "hi", "-n", "1"]])
def test_rejected_api_key_is_never_shown(capsys, caplog, tmp_path, monkeypatch, guarded_tpuf, tiny_model_dir, command):
    monkeypatch.setenv("TURBOPUFFER_API_KEY", API_KEY)
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    config = tmp_path / "tpuf.toml"
    config.write_text(f'backend = "turbopuffer"\n[store]\nbase_url = "{guarded_tpuf}"\nmax_retries = 0\n')
    model = ["--model", str(tiny_model_dir)] if command[0] == "generate" else []
    code, seen = run_logged(capsys, caplog, command[0], "--config", str(config), *model, *command[1:])
    assert_refused_without(API_KEY, code, seen)
    assert "401" in seen


PG_DSNS = [
    f"postgresql://fuzz:{PASSWORD}@127.0.0.1:1/db",  # refused
    f"host=127.0.0.1 port=1 user=fuzz password={PASSWORD}",  # key=value form: no "@" to split on
    f"postgresql://fuzz@127.0.0.1:1/db?password={PASSWORD}",  # password as a URI parameter
    f"postgresql://fuzz:{PASSWORD}@127.0.0.1:notaport/db",  # libpq rejects an option
    f"host=127.0.0.1 password={PASSWORD} port",  # not a connection string at all
    f"host='127.0.0.1 password={PASSWORD}",  # unterminated quote
]


@pytest.mark.skipif(importlib.util.find_spec("psycopg") is None, reason="pgvector needs psycopg")
@pytest.mark.parametrize("dsn", PG_DSNS)
def test_dsn_password_is_never_shown(capsys, caplog, monkeypatch, dsn):
    monkeypatch.setenv("VECGPT_PG_DSN", dsn)
    assert_refused_without(PASSWORD, *run_logged(capsys, caplog, "ls", "--backend", "pgvector"))


@pytest.mark.skipif(importlib.util.find_spec("psycopg") is None, reason="pgvector needs psycopg")
@pytest.mark.parametrize("dsn", PG_DSNS)
def test_config_dsn_password_is_never_shown(capsys, caplog, monkeypatch, tmp_path, dsn):
    monkeypatch.delenv("VECGPT_PG_DSN", raising=False)
    config = tmp_path / "pg.toml"
    config.write_text(f'backend = "pgvector"\n[store]\ndsn = "{dsn}"\n')
    assert_refused_without(PASSWORD, *run_logged(capsys, caplog, "ls", "--config", str(config)))
