"""The local turbopuffer server through the official client: shapes, limits, filters, errors."""

import base64
import concurrent.futures as cf
import gzip
import json
import urllib.error
import urllib.request

import numpy as np
import pytest

turbopuffer = pytest.importorskip("turbopuffer")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from vecgpt.backends.turbopuffer.server import Running  # noqa: E402


@pytest.fixture(scope="module")
def server():
    running = Running(max_top_k=50)
    yield running
    running.stop()


@pytest.fixture
def client(server, monkeypatch):
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    return turbopuffer.Turbopuffer(api_key="local", base_url=server.url, max_retries=0)


def test_write_forms_and_exact_float32_distances(client):
    ns = client.namespace("forms")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    ns.write(
        upsert_rows=[{"id": i, "vector": x[i].tolist(), "g": i % 2} for i in range(3)],  # client sends base64
        distance_metric="euclidean_squared",
    )
    ns.write(
        upsert_columns={
            "id": [3, 4, 5],
            "vector": [base64.b64encode(v.tobytes()).decode() for v in x[3:]],
            "g": [1, 0, 1],
        }
    )
    q = rng.standard_normal(5).astype(np.float32)
    res = ns.query(rank_by=("vector", "kNN", q.tolist()), top_k=10, filters=["g", "In", [0, 1]])
    got = {r.id: r["$dist"] for r in res.rows}
    want = ((x.astype(np.float64) - q.astype(np.float64)) ** 2).sum(1).astype(np.float32)
    assert sorted(got) == list(range(6))
    assert all(got[i] == float(want[i]) for i in range(6))  # the exact distance, rounded to float32 once
    assert [r.id for r in res.rows] == list(np.argsort(want, kind="stable"))
    assert ns.metadata().approx_row_count == 6
    assert ns.schema()["vector"].type == "[5]f32"


def test_filters_multi_query_and_deletes(client):
    ns = client.namespace("filters")
    ids = list(range(20))
    ns.write(
        upsert_columns={
            "id": ids,
            "vector": [[float(i), 0.0] for i in ids],
            "a": [i % 4 for i in ids],
            "s": ["x" if i < 10 else "y" for i in ids],
        },
        distance_metric="euclidean_squared",
    )

    def ask(f):
        return sorted(r.id for r in ns.query(rank_by=("vector", "kNN", [0.0, 0.0]), top_k=50, filters=f).rows)

    assert ask(["a", "Eq", 1]) == [1, 5, 9, 13, 17]
    assert ask(["And", [["a", "In", [1, 2]], ["id", "Lt", 6]]]) == [1, 2, 5]
    assert ask(["Or", [["id", "Lte", 1], ["id", "Gte", 18]]]) == [0, 1, 18, 19]
    assert ask(["And", [["id", "Gt", 16], ["s", "Eq", "y"], ["Not", ["a", "Eq", 3]]]]) == [17, 18]
    out = ns.multi_query(
        queries=[
            {"rank_by": ("vector", "kNN", [3.0, 0.0]), "top_k": 2, "filters": ["a", "Eq", 3]},
            {"rank_by": ("vector", "ANN", [0.0, 0.0]), "top_k": 1},
        ]
    )
    assert [[r.id for r in res.rows] for res in out.results] == [[3, 7], [0]]
    ns.write(deletes=[0, 1])
    assert ask(["id", "Lt", 3]) == [2]


def test_limits_and_errors(client, server):
    ns = client.namespace("limits")
    ns.write(upsert_rows=[{"id": 1, "vector": [1.0, 2.0]}], distance_metric="euclidean_squared")
    q = ("vector", "kNN", [0.0, 0.0])
    with pytest.raises(turbopuffer.BadRequestError, match="require"):
        ns.query(rank_by=q, top_k=1)  # kNN without a filter
    with pytest.raises(turbopuffer.BadRequestError, match="exceeds"):
        ns.query(rank_by=q, top_k=51, filters=["id", "Gte", 0])  # this server was started with max_top_k=50
    with pytest.raises(turbopuffer.BadRequestError, match="at most 16"):
        ns.multi_query(queries=[{"rank_by": ("vector", "ANN", [0.0, 0.0]), "top_k": 1}] * 17)
    with pytest.raises(turbopuffer.RateLimitError, match="slots"):  # 9 kNN subqueries want 18 of 16 slots
        ns.multi_query(queries=[{"rank_by": q, "top_k": 1, "filters": ["id", "Gte", 0]}] * 9)
    with pytest.raises(turbopuffer.BadRequestError, match="dimension"):
        ns.write(upsert_rows=[{"id": 2, "vector": [1.0, 2.0, 3.0]}])
    with pytest.raises(turbopuffer.BadRequestError, match="10752"):
        client.namespace("wide").write(
            upsert_rows=[{"id": 1, "vector": [0.0] * 10753}], distance_metric="euclidean_squared"
        )
    with pytest.raises(turbopuffer.BadRequestError, match="namespace name"):
        client.namespace("bad name!").write(upsert_rows=[{"id": 1}])
    with pytest.raises(turbopuffer.NotFoundError):
        client.namespace("nowhere").query(rank_by=q, top_k=1, filters=["id", "Gte", 0])
    assert client.namespace("nowhere").exists() is False and ns.exists() is True
    ns.delete_all()
    assert not ns.exists()
    server.server.api_key = "right"
    try:
        with pytest.raises(turbopuffer.AuthenticationError):
            turbopuffer.Turbopuffer(api_key="wrong", base_url=server.url, max_retries=0).namespace("x").metadata()
    finally:
        server.server.api_key = None


def test_concurrency_limit_queues_then_refuses(server, client):
    ns = client.namespace("busy")
    ns.write(upsert_rows=[{"id": 1, "vector": [1.0]}], distance_metric="euclidean_squared")
    server.server.latency = 0.3  # the delay comes before the slots are taken; the query itself is quick
    sub = {"rank_by": ("vector", "kNN", [0.0]), "top_k": 1, "filters": ["id", "Gte", 0]}
    try:
        with cf.ThreadPoolExecutor(4) as pool:  # 4 x 8 kNN subqueries = 64 slots wanted at once: some wait, none fail
            results = list(pool.map(lambda _: ns.multi_query(queries=[sub] * 8), range(4)))
        assert all(len(r.results) == 8 for r in results)
    finally:
        server.server.latency = 0.0
    assert server.server.stats["peak_slots"] <= 16


def test_gzip_bodies_query_strings_and_branching(server, client):
    body = gzip.compress(
        json.dumps({"upsert_rows": [{"id": 7, "vector": [0.5, 0.5]}], "distance_metric": "euclidean_squared"}).encode()
    )
    req = urllib.request.Request(
        f"{server.url}/v2/namespaces/gz?stainless_overload=x",
        data=body,
        method="POST",
        headers={"Authorization": "Bearer k", "Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    assert json.loads(urllib.request.urlopen(req).read())["rows_upserted"] == 1
    zipped = turbopuffer.Turbopuffer(api_key="k", base_url=server.url, max_retries=0, compression=True)
    zipped.namespace("gz").write(upsert_rows=[{"id": i, "vector": [0.1 * i, 0.0]} for i in range(100)])
    client.namespace("gz-branch").branch_from(source_namespace="gz")
    assert client.namespace("gz-branch").metadata().approx_row_count == 100  # id 7 was overwritten
    names = [n.id for n in client.namespaces(prefix="gz")]
    assert names == ["gz", "gz-branch"]


def test_cli_registers_subcommands():
    from vecgpt import cli

    root = cli.parser()
    args = root.parse_args(["tpuf-local", "--port", "1", "--latency-ms", "25"])
    assert args.latency_ms == 25 and callable(args.func)
    assert root.parse_args(["tpuf-gc", "--remove"]).remove


def test_float32_mode_accumulates_dimension_by_dimension(client, server):
    """`--float32`: each distance is a float32 sum taken in dimension order, the same on every CPU (every
    step is one correctly rounded float32 operation); it differs from the float64-then-round default."""
    ns = client.namespace("f32")
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((40, 300)) * 4).astype(np.float32)
    ns.write(upsert_columns={"id": list(range(40)), "vector": x.tolist()}, distance_metric="euclidean_squared")
    q = rng.standard_normal(300).astype(np.float32)
    want = np.zeros(40, np.float32)
    for j in range(300):
        diff = x[:, j] - q[j]
        want += diff * diff
    server.server.float32 = True
    try:
        rows = ns.query(rank_by=("vector", "kNN", q.tolist()), top_k=50, filters=["id", "Gte", 0]).rows
    finally:
        server.server.float32 = False
    got = np.array([r["$dist"] for r in sorted(rows, key=lambda r: r.id)], np.float32)
    np.testing.assert_array_equal(got, want)
    once = ((x.astype(np.float64) - q.astype(np.float64)) ** 2).sum(1).astype(np.float32)
    assert (got != once).any()


def test_write_returns_after_its_commit_latency(client, server):
    import time

    ns = client.namespace("slow-commit")
    server.server.write_latency = 0.2
    try:
        start = time.perf_counter()
        ns.write(upsert_rows=[{"id": 1, "vector": [1.0]}], distance_metric="euclidean_squared")
        took = time.perf_counter() - start
    finally:
        server.server.write_latency = 0.0
    assert took >= 0.2  # a lower bound: the reply waits for the commit
    assert [r.id for r in ns.query(rank_by=("vector", "kNN", [0.0]), top_k=1, filters=["id", "Gte", 0]).rows] == [1]


def test_listing_can_lag_or_be_forbidden(client, server):
    client.namespace("list-old").write(upsert_rows=[{"id": 1}])
    server.server.born["list-old"] -= 120  # made two minutes ago
    server.server.list_lag = 60.0  # the listing shows the namespaces of a minute ago (the docs: not consistent)
    try:
        client.namespace("list-new").write(upsert_rows=[{"id": 1}])
        client.namespace("list-old").delete_all()
        assert [n.id for n in client.namespaces(prefix="list-")] == ["list-old"]  # gone, still listed; new, missing
    finally:
        server.server.list_lag = 0.0
    server.server.list_forbidden = True
    try:
        with pytest.raises(turbopuffer.PermissionDeniedError):
            list(client.namespaces(prefix="list-"))
    finally:
        server.server.list_forbidden = False
    assert [n.id for n in client.namespaces(prefix="list-")] == ["list-new"]


def test_index_lag_shows_in_metadata_and_query_performance(client, server):
    ns = client.namespace("lagging")
    server.server.index_lag = 60.0
    try:
        ns.write(upsert_rows=[{"id": i, "vector": [float(i)]} for i in range(5)], distance_metric="euclidean_squared")
        index = ns.metadata().index
        assert (index.status, index.unindexed_rows) == ("updating", 5)
        res = ns.query(rank_by=("vector", "ANN", [0.0]), top_k=2)
        assert res.performance.exhaustive_search_count == 5  # unindexed rows are scanned exhaustively
        server.server.namespaces["lagging"].indexed_at = 0.0  # the index catches up
        assert ns.metadata().index.status == "up-to-date"
        assert ns.query(rank_by=("vector", "ANN", [0.0]), top_k=2).performance.exhaustive_search_count == 0
    finally:
        server.server.index_lag = 0.0


def test_injected_faults_are_seeded_and_a_dropped_write_has_landed(client, server):
    from vecgpt.backends.turbopuffer.server.faults import Faults

    ns = client.namespace("faulty")
    ns.write(upsert_rows=[{"id": 0, "vector": [0.0]}], distance_metric="euclidean_squared")
    errors = []
    server.server.faults = Faults(0.5, seed=3)
    try:
        for _ in range(40):  # one at a time: the seeded draws come in a fixed order
            try:
                ns.metadata()
                errors.append(None)
            except turbopuffer.APIError as e:
                errors.append(type(e).__name__)
        server.server.faults = Faults(0.999, seed=0, kinds=("drop",))
        with pytest.raises(turbopuffer.APIConnectionError):
            ns.write(upsert_rows=[{"id": 7, "vector": [7.0]}])
    finally:
        server.server.faults = Faults()
    assert {"RateLimitError", "InternalServerError", "APIConnectionError", None} == set(errors)
    draws = Faults(0.5, seed=3)
    kinds = {None: None, "429": "RateLimitError", "500": "InternalServerError", "drop": "APIConnectionError"}
    assert errors == [kinds[draws.draw()] for _ in range(40)]
    assert 7 in server.server.namespaces["faulty"].slot_of  # committed; only the reply was lost


def test_cli_errors_are_one_line(server, capsys):
    import socket

    from vecgpt.cli import main

    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("127.0.0.1", server.port))
        pytest.skip("this system lets a second socket bind a listening port")
    except OSError:
        pass
    finally:
        probe.close()
    assert main(["tpuf-local", "--port", str(server.port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vecgpt: error: cannot listen on 127.0.0.1:") and err.count("\n") == 1
    assert main(["tpuf-local", "--fail-rate", "1.5"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_python_dash_m_runs_the_server_module():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "vecgpt.backends.turbopuffer.server", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--latency-ms" in out and "--fail-rate" in out


def _held(ns) -> dict:
    return {r.id: r.to_dict() for r in ns.query(rank_by=("id", "asc"), top_k=50, include_attributes=True).rows}


def test_conditional_writes_and_patches_as_documented(client):
    """The write page: a condition is evaluated against the document as it is; an upsert to an id not held is
    applied unconditionally, a patch to one ignored, and a delete_condition sees every $ref_new as null."""
    ns = client.namespace("cond")
    ns.write(upsert_rows=[{"id": "a", "v": 1, "doc": "x"}], schema={"doc": {"type": "string", "filterable": False}})
    out = ns.write(upsert_rows=[{"id": "a", "v": 9}, {"id": "b", "v": 9}], upsert_condition=["v", "Eq", 2])
    assert (out.rows_upserted, out.rows_affected) == (1, 1)  # b is new: written although v is not 2
    assert _held(ns) == {"a": {"id": "a", "v": 1, "doc": "x"}, "b": {"id": "b", "v": 9}}
    out = ns.write(upsert_rows=[{"id": "a", "v": 2}], upsert_condition=["v", "Lt", {"$ref_new": "v"}])
    assert out.rows_upserted == 1 and _held(ns)["a"] == {"id": "a", "v": 2}  # an upsert replaces the document
    out = ns.write(upsert_rows=[{"id": "a", "v": 5}, {"id": "c", "v": 1}], upsert_condition=["id", "Eq", None])
    assert out.rows_upserted == 1 and _held(ns)["a"]["v"] == 2 and "c" in _held(ns)  # only creates
    out = ns.write(patch_rows=[{"id": "a", "doc": "p"}, {"id": "zz", "doc": "p"}], patch_condition=["v", "Eq", 2])
    assert out.rows_patched == 1 and _held(ns)["a"] == {"id": "a", "v": 2, "doc": "p"} and "zz" not in _held(ns)
    assert ns.write(patch_rows=[{"id": "a", "doc": "q"}], patch_condition=["v", "Eq", 5]).rows_patched == 0
    assert ns.write(deletes=["a"], delete_condition=["v", "Eq", {"$ref_new": "v"}]).rows_deleted == 0  # v == null
    assert ns.write(deletes=["a", "nope"], delete_condition=["v", "Eq", 2]).rows_deleted == 1
    assert sorted(_held(ns)) == ["b", "c"]
    with pytest.raises(turbopuffer.BadRequestError, match="patched"):
        client.namespace("forms").write(patch_rows=[{"id": 1, "vector": [0.0] * 5}])
    with pytest.raises(turbopuffer.BadRequestError, match="more than once"):  # the write page: a 400
        ns.write(upsert_rows=[{"id": "b", "v": 1}, {"id": "b", "v": 2}])


def test_attribute_sizes_and_unfilterable_attributes(client):
    ns = client.namespace("sizes")
    with pytest.raises(turbopuffer.BadRequestError, match="4096"):  # a filterable value: 4 KiB
        ns.write(upsert_rows=[{"id": 1, "s": "x" * 5000}])
    ns.write(upsert_rows=[{"id": 1, "s": "x" * 5000}], schema={"s": {"type": "string", "filterable": False}})
    with pytest.raises(turbopuffer.BadRequestError, match="8388608"):
        ns.write(upsert_rows=[{"id": 2, "s": "x" * (8 * 2**20 + 1)}])
    with pytest.raises(turbopuffer.BadRequestError, match="not filterable"):
        ns.query(rank_by=("id", "asc"), top_k=1, filters=["s", "Eq", "x"])
    ns.write(upsert_rows=[{"id": 3, "f": [0.1, -0.0]}], schema={"f": {"type": "[]float", "filterable": False}})
    assert ns.schema()["f"].type == "[]float" and _held(ns)[3]["f"] == [0.1, -0.0]


def test_branch_and_copy_are_independent_and_pay_the_commit(client, server):
    import time

    src = client.namespace("cow")
    schema = {"p": {"type": "[]float", "filterable": False}}
    rows = [{"id": i, "vector": [float(i)], "p": [i + 0.5]} for i in range(3)]
    src.write(upsert_rows=rows, distance_metric="euclidean_squared", schema=schema)
    server.server.write_latency = 0.2
    try:
        for how in ("branch", "copy"):
            start = time.perf_counter()
            getattr(client.namespace(f"cow-{how}"), f"{how}_from")(source_namespace="cow")
            assert time.perf_counter() - start >= 0.2  # a write like any other: it returns once committed
    finally:
        server.server.write_latency = 0.0
    client.namespace("cow-branch").write(upsert_rows=[{"id": 0, "vector": [9.0], "p": [9.5]}], deletes=[1])
    src.write(patch_rows=[{"id": 2, "p": [7.5]}], upsert_rows=[{"id": 5, "vector": [5.0]}])
    assert {i: r["p"] for i, r in _held(client.namespace("cow-branch")).items()} == {0: [9.5], 2: [2.5]}
    assert {i: r.get("p") for i, r in _held(client.namespace("cow-copy")).items()} == {0: [0.5], 1: [1.5], 2: [2.5]}
    assert {i: r.get("p") for i, r in _held(src).items()} == {0: [0.5], 1: [1.5], 2: [7.5], 5: None}


def test_float32_scans_follow_every_write_and_add_one_dimension_at_a_time(monkeypatch):
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    running = Running(float32=True)
    try:
        ns = turbopuffer.Turbopuffer(api_key="local", base_url=running.url, max_retries=0).namespace("f32")
        rng = np.random.default_rng(4)
        x = (rng.standard_normal((30, 7)) * np.logspace(-3, 3, 7)).astype(np.float32)
        q = rng.standard_normal(7).astype(np.float32)

        def distances():  # every row (kept by dimension once), then a part of them (taken from the rows)
            every = ns.query(rank_by=("vector", "kNN", q.tolist()), top_k=50, filters=["id", "Gte", 0]).rows
            part = ns.query(rank_by=("vector", "kNN", q.tolist()), top_k=50, filters=["id", "Lt", 10]).rows
            got = {r.id: r["$dist"] for r in every}
            assert {r.id: r["$dist"] for r in part} == {i: d for i, d in got.items() if i < 10}
            return got

        def sequential(rows):  # float32, dimension after dimension
            acc = np.zeros(len(rows), np.float32)
            for j in range(rows.shape[1]):
                acc += (rows[:, j] - q[j]) * (rows[:, j] - q[j])
            return acc

        ns.write(upsert_columns={"id": list(range(30)), "vector": x.tolist()}, distance_metric="euclidean_squared")
        assert distances() == dict(enumerate(sequential(x).tolist()))
        x[3] = x[4] * 2
        ns.write(upsert_rows=[{"id": 3, "vector": x[3].tolist()}])
        ns.write(deletes=[7])
        assert distances() == {i: d for i, d in enumerate(sequential(x).tolist()) if i != 7}
    finally:
        running.stop()


def test_bodies_are_read_whole_and_refused_past_the_limit(server, client, monkeypatch):
    """A body over MAX_BODY (here 2,000 bytes), sent plain or gzip, is 413 once it has been read to its end (the
    client gets the reply, not a broken connection); bad gzip and NaN are 400."""
    from vecgpt.backends.turbopuffer.server import bodies

    monkeypatch.setattr(bodies, "MAX_BODY", 2_000)
    ns = client.namespace("body-limit")
    rows = [{"id": i, "vector": [0.5] * 8} for i in range(40)]
    with pytest.raises(turbopuffer.APIStatusError, match="exceeds 2000") as plain:
        ns.write(upsert_rows=rows, distance_metric="euclidean_squared")
    zipped = turbopuffer.Turbopuffer(api_key="k", base_url=server.url, max_retries=0, compression=True)
    with pytest.raises(turbopuffer.APIStatusError, match="unpacks to more than 2000") as packed:
        zipped.namespace("body-limit").write(upsert_rows=rows * 5, distance_metric="euclidean_squared")
    assert plain.value.status_code == packed.value.status_code == 413
    ns.write(upsert_rows=rows[:2], distance_metric="euclidean_squared")
    assert ns.metadata().approx_row_count == 2

    def post(body: bytes, encoding: str = "identity"):
        req = urllib.request.Request(
            f"{server.url}/v2/namespaces/body-limit",
            data=body,
            method="POST",
            headers={"Authorization": "Bearer k", "Content-Encoding": encoding},
        )
        try:
            urllib.request.urlopen(req)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["error"]

    assert post(gzip.compress(b'{"deletes": [1]}')[:-6], "gzip") == (400, "the body is not valid gzip")
    assert post(b'{"upsert_rows": [{"id": 3, "vector": [NaN]}]}') == (400, "the body is not valid JSON")


def test_the_printed_address_takes_connections_before_uvicorn_runs():
    """serve prints the address and then starts uvicorn; a client that connects in between (CI once did, loaded)
    must wait in the backlog, not be refused by a socket only bound."""
    from procs import connected

    from vecgpt.backends.turbopuffer.server import listen

    connected(listen("127.0.0.1", 0))
