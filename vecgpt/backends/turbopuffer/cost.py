"""turbopuffer prices, the dollars of a usage tally, and the backend's `estimate_cost` hook, which
`vecgpt load --dry-run` prints (see vecgpt.backends.base)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# published prices (turbopuffer.com/pricing, Launch/Scale tiers; reference section 10)
PRICES = {
    "storage_gb_month": 0.33,
    "write_gb": 2.0,
    "queried_pb": 1.0,
    "returned_gb": 0.05,
    "min_query_bytes": 1.28e9,
    "min_write_bytes": 10e3,
    "branch": 0.032,  # branch_from_namespace, flat
    "copy_discount": 0.5,  # copy_from_namespace: 50%, stacking with up to 50% for batches (not counted here)
    "unindexed_storage": 0.5,  # a filterable: false attribute is stored at half price
}


def dollars(usage: Mapping[str, float]) -> float:
    """Dollars for a usage tally (billed bytes written, queried, returned), at the published prices."""
    return (
        usage.get("billed_written", 0) / 1e9 * PRICES["write_gb"]
        + usage.get("billed_copied", 0) / 1e9 * PRICES["write_gb"] * (1 - PRICES["copy_discount"])
        + usage.get("branches", 0) * PRICES["branch"]
        + usage.get("billed_queried", 0) / 1e15 * PRICES["queried_pb"]
        + usage.get("billed_returned", 0) / 1e9 * PRICES["returned_gb"]
    )


def clone_cost(method: str, written: Sequence[int]) -> dict:
    """What a clone cost: `copy` bills each namespace's logical bytes as a write at the copy discount (at least
    the 10 KB write minimum), `branch` a flat fee a namespace whatever its size."""
    if method == "branch":
        dollars_ = len(written) * PRICES["branch"]
    else:
        billed = sum(max(b, PRICES["min_write_bytes"]) for b in written)
        dollars_ = billed / 1e9 * PRICES["write_gb"] * (1 - PRICES["copy_discount"])
    return {"method": method, "namespaces": len(written), "bytes": sum(written), "dollars": dollars_}


def estimate_cost(
    rows: Sequence[tuple[str, int, int]],
    replicas: int = 1,
    key_replicas: int = 2,
    n_head: int | None = None,
    key_row: tuple[int, int] | None = None,
    n_kv_head: int | None = None,
) -> str:
    """What a load writes and costs, and what a generated token costs, at the published prices.

    rows: (collection, documents, dimension) as `vecgpt.loading.plan` gives them; n_head and key_row (a text
    row's vector and payload widths, `vecgpt.loading.text_row`) default to GPT-2's 64-wide heads in layout
    four; n_kv_head, the key heads (grouped-query attention: fewer than n_head; default n_head). Per token: one
    kNN subquery per matrix, one per query head for the keys (a request per key head carries its group's), the
    token search (and, an own output matrix beside the token table, the token's row fetched by id), each billed
    at least 1.28 GB queried; the token's keys go out in two upserts (`write_parts`), a write per key head
    namespace and copy (the first copy carries the payload), each billed at least 10 KB.
    """
    doc_bytes = [(name, n, d, n * (8 + 4 * d + 8)) for name, n, d in rows]  # id + f32 vector + row attribute
    docs = sum(n for _, n, _, _ in doc_bytes) * replicas
    size = sum(b for *_, b in doc_bytes) * replicas
    width = next((d for name, _, d in rows if name == "wpe"), 768)
    heads = n_head or max(1, width // 64)
    token = token_cost(doc_bytes, heads, key_row or (width // heads, width), key_replicas, n_kv_head)
    return "\n".join(
        [
            f"turbopuffer: {docs:,} documents, {size / 1e9:,.3f} GB logical ({replicas} cop{'y' if replicas == 1 else 'ies'})",
            f"  load (writes at $2/GB, before batch discounts): ${size / 1e9 * PRICES['write_gb']:,.2f}",
            f"  storage at $0.33/GB-month: ${size / 1e9 * PRICES['storage_gb_month']:,.2f} a month",
            f"  per generated token: {token['subqueries']} kNN subqueries (>= 1.28 GB queried each) in "
            f"{token['requests']} requests, "
            f"{token['returned'] / 1e6:.2f} MB returned, {token['writes']} key writes "
            f"({token['key_writes'] / 1e3:,.0f} KB): ${token['dollars']:.6f}",
            "  (prices from turbopuffer.com/pricing, Launch/Scale; minimum bill $16 a month)",
        ]
    )


def token_cost(
    doc_bytes: list, heads: int, key_row: tuple[int, int], key_replicas: int, kv_heads: int | None = None
) -> dict:
    """A generated token's kNN subqueries and requests, bytes queried and returned, key writes and their bytes,
    and its dollars. doc_bytes: (collection, documents, dimension, logical bytes) a collection; heads: query heads;
    kv_heads: the key heads, each a namespace (and its copies) written and searched (default: heads)."""
    kv, least = kv_heads or heads, PRICES["min_query_bytes"]
    matrices = [r for r in doc_bytes if r[0].startswith("h.")]
    layers = sum(1 for r in matrices if r[0].endswith("attn.c_attn"))
    per_ns_bytes = {name: b for name, _, _, b in doc_bytes}
    output = "lm_head" if "lm_head" in per_ns_bytes else "wte"
    lookups = int("embed_tokens" in per_ns_bytes)  # untied: the next token's row is a fetch by id, a query
    searched = len(matrices) + layers * heads + 1 + lookups
    queried = sum(max(least, per_ns_bytes[r[0]]) for r in matrices) + max(least, per_ns_bytes.get(output, 0))
    queried += (layers * heads + lookups) * least
    returned = sum(n for _, n, _, _ in matrices) * 12  # every row: id and distance
    parts = write_parts(layers)
    key_writes = kv * sum(key_write_bytes(n, key_row, key_replicas) for n in parts)
    return {
        "subqueries": searched,
        "requests": searched - layers * heads + layers * kv * key_search_requests(heads // kv, key_replicas),
        "queried": queried,
        "returned": returned,
        "writes": kv * key_replicas * len(parts),  # each part's upsert: a request per key head namespace copy
        "key_writes": key_writes,
        "dollars": queried / 1e15 * PRICES["queried_pb"]
        + returned / 1e9 * PRICES["returned_gb"]
        + key_writes / 1e9 * PRICES["write_gb"],
    }


def key_search_requests(group: int, copies: int, per_request: int = 8) -> int:
    """Requests of one key head's search for a decode step: its group's queries spread over the head's namespace
    copies, at most `per_request` subqueries a request (16 slots, a kNN subquery taking 2; search.Searching._run)."""
    size = max(1, min(per_request, -(-group // copies)))
    return -(-group // size)


def write_parts(layers: int) -> list[int]:
    """The layers in each upsert of a generated token's keys: the first half's, then the rest (engine.write_points)."""
    first = max(1, layers // 2)
    return [first, layers - first] if layers > first else [layers]


def key_write_bytes(layers: int, key_row: tuple[int, int], copies: int) -> float:
    """Billed bytes of one head's key rows of a token (one per layer) over its namespace copies: a row is its
    id, vector and three integer attributes (layer, head, position), the first copy's also its payload as
    base64 text; each request at least the 10 KB write minimum."""
    dim, payload = key_row
    row = 8 + 4 * dim + 3 * 8
    first = layers * (row + b64_length(payload))
    return max(first, PRICES["min_write_bytes"]) + (copies - 1) * max(layers * row, PRICES["min_write_bytes"])


def b64_length(floats: int) -> int:
    """Characters of a float32 vector sent as base64 text: 4 per 3 bytes, padded."""
    return 4 * -(-4 * floats // 3) if floats else 0
