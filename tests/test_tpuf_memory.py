"""The local turbopuffer server's memory: vectors held as float32 in chunks (growth allocates at most one chunk),
a write that runs out of memory answered 507 with nothing of it written (never 400), and the adapter's one line.
The out-of-memory test runs the server in its own process with its address space capped (`--memory-limit-mb`)."""

import base64
import re
import subprocess
import sys

import numpy as np
import pytest

turbopuffer = pytest.importorskip("turbopuffer")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from procs import ROOT, env  # noqa: E402
from setup_turbopuffer import die_with_parent, stop  # noqa: E402

from vecgpt.backends import turbopuffer as tpb  # noqa: E402
from vecgpt.backends.turbopuffer.server import Namespace, Running, vectors  # noqa: E402
from vecgpt.errors import VecgptError  # noqa: E402


def test_rows_are_float32_and_grow_at_most_a_chunk_at_a_time(monkeypatch):
    monkeypatch.setattr(vectors, "CHUNK_BYTES", 64 * 4 * 4)  # 64 rows of 4 floats a chunk
    rows, want, rng = vectors.Rows(4), np.zeros((0, 4), np.float32), np.random.default_rng(0)
    norms = np.zeros(0)
    for size in (3, 17, 80, 1, 60):
        full = rows.chunks[:-1] if rows.chunks and rows.chunks[-1].shape[1] < 64 else list(rows.chunks)
        rows.reserve(len(want) + size, len(want))
        assert all(a is b for a, b in zip(full, rows.chunks))  # full chunks stay where they are: no second copy
        v = rng.standard_normal((size, 4)).astype(np.float32)
        rows.put(np.arange(len(want), len(want) + size), v, vectors.squared_norms(v))
        want, norms = np.vstack([want, v]), np.concatenate([norms, vectors.squared_norms(v)])
    assert [c.shape for c in rows.chunks] == [(4, 64), (4, 64), (4, 33)]
    assert {c.dtype for c in rows.chunks} == {np.dtype("float32")}
    every = np.arange(len(want))
    np.testing.assert_array_equal(rows.get(every[::-1]), want[::-1])
    for chosen in (every, every[5:150], every[::3]):
        got = list(rows.blocks(chosen, len(want), 7))
        assert max(v.shape[1] for v, _ in got) <= 7
        np.testing.assert_array_equal(np.concatenate([v.T for v, _ in got]), want[chosen])
        np.testing.assert_array_equal(np.concatenate([n for _, n in got]), norms[chosen])
    rows.move(160, 2)
    rows.truncate(128)
    copied = rows.copy(128)
    rows.put(np.array([0]), want[:1] + 1, np.zeros(1))  # the copy is independent
    assert [c.shape[1] for c in rows.chunks] == [64, 64] and [c.shape[1] for c in copied.chunks] == [64, 64]
    np.testing.assert_array_equal(copied.get(np.array([0, 2, 127])), want[[0, 160, 127]])


def test_a_write_out_of_memory_leaves_the_namespace_as_it_was(monkeypatch):
    ns = Namespace("n")
    ns.upsert([1, 2], np.ones((2, 3), np.float32), {"a": [1, 2]})
    before = (list(ns.ids), dict(ns.slot_of), {k: list(v) for k, v in ns.attrs.items()}, ns.rows.get(np.arange(2)))

    def no_memory(*args):
        raise MemoryError

    monkeypatch.setattr(vectors.Rows, "reserve", no_memory)
    with pytest.raises(MemoryError):
        ns.upsert([2, 3], np.zeros((2, 3), np.float32), {"a": [5, 6]})
    assert (list(ns.ids), dict(ns.slot_of), {k: list(v) for k, v in ns.attrs.items()}) == before[:3]
    np.testing.assert_array_equal(ns.rows.get(np.arange(2)), before[3])


def test_float32_scans_across_chunks_add_one_dimension_at_a_time(monkeypatch):
    """--float32 reads the rows a block at a time from chunks; each distance is still the sequential float32 sum,
    subquery i of a multi_query starting at dimension i."""
    monkeypatch.setattr(vectors, "CHUNK_BYTES", 16 * 9 * 4)
    monkeypatch.setattr(vectors, "BLOCK_BYTES", 5 * 9 * 4)
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    running = Running(float32=True)
    try:
        ns = turbopuffer.Turbopuffer(api_key="k", base_url=running.url, max_retries=0).namespace("chunks")
        rng = np.random.default_rng(3)
        x = (rng.standard_normal((50, 9)) * np.logspace(-3, 3, 9)).astype(np.float32)
        ns.write(upsert_columns={"id": list(range(50)), "vector": x.tolist()}, distance_metric="euclidean_squared")
        q = rng.standard_normal(9).astype(np.float32)
        sub = {"rank_by": ("vector", "kNN", q.tolist()), "top_k": 50}
        found = ns.multi_query(
            queries=[{**sub, "filters": ["id", "Gte", 0]}, {**sub, "filters": ["id", "In", [3, 40]]}]
        )
        for place, result in enumerate(found.results):
            acc = np.zeros(50, np.float32)
            for j in np.roll(np.arange(9), -place):
                acc += (x[:, j] - q[j]) * (x[:, j] - q[j])
            assert {r.id: r["$dist"] for r in result.rows} == {i: float(acc[i]) for i in (r.id for r in result.rows)}
        assert len(found.results[0].rows) == 50 and sorted(r.id for r in found.results[1].rows) == [3, 40]
    finally:
        running.stop()


def test_memory_error_is_answered_507_saying_so(monkeypatch):
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    running = Running()
    try:
        ns = turbopuffer.Turbopuffer(api_key="k", base_url=running.url, max_retries=0).namespace("full")
        ns.write(upsert_rows=[{"id": 1, "vector": [1.0, 2.0]}], distance_metric="euclidean_squared")

        def no_memory(*args):
            raise MemoryError

        monkeypatch.setattr(Namespace, "upsert", no_memory)
        with pytest.raises(turbopuffer.InternalServerError) as caught:
            ns.write(upsert_rows=[{"id": 2, "vector": [1.0, 2.0]}])
        assert caught.value.status_code == 507 and "out of memory" in caught.value.body["error"]
        assert running.server.stats["status_507"] == 1 and ns.metadata().approx_row_count == 1
    finally:
        running.stop()


def start_server(*options) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "vecgpt.backends.turbopuffer.server", "--port", "0", "--api-key", "k", *options]
    proc = subprocess.Popen(cmd, env=env(), cwd=ROOT, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    found = re.search(r"http://127\.0\.0\.1:\d+", proc.stdout.readline())
    if not found:
        stop(proc)
        raise RuntimeError("the local turbopuffer server did not start")
    return proc, found.group()


def vm_size_mb(pid: int) -> float:
    return int(re.search(r"VmSize:\s+(\d+) kB", open(f"/proc/{pid}/status").read()).group(1)) / 1024


def batch(start: int, rows: int = 1024, dim: int = 1024) -> dict:
    v = np.random.default_rng(start).standard_normal((rows, dim)).astype(np.float32)
    v[0] = start  # the first row of each batch is known
    return {"id": list(range(start, start + rows)), "vector": [base64.b64encode(r.tobytes()).decode() for r in v]}


def warm(url: str) -> None:
    ns = turbopuffer.Turbopuffer(api_key="k", base_url=url, max_retries=0).namespace("warm")
    ns.write(upsert_columns=batch(0), distance_metric="euclidean_squared")
    ns.query(rank_by=("vector", "kNN", [0.0] * 1024), top_k=1, filters=["id", "Gte", 0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_out_of_memory_is_507_and_one_line_and_leaves_the_data_whole(monkeypatch):
    """4 MB writes into a server capped at 200 MB above its size when warm: a write that would not fit gets 507,
    the rows acknowledged are all there, the adapter's error is one line, and deleting a namespace makes room."""
    monkeypatch.setenv("TURBOPUFFER_API_KEY", "k")
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    proc, url = start_server()
    try:
        warm(url)
        size = vm_size_mb(proc.pid)
    finally:
        stop(proc)
    proc, url = start_server("--memory-limit-mb", f"{size + 200:.0f}")
    try:
        warm(url)
        client = turbopuffer.Turbopuffer(api_key="k", base_url=url, max_retries=0)
        store = tpb.connect(base_url=url, prefix="m-", max_retries=0)
        store.create("wide", 1024, "l2")
        ns, held = client.namespace("big"), 0
        for _ in range(100):
            try:
                ns.write(upsert_columns=batch(held), distance_metric="euclidean_squared")
            except turbopuffer.InternalServerError as e:
                refused = e
                break
            held += 1024
        assert refused.status_code == 507 and "out of memory" in refused.body["error"], refused.body
        assert held and ns.metadata().approx_row_count == held
        for start in (0, held - 1024):
            q = [float(start)] * 1024
            top = ns.query(rank_by=("vector", "kNN", q), top_k=1, filters=["id", "Eq", start]).rows
            assert [(r.id, r["$dist"]) for r in top] == [(start, 0.0)]
        with pytest.raises(VecgptError) as said:
            store.upsert("wide", np.arange(1024), np.ones((1024, 1024), np.float32))
        assert "out of memory" in str(said.value) and "replicas = 1" in str(said.value)
        assert "\n" not in str(said.value)
        ns.delete_all()
        client.namespace("again").write(upsert_columns=batch(0), distance_metric="euclidean_squared")
        assert proc.poll() is None
    finally:
        stop(proc)
