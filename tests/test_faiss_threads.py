"""The FAISS store's split scans: each share on a worker thread of its own, each worker kept on one core."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

faiss_store = pytest.importorskip("vecgpt.backends.faiss")


def test_each_share_runs_on_a_worker_of_its_own_kept_on_one_core():
    seen = {}

    def share(i):
        def run():
            affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
            seen[i] = (threading.get_ident(), affinity)

        return run

    faiss_store.in_threads([share(0), share(1), share(2)])
    threads = [seen[i][0] for i in range(3)]
    assert len(set(threads)) == 3 and threading.get_ident() not in threads
    if hasattr(os, "sched_getaffinity"):
        cpus = sorted(os.sched_getaffinity(0))  # this thread's: the workers' pins leave it as it was
        assert [seen[i][1] for i in range(3)] == [{cpus[i % len(cpus)]} for i in range(3)]
    faiss_store.in_threads([share(0), share(1)])
    assert seen[1][0] == threads[1]  # the same workers again, not new threads


def test_a_split_scan_equals_one_scan(monkeypatch):
    rng = np.random.default_rng(3)
    table = faiss_store.FaissTable(300, "l2")
    table.append(rng.standard_normal((4001, 300)).astype(np.float32))
    q = rng.standard_normal((1, 300)).astype(np.float32)
    monkeypatch.setattr(faiss_store, "THREADS", [3])
    assert len(faiss_store.row_chunks(table.n, table.dim)) == 3
    split = table.every_row(q)
    monkeypatch.setattr(faiss_store, "THREADS", [1])
    assert np.array_equal(split, table.every_row(q))  # each row's distance is the same sum, whoever scans it
