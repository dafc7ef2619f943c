"""Text records: one row per text in `<prefix>_texts` (the record as a JSON string and who wrote it, not
filterable; its version, an int), changed only by conditional writes, so two processes never interleave
edits of one text (docs/turbopuffer.md, "Texts"). The service has no locks: versions only."""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timezone

from vecgpt.backends.base import check_version
from vecgpt.errors import TextConflict, VecgptError

RECORD_SCHEMA = {
    "record": {"type": "string", "filterable": False},  # up to 8 MiB unindexed (filterable values: 4 KiB)
    "writer": {"type": "string", "filterable": False},
    "written_at": {"type": "string", "filterable": False},
    "version": {"type": "int"},
}
NOT_HELD = ["id", "Eq", None]  # an existing document always has an id: true only for a new one


class Records:
    """read_text, write_text and texts of a TurbopufferStore (needs texts_ns and the plumbing)."""

    def read_text(self, text_id: str) -> dict | None:
        row = self._record_row(text_id, ["record", "version"])
        return None if row is None else {**json.loads(row["record"]), "version": row["version"]}

    def texts(self) -> list[str]:
        return [r["id"] for r in self._record_rows([])]

    def record_times(self) -> dict[str, str]:
        """When each record was last written (ISO 8601), by text id: `vecgpt tpuf-gc` ages texts by it."""
        return {r["id"]: r.get("written_at", "") for r in self._record_rows(["written_at"])}

    def _record_rows(self, attrs: list[str]) -> list[dict]:
        """Every record's row (id and these attributes), a page of max_top_k rows a request."""
        rows: list[dict] = []
        while True:
            after = {"filters": ["id", "Gt", rows[-1]["id"]]} if rows else {}
            body = {"rank_by": ["id", "asc"], "top_k": self.max_top_k, "include_attributes": attrs, **after}
            out = self._query(self.texts_ns, body, "listing the text records", missing=None)
            page = [] if out is None else out.get("rows", [])
            rows += page
            if len(page) < self.max_top_k:
                return rows

    def write_text(self, text_id: str, record: dict | None, expect: int | None) -> int:
        """One conditional write: a new record is an upsert that only creates (the service applies an upsert
        to a missing id unconditionally, so `version == expect` could not refuse a removed text); a change is
        a patch (never creates) on `version == expect`; a removal a delete on the same condition. Whether the
        condition held comes back as the count of rows written."""
        check_text_id(text_id)
        version, writer = (expect or 0) + 1, secrets.token_hex(8)
        held = ["version", "Eq", expect]
        if record is None:
            out = self._write(self.texts_ns, "removing a text record", deletes=[text_id], delete_condition=held)
            if out.get("rows_deleted", 0):
                return version
            return self._conflict(text_id, expect, version, writer, absent_ok=expect is None)
        row = {"id": text_id, "record": json.dumps(record), "version": version, "writer": writer, "written_at": _now()}
        if expect is None:
            out = self._write(
                self.texts_ns,
                "creating a text record",
                upsert_rows=[row],
                upsert_condition=NOT_HELD,
                schema=RECORD_SCHEMA,
            )
            done = out.get("rows_upserted", 0)
        else:
            out = self._write(
                self.texts_ns, "writing a text record", patch_rows=[row], patch_condition=held, schema=RECORD_SCHEMA
            )
            done = out.get("rows_patched", 0)
        return version if done else self._conflict(text_id, expect, version, writer)

    def _conflict(self, text_id: str, expect, version: int, writer: str, absent_ok: bool = False) -> int:
        """A conditional write that wrote nothing: our own write if a retry of it landed first (its reply was
        lost), else TextConflict saying what the stored record is now."""
        row = self._record_row(text_id, ["version", "writer"])
        if row is not None and row.get("writer") == writer and row.get("version") == version:
            return version
        if row is None and absent_ok:
            return version
        check_version(text_id, None if row is None else row.get("version"), expect)
        raise TextConflict(f"text {text_id} was changed by another process meanwhile; open it again")

    def _record_row(self, text_id: str, attrs: list[str]) -> dict | None:
        check_text_id(text_id)
        body = {"rank_by": ["id", "asc"], "top_k": 1, "filters": ["id", "Eq", text_id], "include_attributes": attrs}
        out = self._query(self.texts_ns, body, "reading a text record", missing=None)
        rows = [] if out is None else out.get("rows", [])
        return rows[0] if rows else None


def check_text_id(text_id: str) -> None:
    if not isinstance(text_id, str) or not text_id or len(text_id.encode()) > 64:
        raise VecgptError(f"text id {text_id!r}: turbopuffer string ids are 1 to 64 bytes")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
