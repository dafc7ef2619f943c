"""turbopuffer's load writes in the background (vecgpt/backends/turbopuffer/loads.py): writes of the same ids in
the order given, others at once, the byte budget kept, the first failure raised by wait; a load through it."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import pytest

from vecgpt.backends.turbopuffer.loads import Background
from vecgpt.errors import VecgptError


def test_each_collection_in_order_collections_at_once():
    loads, done, lock = Background(workers=4, max_bytes=10**9), [], threading.Lock()
    running, most = [0], [0]

    def write(name, i):
        def run():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.01)
            with lock:
                running[0] -= 1
                done.append((name, i))

        return run

    for i in range(5):
        for name in "abcd":
            loads.submit(name, (0, 9), 1, write(name, i))
    loads.wait()
    loads.close()
    for name in "abcd":
        assert [i for n, i in done if n == name] == list(range(5))
    assert most[0] > 1  # collections overlapped


def test_disjoint_ids_of_one_collection_go_at_once_overlapping_ones_in_order():
    loads, done, lock = Background(workers=4, max_bytes=10**9), [], threading.Lock()
    gate = threading.Barrier(2, timeout=5)

    def meet(tag):  # the two disjoint writes must run together to pass the barrier
        def run():
            gate.wait()
            with lock:
                done.append(tag)

        return run

    loads.submit("a", (0, 4095), 1, meet("first"))
    loads.submit("a", (4096, 8191), 1, meet("second"))
    loads.submit("a", (4000, 4100), 1, lambda: done.append("overlapping"))
    loads.wait()
    loads.close()
    assert done[-1] == "overlapping" and sorted(done[:2]) == ["first", "second"]


def test_byte_budget_bounds_what_is_held():
    loads, held, top, lock = Background(workers=8, max_bytes=30), [0], [0], threading.Lock()

    def write():
        with lock:
            held[0] += 10
            top[0] = max(top[0], held[0])
        time.sleep(0.01)
        with lock:
            held[0] -= 10

    for i in range(12):
        loads.submit(f"c{i}", (0, 0), 10, write)
    loads.submit("big", (0, 0), 100, lambda: None)  # larger than the budget: goes alone
    loads.wait()
    loads.close()
    assert top[0] <= 30


def test_first_failure_raised_and_the_collection_stops():
    loads, ran = Background(workers=2, max_bytes=10**9), []

    def fail():
        raise RuntimeError("write refused")

    loads.submit("a", (0, 9), 1, fail)
    loads.submit("a", (5, 20), 1, lambda: ran.append("a later"))
    loads.submit("b", (0, 9), 1, lambda: ran.append("b"))
    with pytest.raises(RuntimeError, match="write refused"):
        loads.wait()
    loads.wait()  # nothing queued since: returns
    loads.close()
    assert ran == ["b"]


def test_a_load_writes_in_the_background_and_a_failed_write_leaves_no_manifest(make_store, tiny_model, monkeypatch):
    from vecgpt.loading import collection, plan, push, store_fingerprint

    store = make_store("turbopuffer")
    key = push(store, tiny_model, "l2", progress=False, layout="five")["fingerprint"]
    assert store._loads is None  # the load's background is gone with it
    assert store.count(f"{key}.wte") == tiny_model.hparams.n_vocab
    wanted = {collection(key, name) for name, _, _ in plan(tiny_model, "l2", "five")}
    assert wanted <= set(make_store("turbopuffer").collections())  # the catalog, as another connection reads it

    fresh = make_store("turbopuffer", prefix=store.prefix + "f-")
    real = fresh._write_rows

    def refuse(ns, columns):
        if ns.endswith(".h.1.mlp.c_fc"):
            raise VecgptError("write refused")
        real(ns, columns)

    monkeypatch.setattr(fresh, "_write_rows", refuse)
    with pytest.raises(VecgptError, match="write refused"):
        push(fresh, tiny_model, "l2", progress=False, layout="five")
    assert fresh._loads is None
    assert fresh.read_manifest(store_fingerprint(tiny_model, "l2", "five")) is None


def test_a_write_after_one_of_its_ids_failed_does_not_run_however_soon_it_failed():
    loads, ran = Background(workers=2, max_bytes=10**9), []

    def fail():
        raise RuntimeError("write refused")

    loads.submit("a", (0, 9), 1, fail)
    futures.wait(loads.futures)  # the failed write is done before the next of its ids comes
    loads.submit("a", (5, 20), 1, lambda: ran.append("a later"))
    with pytest.raises(RuntimeError, match="write refused"):
        loads.wait()
    loads.close()
    assert ran == []
