"""The FAISS store's threads: a big one-query scan's shares (one in the calling thread, each other on a worker kept on
another core), and a forked child's searches."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import procs
import pytest

faiss_store = pytest.importorskip("vecgpt.backends.faiss")


def test_the_last_share_runs_here_the_others_on_workers_each_kept_on_one_core():
    seen = {}

    def share(i):
        def run():
            affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
            seen[i] = (threading.get_ident(), affinity)

        return run

    faiss_store.in_threads([share(0), share(1), share(2)])
    threads = [seen[i][0] for i in range(3)]
    assert threads[2] == threading.get_ident() and len(set(threads)) == 3
    if faiss_store.CPUS:
        assert all(len(seen[i][1]) == 1 and seen[i][1] <= set(faiss_store.CPUS) for i in range(2))


@pytest.mark.parametrize("cpus", [[0, 1], [4, 5, 6, 7], [3]])
def test_workers_on_this_threads_core_come_last(monkeypatch, cpus):
    monkeypatch.setattr(faiss_store, "CPUS", cpus)
    for here in cpus:
        monkeypatch.setattr(faiss_store, "current_cpu", lambda here=here: here)
        for n in range(1, 2 * len(cpus)):
            chosen = faiss_store.elsewhere(n)
            assert len(set(chosen)) == n
            cores = [cpus[i % len(cpus)] for i in chosen]
            elsewhere = sum(core != here for core in cores)
            assert cores[:elsewhere] == [c for c in cores if c != here]  # every other core's before this one's
            assert elsewhere == min(n, sum(1 for i in range(n + 1) if cpus[i % len(cpus)] != here))


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_a_split_scan_equals_one_scan_on_openmps_threads_and_on_the_workers(monkeypatch, metric):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4001, 300)).astype(np.float32)
    table = faiss_store.FaissTable(300, metric, settings=faiss_store.Settings(threads=3))
    table.append(x)
    q = rng.standard_normal((1, 300)).astype(np.float32)
    monkeypatch.setattr(faiss_store, "PACE", faiss_store.Pace())
    assert len(faiss_store.row_chunks(table.n, table.dim, 3)) == 3
    on_openmp = table.every_row(q)
    faiss_store.PACE.waiting = 1
    on_workers = table.every_row(q)
    assert faiss_store.PACE.waiting == 0
    single = faiss_store.FaissTable(300, metric, settings=faiss_store.Settings(threads=1))
    single.append(x)
    one = single.every_row(q)
    assert on_openmp.shape == one.shape == (1, 4001)
    assert np.array_equal(on_openmp, one) and np.array_equal(on_workers, one)  # each row's sum, whoever scans it


def crowded():
    return True


def test_a_small_scan_late_by_less_than_late_is_not_slow():
    pace, shape = faiss_store.Pace(crowded), (768, 770)
    pace.took(shape, 1e-4)
    for _ in range(pace.EVIDENCE):
        pace.took(shape, 1e-4 + 0.9 * pace.LATE)  # six times the fastest, but a wake-up's jitter
    assert pace.openmp()
    for _ in range(pace.EVIDENCE):
        pace.took(shape, 1e-4 + 1.1 * pace.LATE)
    assert not pace.openmp()


def test_scans_go_to_the_workers_after_three_slow_ones_close_together_and_back_later():
    pace, shape = faiss_store.Pace(crowded), (2304, 770)
    assert pace.EVIDENCE == 3
    pace.took(shape, 1.0)
    pace.took((768, 3074), 5.0)  # another shape's own fastest
    for _ in range(pace.WITHIN + 1):
        pace.took(shape, 1.0)
    pace.took(shape, 4.0)  # slow, alone: the cores are still taken to be free
    pace.took(shape, 4.0)  # two close together: a hiccup of the host, as a quiet machine has now and then
    assert pace.openmp()
    for _ in range(pace.WITHIN - 1):
        pace.took(shape, 1.0)
    pace.took(shape, 3.5)  # a third, but not within WITHIN scans of the first
    assert pace.openmp()
    pace.took(shape, 2.9)  # under SLOW times the fastest
    pace.took(shape, 3.1)
    assert pace.openmp()
    pace.took(shape, 3.1)  # three slow within WITHIN: another process has a core
    assert [pace.openmp() for _ in range(pace.BACK_OFF)] == [False] * pace.BACK_OFF
    assert pace.openmp()
    pace.took(shape, 0.5)  # a faster scan is the new fastest
    pace.took(shape, 1.6)
    pace.took(shape, 1.6)  # the slow scans before the back-off are not counted again
    assert pace.openmp()
    pace.took(shape, 1.6)
    assert not pace.openmp()


def test_slow_scans_while_no_thread_waits_for_a_core_are_the_hosts_and_no_evidence():
    runnable = [False]
    pace, shape = faiss_store.Pace(lambda: runnable[0]), (2304, 770)
    pace.took(shape, 1.0)
    for _ in range(10 * pace.EVIDENCE):
        pace.took(shape, 8.0)  # the host took the cores: the workers would wait as long
    assert pace.openmp()
    for crowded_then in (True, True, False, True, True):  # one slow scan with none waiting: the count starts again
        runnable[0] = crowded_then
        pace.took(shape, 8.0)
    assert pace.openmp()
    runnable[0] = True
    pace.took(shape, 8.0)
    assert not pace.openmp()


def test_a_back_off_soon_after_another_lasts_twice_as_long_up_to_longest():
    pace, shape = faiss_store.Pace(crowded), (2304, 770)
    pace.took(shape, 1.0)

    def back_off() -> int:  # three slow scans: how many scans then go to the workers
        for _ in range(pace.EVIDENCE):
            pace.took(shape, 4.0)
        n = 0
        while not pace.openmp():
            n += 1
        return n

    assert [back_off() for _ in range(3)] == [pace.BACK_OFF, 2 * pace.BACK_OFF, 4 * pace.BACK_OFF]
    for _ in range(pace.CALM):
        pace.took(shape, 1.0)
    assert back_off() == pace.BACK_OFF  # CALM scans without one: the process has gone: the first length again
    lengths = [back_off() for _ in range(16)]
    assert lengths[-1] == max(lengths) == pace.LONGEST


@pytest.mark.parametrize(
    ("stat", "crowded"),
    [("cpu 1 2 3\nprocs_running 3\nprocs_blocked 0\n", True), ("procs_running 2\n", False), (None, True)],
)
def test_crowded_when_more_threads_are_runnable_than_there_are_cores(tmp_path, monkeypatch, stat, crowded):
    path = tmp_path / "stat"
    if stat is not None:
        path.write_text(stat)
    monkeypatch.setattr(faiss_store, "PROC_STAT", str(path))
    monkeypatch.setattr(faiss_store.os, "cpu_count", lambda: 2)
    assert faiss_store.crowded_now() is crowded  # unknown (no /proc/stat): taken as crowded, as before


def test_a_core_the_process_may_no_longer_use_leaves_the_worker_free(monkeypatch):
    if not faiss_store.CPUS:
        pytest.skip("this OS does not let a thread be kept on a core")
    monkeypatch.setattr(faiss_store, "CPUS", [max(faiss_store.CPUS) + 4096])  # no such core
    monkeypatch.setattr(faiss_store, "_WORKERS", {})
    out = []
    faiss_store.in_threads([lambda: out.append(os.sched_getaffinity(0)), lambda: None])
    for worker in faiss_store._WORKERS.values():
        worker.stop()
    assert out == [os.sched_getaffinity(0)]  # ran, on the cores this thread has


def test_a_share_that_fails_on_a_worker_fails_the_scan_once_every_share_has_run():
    ran = []

    def fails():
        ran.append("worker")
        raise RuntimeError("share 0")

    with pytest.raises(RuntimeError, match="share 0"):
        faiss_store.in_threads([fails, lambda: ran.append("here")])
    assert sorted(ran) == ["here", "worker"]
    faiss_store.in_threads([lambda: ran.append("again"), lambda: None])  # the worker still takes shares
    assert ran.count("again") == 1


FORKED = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from vecgpt.backends import faiss as faiss_store

    store = faiss_store.connect(path=sys.argv[1], threads=2)
    rng = np.random.default_rng(0)
    store.create("m", 512, "l2")
    store.upsert("m", np.arange(4096), rng.standard_normal((4096, 512)).astype(np.float32))
    block = rng.standard_normal((64, 512)).astype(np.float32)  # 2^27 multiply-adds: OpenMP's threads
    before = store.search("m", block)
    pid = os.fork()
    if pid == 0:
        again = store.search("m", block)  # OpenMP's threads again
        one = store.search("m", block[:1])  # a one-query scan: split, and |x|^2 made here
        same = np.array_equal(again.ids, before.ids) and np.array_equal(one.ids, before.ids[:1])
        os._exit(0 if same and faiss_store.usable(2) == 1 else 3)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this OS")
def test_a_forked_child_searches_after_the_parent_ran_openmps_threads(tmp_path):
    # GNU OpenMP's threads do not survive a fork: without the store's fork handler the child waits forever.
    done = subprocess.run(
        [sys.executable, "-c", FORKED, str(tmp_path)], env=procs.env(), timeout=60, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("m", [1, 5])
def test_the_fixed_kernel_split_over_threads_equals_one_thread(metric, m):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4001, 300)).astype(np.float32)
    q = rng.standard_normal((m, 300)).astype(np.float32)
    got = []
    for threads in (1, 3):
        table = faiss_store.FaissTable(300, metric, settings=faiss_store.Settings("fixed", threads=threads))
        table.append(x)
        got.append(table.all_dists(q, None)[0])
    assert len(faiss_store.row_chunks(4001, 300 * m, 3, 32)) == 3
    assert all(a % 32 == 0 for a, _ in faiss_store.row_chunks(4001, 300 * m, 3, 32))
    assert np.array_equal(got[0], got[1]) and table.ran == "fixed"


@pytest.mark.parametrize("share", [0.3, 0.62, 0.75])
def test_the_calling_threads_share_moves_no_bit(monkeypatch, share):
    """The fixed kernel's rows go to the calling thread by a share that follows which thread finished last
    (faiss.Balance); each sum is its (query, row)'s, so any share gives one thread's bits."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4001, 300)).astype(np.float32)
    q = rng.standard_normal((5, 300)).astype(np.float32)
    alone = faiss_store.FaissTable(300, "ip", settings=faiss_store.Settings("fixed", threads=1))
    alone.append(x)
    monkeypatch.setattr(faiss_store, "BALANCE", faiss_store.Balance(share))
    split = faiss_store.FaissTable(300, "ip", settings=faiss_store.Settings("fixed", threads=2))
    split.append(x)
    assert np.array_equal(alone.all_dists(q, None)[0], split.all_dists(q, None)[0])
    chunks = faiss_store.row_chunks(4001, 300 * 5, 2, 32, share)
    assert chunks[0][0] == 0 and chunks[-1][1] == 4001 and chunks[0][1] == chunks[1][0] and chunks[1][0] % 32 == 0
    assert abs((4001 - chunks[1][0]) / 4001 - share) < 32 / 4001


def test_the_share_follows_the_thread_that_finished_last():
    balance = faiss_store.Balance()
    for _ in range(200):  # the worker's half always 30% later: the caller takes more, up to the bound
        balance.took(1.0, 1.3)
    assert balance.share == balance.high
    for _ in range(400):
        balance.took(1.3, 1.0)
    assert balance.share == balance.low
    steady = faiss_store.Balance(0.55)
    steady.took(1.0, 1.0)
    assert steady.share == 0.55
