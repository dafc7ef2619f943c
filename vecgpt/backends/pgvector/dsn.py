"""Connection strings: where one comes from, and how to name it without its password."""

from __future__ import annotations

import psycopg

from vecgpt.backends.base import first_line
from vecgpt.errors import VecgptError

ENV_DSN = "VECGPT_PG_DSN"


def dsn_params(dsn: str, where: str) -> dict:
    try:
        return psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:  # libpq may quote the string, password included: not shown
        raise VecgptError(f"{where} is not a PostgreSQL connection string ({first_line(e).split(':')[0]})") from None


def describe_dsn(dsn: str) -> str:
    """host:port/dbname of a connection string: never its user or password, wherever they were written."""
    params = dsn_params(dsn, "the DSN")
    return (
        f"{params.get('host') or params.get('hostaddr') or 'localhost'}:{params.get('port') or 5432}/"
        f"{params.get('dbname') or ''}"
    )


def scrub(message: str, dsn: str) -> str:
    """A libpq message with the DSN's password, if any, blotted out."""
    try:
        password = dsn_params(dsn, "the DSN").get("password")
    except VecgptError:  # unreadable, so its password cannot be found: show nothing of the message
        return "the connection string cannot be read"
    return message.replace(password, "***") if password else message


def check_dsn_has_no_password(dsn: str) -> None:
    params = dsn_params(dsn, "[store] dsn")
    if params.get("password"):
        raise VecgptError(
            "[store] dsn must not hold a password: put it in PGPASSWORD or ~/.pgpass, "
            f"or give the whole DSN in {ENV_DSN}"
        )
