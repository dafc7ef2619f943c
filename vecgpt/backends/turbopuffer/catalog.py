"""The catalog: one row per collection in `<prefix>_catalog` naming every namespace it owns (no listing;
see docs/turbopuffer.md), and creating a collection."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from vecgpt.backends.base import Metric, check_metric, check_same, existing, is_text, parallel, record
from vecgpt.backends.turbopuffer.cost import PRICES, clone_cost
from vecgpt.backends.turbopuffer.plumbing import Plumbing
from vecgpt.errors import VecgptError

NAME = re.compile(r"[A-Za-z0-9\-_.]{1,128}\Z")


class Catalog(Plumbing):
    """Collections as catalog rows, and the namespaces each one owns."""

    def _catalog(self) -> dict[str, dict]:
        specs = self._json_rows(self.catalog_ns, "spec", "reading the catalog")
        with self._lock:
            self._specs = dict(specs)
        return specs

    def _spec(self, name: str, required: bool = True) -> dict | None:
        spec = self._specs.get(name)
        if spec is None:
            spec = self._catalog().get(name)
        return existing(spec, self, name) if required else spec

    def _base(self, name: str, part=None) -> str:
        return self.prefix + name + ("" if part is None else f"--p{part}")

    def _replicas(self, base: str, n: int) -> list[str]:
        return [base] + [f"{base}--r{i}" for i in range(1, n)]

    def _groups(self, name: str, spec: dict) -> list[list[str]]:
        """The namespaces of a collection, from its catalog entry: per part, the part and its copies."""
        parts = spec.get("parts") if spec["partition"] else [None]
        if parts is None:  # a catalog row written before parts were recorded
            parts = self._listed_parts(name)
        return [self._replicas(self._base(name, p), spec["replicas"]) for p in parts]

    def _listed_parts(self, name: str) -> list[int]:
        base = self._base(name) + "--p"
        record()
        names = self._call(
            "listing namespaces (a catalog entry without parts)",
            base,
            lambda: [n.id for n in self.client.namespaces(prefix=base)],
        )
        return sorted({int(m.group(1)) for n in names for m in [re.match(re.escape(base) + r"(\d+)", n)] if m})

    def _owned(self, name: str) -> list[str]:
        """Every namespace that holds part of a collection, as the catalog names them."""
        spec = self._spec(name, required=False)
        return [] if spec is None else [ns for group in self._groups(name, spec) for ns in group]

    def _enter_parts(self, name: str, spec: dict, parts) -> None:
        """Record new parts in the catalog before anything is written to them (so nothing can leak)."""
        with self._parts_lock:
            spec = self._specs.get(name, spec)
            new = sorted(set(parts) - set(spec.get("parts") or []))
            if not new:
                return
            entry = {**spec, "parts": sorted(set(spec.get("parts") or []) | set(new))}
            self._write_spec(name, entry, "recording a collection's parts")

    # collections --------------------------------------------------------------------------
    def create(self, name: str, dim: int, metric: Metric, attrs: Sequence[str] = (), payload: int = 0) -> None:
        check_metric("turbopuffer", metric, self.metrics)  # it has no inner product
        check_collection(name)
        partition = self.key_partition if is_text(name) and self.key_partition in attrs else None
        spec = {
            "dim": int(dim),
            "metric": metric,
            "attrs": list(attrs),
            "partition": partition,
            "replicas": self.key_replicas if partition else self.replicas,
            "payload": int(payload),
        }
        for ns in self._replicas(self._base(name, 0 if partition else None), spec["replicas"]):
            check_namespace(ns)
        if partition:
            spec["parts"] = []
        held = self._specs.get(name) or (None if is_text(name) else self._spec(name, required=False))
        if held is not None:
            check_same(name, (held["dim"], held["metric"]), dim, metric)
            if held.get("payload", 0) != payload:
                raise VecgptError(
                    f"collection {name!r} exists with a payload of {held.get('payload', 0)} floats, not {payload}; "
                    f"drop it first"
                )
            return
        self._new_spec(name, spec)

    def _new_spec(self, name: str, spec: dict) -> None:
        self._write_spec(name, spec, "creating a collection")

    def clone(self, src: str, dst: str) -> None:
        """dst: every row of src, copied by the service namespace by namespace (`copy_from_namespace`, or
        `branch_from_namespace` with clone_with = "branch"), no row through this process; dst's catalog row is
        written first, so nothing can leak. What it cost: `last_clone` (cost.clone_cost)."""
        spec = self._spec(src)
        check_collection(dst)
        if self._spec(dst, required=False) is not None:
            raise VecgptError(f"cannot clone {src!r} to {dst!r}: collection {dst!r} exists; drop it first")
        pairs = [
            (ns, self._base(dst) + ns[len(self._base(src)) :]) for group in self._groups(src, spec) for ns in group
        ]
        for _, ns in pairs:
            check_namespace(ns)
        self._write_spec(dst, dict(spec), "creating a clone")
        written = parallel([lambda s=s, d=d: self._clone_namespace(s, d) for s, d in pairs])
        self.last_clone = clone_cost(self.clone_with, [b for b in written if b is not None])

    def _clone_namespace(self, src: str, dst: str) -> int | None:
        """One namespace copied or branched inside the service: the bytes it reports written (None: src has
        never been written, so there is nothing to copy)."""
        key = "branch_from_namespace" if self.clone_with == "branch" else "copy_from_namespace"
        record()
        out = self._raw(f"cloning {src}", dst, "write", missing=None, **{key: src})
        if out is None:
            return None
        written = int(out.get("billing", {}).get("billable_logical_bytes_written", 0))
        with self._lock:
            self.usage["write_requests"] += 1
            if self.clone_with == "branch":
                self.usage["branches"] += 1
            else:
                self.usage["billed_copied"] += max(written, PRICES["min_write_bytes"])
        return written

    def _write_spec(self, name: str, spec: dict, what: str) -> None:
        """Upsert a catalog row (idempotent: a 409 after retries means an earlier attempt landed)."""
        self._write(
            self.catalog_ns,
            what,
            conflict_ok=True,
            upsert_rows=[{"id": name, "spec": json.dumps(spec)}],
            schema={"spec": {"type": "string", "filterable": False}},
        )
        with self._lock:
            self._specs[name] = spec


def check_namespace(ns: str) -> None:
    if not NAME.match(ns):
        raise VecgptError(
            f"namespace name {ns!r} is not valid for turbopuffer ([A-Za-z0-9-_.], 1 to 128 characters); "
            f"shorten the prefix"
        )


def check_collection(name: str) -> None:
    if "--" in name or name.startswith("_") or not NAME.match(name):
        raise VecgptError(f"collection name {name!r}: use [A-Za-z0-9-_.], no '--', not starting with '_'")
