"""The server's state: namespaces by name, settings (latency, API key, top_k limit, arithmetic, listing,
indexing lag, faults), stats, slots, memory; namespace-level operations (delete, metadata, schema, listing). Writes and queries are in
`writes` and `query`; the HTTP side is `app`."""

from __future__ import annotations

import threading
import time
from collections import Counter

from vecgpt.backends.turbopuffer.server import query as queries
from vecgpt.backends.turbopuffer.server import writes
from vecgpt.backends.turbopuffer.server.faults import FAULTS, Faults
from vecgpt.backends.turbopuffer.server.limits import MAX_TOP_K, SLOTS, ApiError, check_name
from vecgpt.backends.turbopuffer.server.memory import Memory
from vecgpt.backends.turbopuffer.server.namespaces import Namespace
from vecgpt.backends.turbopuffer.server.slots import Slots


class Server:
    """The namespaces and the request handlers (the starlette app is built by `app()`)."""

    def __init__(
        self,
        latency_ms: float = 0.0,
        api_key: str | None = None,
        max_top_k: int = MAX_TOP_K,
        slots: int = SLOTS,
        float32: bool = False,
        write_latency_ms: float = 0.0,
        list_lag_s: float = 0.0,
        list_forbidden: bool = False,
        index_lag_ms: float = 0.0,
        fail_rate: float = 0.0,
        fail_seed: int = 0,
        fail_kinds: tuple = FAULTS,
    ):
        self.latency, self.write_latency = latency_ms / 1000, write_latency_ms / 1000
        self.api_key, self.max_top_k, self.slots, self.float32 = api_key, max_top_k, slots, float32
        self.list_lag, self.list_forbidden, self.index_lag = list_lag_s, list_forbidden, index_lag_ms / 1000
        self.faults = Faults(fail_rate, fail_seed, fail_kinds)
        self.namespaces: dict[str, Namespace] = {}
        self.born: dict[str, float] = {}  # name -> when it was created, and when deleted ones went
        self.gone: dict[str, float] = {}  # (monotonic seconds): a lagging listing still shows or lacks them
        self.lock = threading.Lock()
        self.stats = Counter()
        self.slot_pool = Slots(slots, self.stats)
        self.memory = Memory(self.held)

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
                self.born[name] = time.monotonic()
            return self.namespaces[name]

    def held(self) -> tuple[int, int]:
        """(namespaces, bytes of float32 vectors they hold)."""
        spaces = list(self.namespaces.values())
        return len(spaces), sum(4 * ns.n * (ns.dim or 0) for ns in spaces)

    def delete(self, name: str) -> dict:
        self.get(name)
        with self.lock:
            self.namespaces.pop(name, None)
            self.gone[name] = time.monotonic()
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
        return queries.query(self.get(name), body, self.max_top_k, self.float32)

    # metadata -----------------------------------------------------------------------------
    def metadata(self, name: str) -> dict:
        ns = self.get(name)
        with ns.lock:
            return {
                "approx_logical_bytes": ns.logical_bytes(),
                "approx_row_count": ns.n,
                "created_at": ns.created_at,
                "updated_at": ns.updated_at,
                "encryption": {"mode": "default"},
                "index": ns.index_status(),
                "schema": self.schema(name),
            }

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

    def listed(self) -> set[str]:
        """The names a listing shows: with a lag, those created within it are missing and those deleted
        within it still appear (the docs call listing not consistent)."""
        if self.list_forbidden:
            raise ApiError(403, "this API key may not list namespaces (it lacks list or admin permission)")
        if not self.list_lag:
            return set(self.namespaces)
        cut = time.monotonic() - self.list_lag
        with self.lock:
            return {n for n in self.namespaces if self.born.get(n, 0) <= cut} | {
                n for n, t in self.gone.items() if t > cut and self.born.get(n, 0) <= cut
            }

    def list(self, prefix: str, cursor: str | None, page_size: int) -> dict:
        names = sorted(n for n in self.listed() if n.startswith(prefix) and (cursor is None or n > cursor))
        page = names[:page_size]
        return {"namespaces": [{"id": n} for n in page], "next_cursor": page[-1] if len(names) > page_size else None}
