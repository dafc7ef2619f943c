"""turbopuffer: every collection is a namespace, every search an exact kNN query over HTTP (official client).

Environment: TURBOPUFFER_API_KEY (required, never printed); TURBOPUFFER_BASE_URL or TURBOPUFFER_REGION
when [store] gives neither `base_url` nor `region`. Layout, limits, costs and the local server:
docs/turbopuffer.md.

Modules: `store` (TurbopufferStore), `writes` (upserts, a load's background writes), `catalog` (collections and the namespaces they own), `search` (kNN
subqueries, splitting at the row limit, fetch), `plumbing` (limits, concurrency gate, errors, billing),
`filters` (`Where` -> filter), `cost` (prices, the `vecgpt load --dry-run` estimate), `gc` (`vecgpt
tpuf-gc`), `server/` (`vecgpt tpuf-local`, a local server speaking turbopuffer's API).
"""

from __future__ import annotations

import os

from vecgpt.backends.base import user_name
from vecgpt.backends.turbopuffer.cost import PRICES, dollars, estimate_cost
from vecgpt.backends.turbopuffer.plumbing import KNN_SLOTS, MAX_TOP_K, SLOTS, bounded_client_class
from vecgpt.backends.turbopuffer.store import TurbopufferStore
from vecgpt.backends.turbopuffer.writes import b64
from vecgpt.errors import VecgptError

__all__ = ["PRICES", "TurbopufferStore", "b64", "connect", "dollars", "estimate_cost"]

NETWORKED = True  # every request a round trip: layout "auto" takes three (vecgpt.config.auto_layout)
LAYOUTS = ("namespace-per-matrix",)
CLONES = ("copy", "branch")


def connect(
    base_url: str | None = None,
    region: str | None = None,
    prefix: str | None = None,
    layout: str = "namespace-per-matrix",
    replicas: int = 1,
    key_replicas: int = 2,
    key_partition: str = "head",
    max_retries: int = 3,
    compression: bool = False,
    timeout: float = 5.0,
    max_top_k: int = MAX_TOP_K,
    slots: int = SLOTS,
    write_batch_mb: float = 8.0,
    clone_with: str = "copy",
) -> TurbopufferStore:
    """A TurbopufferStore on the service (or a local server) that base_url, region or the environment name."""
    import turbopuffer

    check_options(layout, clone_with, replicas, key_replicas, max_top_k, slots, timeout, max_retries)
    key = os.environ.get("TURBOPUFFER_API_KEY")
    if not key:
        raise VecgptError("set TURBOPUFFER_API_KEY (for a local server: the key `vecgpt tpuf-local` printed)")
    base_url, region = endpoint(base_url, region)
    try:
        client = bounded_client_class()(
            api_key=key,
            region=region,
            base_url=base_url,
            max_retries=max_retries,
            compression=compression,
            timeout=timeout,
        )
    except turbopuffer.TurbopufferError as e:
        raise VecgptError(f"turbopuffer client: {e}") from None
    prefix = f"vecgpt-{user_name()}-" if prefix is None else prefix
    url = str(client.base_url).rstrip("/")
    return TurbopufferStore(
        client, url, prefix, replicas, key_replicas, key_partition or None, max_top_k, slots, write_batch_mb, clone_with
    )


def check_options(layout, clone_with, replicas, key_replicas, max_top_k, slots, timeout, max_retries) -> None:
    """connect()'s options within their ranges, else a one-line error."""
    if layout not in LAYOUTS:
        raise VecgptError(
            f"layout {layout!r} is not offered; use {LAYOUTS[0]!r} "
            f"(why not a namespace per vector length: docs/turbopuffer.md)"
        )
    if clone_with not in CLONES:
        raise VecgptError(
            f"clone_with {clone_with!r}: use 'copy' (copy_from_namespace) or 'branch' (branch_from_namespace)"
        )
    if replicas < 1 or key_replicas < 1 or not 1 <= max_top_k <= MAX_TOP_K or slots < KNN_SLOTS:
        raise VecgptError("replicas and key_replicas must be >= 1, max_top_k within 1..10000, slots >= 2")
    if not timeout > 0 or max_retries < 0:
        raise VecgptError(
            f"timeout must be > 0 and max_retries >= 0 (got {timeout}, {max_retries}); a request gives up "
            f"after at most (max_retries + 1) * timeout plus backoff"
        )


def endpoint(base_url: str | None, region: str | None) -> tuple[str | None, str | None]:
    """(base_url, region) for the client: those given, else the environment's; a region is dropped for a
    base URL without `{region}` in it."""
    if base_url is None and region is None:
        base_url = os.environ.get("TURBOPUFFER_BASE_URL")
        region = None if base_url else os.environ.get("TURBOPUFFER_REGION")
        if base_url is None and region is None:
            raise VecgptError(
                "say where turbopuffer is: base_url or region in [store], or TURBOPUFFER_BASE_URL / "
                "TURBOPUFFER_REGION (e.g. gcp-us-central1)"
            )
    if base_url and "{region}" not in base_url:
        region = None
        if os.environ.get("TURBOPUFFER_REGION"):  # the client would take it and refuse this base URL
            raise VecgptError(f"TURBOPUFFER_REGION is set but base_url {base_url} has no {{region}}; unset it")
    return base_url, region
