"""The server's state: namespaces by name, settings (latency, API key, top_k limit, slot rule), stats,
slots; namespace-level operations (delete, metadata, schema, listing). Writes and queries are in
`writes` and `query`; the HTTP side is `app`."""

from __future__ import annotations

import threading
from collections import Counter

from vecgpt.tpuf_local import query as queries
from vecgpt.tpuf_local import writes
from vecgpt.tpuf_local.limits import MAX_TOP_K, SLOTS, ApiError, check_name
from vecgpt.tpuf_local.namespaces import Namespace
from vecgpt.tpuf_local.slots import Slots


class Server:
    """The namespaces and the request handlers (the starlette app is built by `app()`)."""

    def __init__(self, latency_ms: float = 0.0, api_key: str | None = None, max_top_k: int = MAX_TOP_K,
                 slots: int = SLOTS, slot_rule: str = "subquery"):
        self.latency = latency_ms / 1000
        self.api_key, self.max_top_k, self.slots, self.slot_rule = api_key, max_top_k, slots, slot_rule
        self.namespaces: dict[str, Namespace] = {}
        self.lock = threading.Lock()
        self.stats = Counter()
        self.slot_pool = Slots(slots, self.stats)

    # namespaces ---------------------------------------------------------------------------
    def get(self, name: str) -> Namespace:
        check_name(name)
        ns = self.namespaces.get(name)
        if ns is None:
            raise ApiError(404, f"namespace '{name}' was not found")
        return ns

    def get_or_create(self, name: str) -> Namespace:
        check_name(name)
        with self.lock:
            if name not in self.namespaces:
                self.namespaces[name] = Namespace(name)
            return self.namespaces[name]

    def delete(self, name: str) -> dict:
        self.get(name)
        with self.lock:
            self.namespaces.pop(name, None)
        return {"status": "OK"}

    # slots --------------------------------------------------------------------------------
    @property
    def in_use(self) -> Counter:
        return self.slot_pool.in_use

    @property
    def conditions(self) -> dict:
        return self.slot_pool.conditions

    async def acquire(self, name: str, need: int) -> None:
        await self.slot_pool.acquire(name, need)

    async def release(self, name: str, need: int) -> None:
        await self.slot_pool.release(name, need)

    # writes and queries -------------------------------------------------------------------
    def write(self, name: str, body: dict) -> dict:
        return writes.write(self, name, body)

    def clone(self, name: str, source: str, empty_only: bool) -> dict:
        return writes.clone(self, name, source, empty_only)

    def query(self, name: str, body: dict) -> dict:
        return queries.query(self.get(name), body, self.max_top_k)

    # metadata -----------------------------------------------------------------------------
    def metadata(self, name: str) -> dict:
        ns = self.get(name)
        with ns.lock:
            return {"approx_logical_bytes": ns.logical_bytes(), "approx_row_count": ns.n,
                    "created_at": ns.created_at, "updated_at": ns.updated_at,
                    "encryption": {"mode": "default"}, "index": {"status": "up-to-date"},
                    "schema": self.schema(name)}

    def schema(self, name: str) -> dict:
        ns = self.get(name)
        out = {"id": {"type": "uint" if not ns.ids or isinstance(ns.ids[0], int) else "string"}}
        if ns.dim is not None:
            out["vector"] = {"type": f"[{ns.dim}]f32", "ann": {"distance_metric": ns.metric}}
        for a, t in ns.types.items():
            out[a] = {"type": t}
        for a, spec in ns.schema_extra.items():
            out[a] = {**out.get(a, {}), **(spec if isinstance(spec, dict) else {"type": spec})}
        return out

    def list(self, prefix: str, cursor: str | None, page_size: int) -> dict:
        names = sorted(n for n in self.namespaces if n.startswith(prefix) and (cursor is None or n > cursor))
        page = names[:page_size]
        return {"namespaces": [{"id": n} for n in page],
                "next_cursor": page[-1] if len(names) > page_size else None}
