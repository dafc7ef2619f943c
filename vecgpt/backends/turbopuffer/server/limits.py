"""The service's limits and its error reply: names, ids, dimensions, rows, subqueries, slots, body size,
attribute values (8 MiB; 4 KiB unless the schema says `filterable: false`)."""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z0-9\-_.]{1,128}\Z")
MAX_TOP_K = 10_000
MAX_SUBQUERIES = 16
MAX_DIMS = 10_752
MAX_BODY = 512_000_000
MAX_VALUE = 8 * 2**20  # an attribute value
MAX_FILTERABLE = 4 * 2**10  # a value of an attribute that can be filtered on (the default)
SLOTS = 16
SLOT_WAIT_S = 0.8
METRICS = ("euclidean_squared", "cosine_distance")


class ApiError(Exception):
    """An error reply: HTTP status, message, extra headers."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def check_name(name: str) -> None:
    if not NAME.match(name):
        raise ApiError(400, f"invalid namespace name {name!r}: use [A-Za-z0-9-_.], 1 to 128 characters")


def valid_id(value):
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ApiError(400, f"invalid id {value!r}: ids are unsigned integers, UUIDs or strings")
    if isinstance(value, int) and not 0 <= value < 2**64:
        raise ApiError(400, f"invalid id {value}: integer ids are u64")
    if isinstance(value, str) and len(value.encode()) > 64:
        raise ApiError(400, "invalid id: string ids are at most 64 bytes")
    return value


def filterable(schema: dict, attr: str) -> bool:
    """Whether a namespace's schema (the write's `schema` entries) lets filters use this attribute (the default)."""
    spec = schema.get(attr)
    return not (isinstance(spec, dict) and spec.get("filterable") is False)


def value_bytes(v) -> int:
    """The bytes a value counts for: 0 for null, a string's UTF-8 bytes, 8 for a number, a list's items summed."""
    if v is None:
        return 0
    if isinstance(v, str):
        return len(v.encode())
    if isinstance(v, list):
        return sum(value_bytes(x) for x in v)
    return 8


def check_sizes(ns, attrs: dict) -> None:
    """A write's attribute values within the documented sizes (checked after the request's schema applies)."""
    for name, column in attrs.items():
        limit = MAX_FILTERABLE if filterable(ns.schema_extra, name) else MAX_VALUE
        big = max((value_bytes(v) for v in column), default=0)
        if big > limit:
            hint = "" if limit == MAX_VALUE else " (declare it filterable: false in the schema for up to 8 MiB)"
            raise ApiError(400, f"attribute {name!r}: a value of {big} bytes exceeds the limit of {limit}{hint}")
