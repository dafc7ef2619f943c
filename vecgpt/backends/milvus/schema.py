"""A vecgpt collection as a Milvus collection: its schema and FLAT index, and what they say back about it."""

from __future__ import annotations

from typing import NamedTuple

from pymilvus import DataType, MilvusClient

from vecgpt.backends.base import Metric

METRICS = {"l2": "L2", "ip": "IP"}  # Milvus's names; its L2 is the squared distance, its IP the inner product
RESERVED = {"id", "vector", "payload"}  # the fields a collection has beside its attributes
MAX_PAYLOAD = 4096  # floats an ARRAY field may hold


class Info(NamedTuple):
    """A collection as its schema and index describe it."""

    dim: int
    metric: Metric
    attrs: tuple[str, ...]
    width: int  # floats of payload a row

    @property
    def row_bytes(self) -> int:
        return 8 + 4 * self.dim + 8 * len(self.attrs) + 4 * self.width


def schema(client: MilvusClient, info: Info):
    """id (the primary key), vector, an INT64 field per attribute, and the payload as an ARRAY of FLOAT."""
    out = client.create_schema(auto_id=False, enable_dynamic_field=False)
    out.add_field("id", DataType.INT64, is_primary=True)
    out.add_field("vector", DataType.FLOAT_VECTOR, dim=info.dim)
    for attr in info.attrs:
        out.add_field(attr, DataType.INT64)
    if info.width:
        out.add_field("payload", DataType.ARRAY, element_type=DataType.FLOAT, max_capacity=info.width)
    return out


def flat_index(client: MilvusClient, metric: Metric):
    index = client.prepare_index_params()
    index.add_index("vector", index_type="FLAT", metric_type=METRICS[metric])
    return index


def described(client: MilvusClient, stored: str) -> Info:
    """A collection's Info, read from its schema and its index (two requests)."""
    fields = {f["name"]: f for f in client.describe_collection(stored)["fields"]}
    metric = {v: k for k, v in METRICS.items()}[client.describe_index(stored, "vector")["metric_type"]]
    attrs = tuple(name for name in fields if name not in RESERVED)
    width = int(fields["payload"]["params"]["max_capacity"]) if "payload" in fields else 0
    return Info(int(fields["vector"]["params"]["dim"]), metric, attrs, width)
