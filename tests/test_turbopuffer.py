"""The turbopuffer adapter beyond the conformance suite: splitting, concurrency, round trips, errors, cost."""

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("turbopuffer")
pytest.importorskip("starlette")

from vecgpt import tokenizer  # noqa: E402
from vecgpt.api import generate  # noqa: E402
from vecgpt.backends import turbopuffer as tpb  # noqa: E402
from vecgpt.backends.base import Search, Where, tally  # noqa: E402
from vecgpt.backends.turbopuffer.server import Running  # noqa: E402
from vecgpt.engine import Engine  # noqa: E402
from vecgpt.errors import TextConflict, VecgptError  # noqa: E402
from vecgpt.loading import plan, push, text_row  # noqa: E402
from vecgpt.weights import HParams  # noqa: E402

LIVE_KEY = os.environ.get("TURBOPUFFER_API_KEY")  # read at import, before the local setup sets a dummy one
rng = np.random.default_rng(3)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_server():
    # float32 accumulation, as the shared test server: a distance over d <= 8 positive terms is then within
    # (d + 2) * 2^-24 < 1e-6 relative of the exact one (each difference, square and sum rounds once)
    running = Running(max_top_k=50, float32=True)
    yield running
    running.stop()


@pytest.fixture
def local(monkeypatch):
    monkeypatch.setenv("TURBOPUFFER_API_KEY", "local")
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    opened = []

    def make(url, **kw):
        kw = {"max_top_k": 50, "prefix": f"u{uuid.uuid4().hex[:8]}-", "max_retries": 0, **kw}  # 50: small_server's rows
        store = tpb.connect(base_url=url, **kw)
        opened.append(store)
        return store

    yield make
    for s in opened:
        s.close()


def truth(q, x):
    return ((q.astype(np.float64)[:, None] - x.astype(np.float64)[None]) ** 2).sum(-1)


def test_more_rows_than_a_query_returns_are_split_by_id_range(small_server, local):
    store = local(small_server.url)
    x = rng.standard_normal((237, 8)).astype(np.float32)
    store.create("big", 8, "l2", ("row",))
    store.upsert("big", np.arange(237), x, {"row": np.arange(237)})
    q = rng.standard_normal((3, 8)).astype(np.float32)
    hits = store.search("big", q)
    assert hits.ids.shape == (3, 237)
    order = np.argsort(hits.ids, axis=1)
    np.testing.assert_allclose(np.take_along_axis(hits.dists, order, 1), truth(q, x), rtol=1e-6)
    top = store.search("big", q, k=70)  # more than one query may return
    assert top.ids.tolist() == np.argsort(truth(q, x), axis=1)[:, :70].tolist()
    part = store.search("big", q, where=Where(ge={"row": 100}))
    assert sorted(part.ids[0].tolist()) == list(range(100, 237))
    assert small_server.server.stats["status_400"] == 0


def test_many_subqueries_never_hit_the_concurrency_limit(small_server, local):
    store = local(small_server.url, replicas=2)
    x = rng.standard_normal((40, 6)).astype(np.float32)
    store.create("m", 6, "l2", ("row",))
    store.upsert("m", np.arange(40), x, {"row": np.arange(40)})
    small_server.server.latency = 0.05
    try:
        q = rng.standard_normal((45, 6)).astype(np.float32)
        many = store.search_many([Search("m", q), Search("m", q[:5], k=3)])
    finally:
        small_server.server.latency = 0.0
    assert many[0].ids.shape == (45, 40) and many[1].ids.shape == (5, 3)
    assert small_server.server.stats["429"] == 0 and small_server.server.stats["peak_slots"] <= 16
    np.testing.assert_allclose(np.sort(many[0].dists, 1), np.sort(truth(q, x), 1), rtol=1e-6)


def test_text_keys_live_in_one_namespace_per_head_and_go_away(local, small_server):
    store = local(small_server.url)
    store.create("text-0123abcd", 4, "l2", ("layer", "head", "position"))
    n = 24
    attrs = {"layer": np.zeros(n, int), "head": np.arange(n) % 3, "position": np.arange(n) // 3}
    store.upsert("text-0123abcd", np.arange(n), rng.standard_normal((n, 4)).astype(np.float32), attrs)
    spaces = store._owned("text-0123abcd")
    assert len(spaces) == 3 * 2 and set(spaces) <= set(small_server.server.namespaces)  # 3 heads x 2 copies
    hits = store.search(
        "text-0123abcd", np.zeros((1, 4), np.float32), where=Where(eq={"layer": 0, "head": 1}, lt={"position": 5})
    )
    assert sorted(hits.ids[0].tolist()) == [1, 4, 7, 10, 13]
    assert store.count("text-0123abcd") == n
    assert [t["text"] for t in store.leftover_texts()] == ["text-0123abcd"]
    store.drop("text-0123abcd")
    assert store._owned("text-0123abcd") == [] and store.leftover_texts() == []
    assert not [n for n in small_server.server.namespaces if n.startswith(store.prefix + "text-")]


def test_multi_layer_key_upsert_is_one_write_per_head_namespace(local, small_server):
    store = local(small_server.url)
    store.create("text-0badcafe", 4, "l2", ("layer", "head", "position"))
    L, H = 3, 4  # one decode step's keys: every layer x head, in one upsert
    layer, head = np.repeat(np.arange(L), H), np.tile(np.arange(H), L)
    ids = (layer * H + head) * 100 + 7
    x = rng.standard_normal((L * H, 4)).astype(np.float32)
    before = store.usage["write_requests"]
    store.upsert("text-0badcafe", ids, x, {"layer": layer, "head": head, "position": np.full(L * H, 7)})
    # each head's namespace and its copy, in parallel, after one catalog write naming the new heads
    assert store.usage["write_requests"] - before == H * 2 + 1
    before = store.usage["write_requests"]
    store.upsert("text-0badcafe", ids, x, {"layer": layer, "head": head, "position": np.full(L * H, 7)})
    assert store.usage["write_requests"] - before == H * 2  # the heads are known: no catalog write
    spaces = store._owned("text-0badcafe")
    assert len(spaces) == H * 2 and all(store._rows(ns) == L for ns in spaces)  # a head's keys of every layer
    hits = store.search(
        "text-0badcafe", x[[2 * H + 1]], k=1, where=Where(eq={"layer": 2, "head": 1}, lt={"position": 8})
    )
    assert hits.ids[0].tolist() == [(2 * H + 1) * 100 + 7]
    store.drop("text-0badcafe")


@pytest.mark.parametrize("layout", ["four", "three"])
def test_a_tokens_key_write_is_billed_as_the_estimate_counts(local, small_server, layout):
    hp = HParams(n_layer=3, n_head=4, n_embd=768, n_ctx=8, n_vocab=10)  # a head's rows over the 10 KB minimum
    dim, width = text_row(hp, layout)
    store = local(small_server.url)
    store.create("text-0badcafe", dim, "l2", ("layer", "head", "position"), payload=width)
    L, H = hp.n_layer, hp.n_head
    layer, head = np.repeat(np.arange(L), H), np.tile(np.arange(H), L)
    rows = {"layer": layer, "head": head, "position": np.full(L * H, 7)}
    vectors, payload = (rng.standard_normal((L * H, w)).astype(np.float32) for w in (dim, width))
    store.upsert("text-0badcafe", (layer * H + head) * 8 + 7, vectors, rows, payload)  # names the heads first
    before = store.usage["billed_written"]
    store.upsert("text-0badcafe", (layer * H + head) * 8 + 6, vectors, {**rows, "position": np.full(L * H, 6)}, payload)
    billed = store.usage["billed_written"] - before
    assert billed == H * tpb.cost.key_write_bytes(L, (dim, width), copies=2)
    assert billed > H * 2 * tpb.PRICES["min_write_bytes"]  # more than the minimum the estimate used to count
    store.drop("text-0badcafe")


def test_engine_round_trips_over_http(make_store, tiny_model):
    store = make_store("turbopuffer")
    push(store, tiny_model, "l2", progress=False)
    text = Engine(store).open()
    generate(text, tokenizer.encode("To be or not to be, that is"), 3, stop=False)
    summary = text.meter.summary()
    text.close()
    L, H = tiny_model.hparams.n_layer, tiny_model.hparams.n_head
    decode = summary["per_token"][1]
    assert decode["round_trips"] == 4 * L + 1  # c_proj of attention rides with the key search, per head; the next
    # token's rows ride with the token search
    assert decode["by_kind"]["key_search"] == L * H  # one single-subquery request per head, all in one round
    # the token's keys in two upserts (engine.write_points: the first half's layers, then the rest), from the writer
    # thread (no round trip): each a write per head namespace and its copy; two queued while the thread had not yet
    # sent the first go out as one
    assert decode["by_kind"]["key_write"] in (H * 2, 2 * H * 2)
    layers = [(f"h.{i}.attn.c_attn", 1, 8, 64) for i in range(L)]
    assert tpb.cost.token_cost(layers, H, (8, 8), 2)["writes"] == 2 * H * 2  # the estimate counts both upserts
    assert [tpb.cost.write_parts(n) for n in (1, 2, 12, 48)] == [[1], [1, 1], [6, 6], [24, 24]]
    # the block: per layer c_attn, projections, the key search of its own keys once written, c_fc, c_proj
    assert summary["per_token"][0]["round_trips"] == 1 + 1 + 5 * L + 1
    assert 0 < summary["per_token"][0]["by_kind"]["wait"] <= L


def test_errors_are_one_line_and_never_show_the_key(small_server, local, monkeypatch):
    store = local(small_server.url)
    with pytest.raises(VecgptError, match="no collection"):
        store.search("missing", np.zeros((1, 3), np.float32))
    with pytest.raises(VecgptError, match="cannot rank by .ip."):
        store.create("x", 3, "ip")
    small_server.server.api_key = "the-right-key"
    monkeypatch.setenv("TURBOPUFFER_API_KEY", "sekrit-wrong-key")
    try:
        with pytest.raises(VecgptError) as err:
            tpb.connect(base_url=small_server.url, prefix="p-", max_retries=0, max_top_k=50).collections()
    finally:
        small_server.server.api_key = None
    assert "401" in str(err.value) and "sekrit" not in str(err.value) and "\n" not in str(err.value)
    monkeypatch.delenv("TURBOPUFFER_API_KEY")
    with pytest.raises(VecgptError, match="TURBOPUFFER_API_KEY"):
        tpb.connect(base_url=small_server.url)


def test_dry_run_estimate(tiny_model):
    text = tpb.estimate_cost(plan(tiny_model, "l2"))
    docs = sum(n for _, n, _ in plan(tiny_model, "l2"))
    assert f"{docs:,} documents" in text and "$" in text and "a month" in text and "per generated token" in text


def test_gc_command_lists_and_removes_leftover_texts(small_server, local, tmp_path, capsys):
    from vecgpt.backends.turbopuffer import gc

    store = local(small_server.url)
    store.create("text-deadbeef", 4, "l2", ("layer", "head", "position"))
    store.upsert(
        "text-deadbeef",
        np.arange(2),
        np.ones((2, 4), np.float32),
        {"layer": np.zeros(2, int), "head": np.zeros(2, int), "position": np.arange(2)},
    )
    config = tmp_path / "tp.toml"
    config.write_text(
        f'backend = "turbopuffer"\n[store]\nbase_url = "{small_server.url}"\nprefix = "{store.prefix}"\nmax_top_k = 50\n'
    )

    class Args:
        remove, older_than = False, 0.0

    Args.config = str(config)
    assert gc.run(Args) == 0
    assert "text-deadbeef" in capsys.readouterr().out
    Args.remove = True
    gc.run(Args)
    assert "removed 1 of 1" in capsys.readouterr().out
    assert store.leftover_texts() == []


@pytest.mark.live
@pytest.mark.skipif(
    not LIVE_KEY or not os.environ.get("TURBOPUFFER_REGION"),
    reason="live turbopuffer test: needs TURBOPUFFER_API_KEY and TURBOPUFFER_REGION",
)
def test_live_service_round_trip():
    store = tpb.connect(prefix=f"vecgpt-test-{uuid.uuid4().hex[:8]}-")
    try:
        x = rng.standard_normal((30, 8)).astype(np.float32)
        store.create("c", 8, "l2", ("row",))
        store.upsert("c", np.arange(30), x, {"row": np.arange(30)})
        q = rng.standard_normal((2, 8)).astype(np.float32)
        hits = store.search("c", q)
        order = np.argsort(hits.ids, axis=1)
        np.testing.assert_allclose(np.take_along_axis(hits.dists, order, 1), truth(q, x), rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(store.fetch("c", np.array([3, 1])), x[[3, 1]])
    finally:
        store.drop("c")
        for ns in (store.catalog_ns, store.models_ns):
            store._delete_namespace(ns)


def _text_keys(store, name, n=24, heads=3):
    store.create(name, 4, "l2", ("layer", "head", "position"))
    attrs = {"layer": np.zeros(n, int), "head": np.arange(n) % heads, "position": np.arange(n) // heads}
    store.upsert(name, np.arange(n), rng.standard_normal((n, 4)).astype(np.float32), attrs)


@pytest.mark.parametrize("listing", ["forbidden", "stale"])
def test_namespaces_are_named_by_the_catalog_not_a_listing(small_server, local, tmp_path, capsys, listing):
    """Listing may answer 403 (a key without list permission) or lag (the docs: not consistent): search,
    count, fetch, drop and tpuf-gc name every namespace from the catalog, and leave none behind."""
    from vecgpt.backends.turbopuffer import gc

    server = small_server.server
    store = local(small_server.url, replicas=2)
    setattr(server, *(("list_forbidden", True) if listing == "forbidden" else ("list_lag", 3600.0)))
    try:
        store.create("m", 4, "l2", ("row",))
        store.upsert("m", np.arange(5), np.eye(5, 4, dtype=np.float32), {"row": np.arange(5)})
        _text_keys(store, "text-00aa")
        _text_keys(store, "text-00bb")
        hits = store.search("text-00aa", np.zeros((1, 4), np.float32), where=Where(eq={"layer": 0}))
        assert sorted(hits.ids[0].tolist()) == list(range(24))  # every head's namespace, none listed
        assert store.count("text-00aa") == 24 and store.fetch("text-00aa", [5]).shape == (1, 4)
        store.drop("text-00aa")
        config = tmp_path / "tp.toml"
        config.write_text(
            f'backend = "turbopuffer"\n[store]\nbase_url = "{small_server.url}"\n'
            f'prefix = "{store.prefix}"\nmax_top_k = 50\nmax_retries = 0\n'
        )

        class Args:
            remove, older_than, config_ = True, 0.0, None

        Args.config = str(config)
        assert gc.run(Args) == 0
        assert "removed 1 of 1" in capsys.readouterr().out
        store.drop("m")
    finally:
        server.list_forbidden, server.list_lag = False, 0.0
    assert sorted(n for n in server.namespaces if n.startswith(store.prefix)) == [store.catalog_ns]


def test_a_create_that_meets_409_is_done_and_other_409s_are_errors(small_server, local):
    from vecgpt.backends.turbopuffer.server.faults import Faults

    store = local(small_server.url)  # max_retries=0: the 409 reaches the adapter
    small_server.server.faults = Faults(0.999, seed=0, kinds=("409",))  # applied, then answered Conflict
    try:
        store.create("c", 3, "l2", ("row",))
        with pytest.raises(VecgptError, match="409"):
            store.upsert("c", np.arange(2), np.ones((2, 3), np.float32), {"row": np.arange(2)})
    finally:
        small_server.server.faults = Faults()
    again = tpb.connect(base_url=small_server.url, prefix=store.prefix, max_retries=0, max_top_k=50)
    assert again.collections() == ["c"]  # the create had landed
    again.close()


def test_cached_id_span_is_dropped_when_the_collection_grows(small_server, local):
    store = local(small_server.url)
    x = rng.standard_normal((120, 4)).astype(np.float32)
    store.create("g", 4, "l2", ("row",))
    store.upsert("g", np.arange(60), x[:60], {"row": np.arange(60)})
    assert store.search("g", x[:1]).ids.shape == (1, 60)  # more than 50 rows: split by the cached id span
    store.upsert("g", np.arange(60, 120), x[60:], {"row": np.arange(60, 120)})
    hits = store.search("g", x[:1])
    assert sorted(hits.ids[0].tolist()) == list(range(120))


def test_waiting_for_the_index_is_bounded_and_reports_progress(small_server, local):
    store = local(small_server.url)
    store.create("ix", 2, "l2", ("row",))
    small_server.server.index_lag = 3600.0
    try:
        store.upsert("ix", np.arange(3), np.ones((3, 2), np.float32), {"row": np.arange(3)})
        heard = []
        with pytest.raises(VecgptError, match="not indexed 'ix'.*3 rows"):
            store.wait_indexed("ix", timeout_s=0.2, progress=heard.append)
        assert heard and "3 rows unindexed" in heard[0]
        small_server.server.namespaces[store.prefix + "ix"].indexed_at = 0.0  # the index catches up
        assert store.wait_indexed("ix", timeout_s=0.2) >= 0
    finally:
        small_server.server.index_lag = 0.0


def test_output_layer_ann_waits_for_the_index(small_server, monkeypatch, capsys):
    """Unindexed rows are scanned exhaustively, which would make ANN look exact: the output-layer
    experiment's build waits until metadata says the index is up to date, for at most index_timeout_s."""
    from vecgpt.cli.experiments import experiments

    experiments()  # puts experiments/05_output_layer on sys.path, for output_index
    from output_index import Unavailable, make

    monkeypatch.setenv("TURBOPUFFER_API_KEY", "local")
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    W = rng.standard_normal((30, 8)).astype(np.float32)
    index = make(
        "turbopuffer", threads=1, base_url=small_server.url, prefix=f"o{uuid.uuid4().hex[:8]}-", index_timeout_s=0.2
    )
    small_server.server.index_lag = 3600.0
    try:
        with pytest.raises(Unavailable, match="not indexed 'wte.ann'"):
            index.build(W)
    finally:
        small_server.server.index_lag = 0.0
        index.close()
    assert "rows unindexed" in capsys.readouterr().err
    index = make("turbopuffer", threads=1, base_url=small_server.url, prefix=f"o{uuid.uuid4().hex[:8]}-")
    try:
        index.build(W)
        meta = index.store._raw("metadata", index.store.prefix + "wte.ann", "metadata")  # noqa: SLF001
        assert meta["index"]["status"] == "up-to-date"
    finally:
        index.close()


def tpuf_config(tmp_path):
    """The test server's store options for this test, and a config file naming them."""
    from conftest import store_options

    options = store_options("turbopuffer", tmp_path)
    config = tmp_path / "tp.toml"
    config.write_text(
        'backend = "turbopuffer"\n[store]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())
    )
    return options, config


def test_generate_loads_a_missing_model_only_with_yes_and_states_the_cost(
    tmp_path, capsys, tiny_model_dir, monkeypatch
):
    from vecgpt.cli import main, store

    monkeypatch.setattr(store, "on_this_machine", lambda _: False)  # as the service: the local server bills nothing
    options, config = tpuf_config(tmp_path)
    argv = ["generate", "--config", str(config), "--model", str(tiny_model_dir), "hi", "-n", "1"]
    assert main(argv) == 2  # stdin is no TTY here: nothing is asked, nothing written
    err = capsys.readouterr().err
    assert "load (writes at $2/GB" in err and "pass --yes" in err.splitlines()[-1]
    assert tpb.connect(**options).manifests() == []
    assert main([*argv, "--yes"]) == 0 and "load (writes" in capsys.readouterr().err
    assert len(tpb.connect(**options).manifests()) == 1
    assert main(argv) == 0 and "load (writes" not in capsys.readouterr().err  # held now: no question


def test_defaults_are_per_user(small_server, monkeypatch):
    from vecgpt.backends.base import user_name

    monkeypatch.setenv("TURBOPUFFER_API_KEY", "local")
    monkeypatch.setenv("USER", "Ann.Lee")
    monkeypatch.setenv("LOGNAME", "Ann.Lee")
    assert user_name() == "ann_lee"
    assert tpb.connect(base_url=small_server.url).prefix == "vecgpt-ann_lee-"


def test_the_local_server_makes_a_key_prints_it_and_refuses_others(tmp_path):
    import subprocess
    import sys

    import turbopuffer

    proc = subprocess.Popen(
        [sys.executable, "-m", "vecgpt", "tpuf-local", "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        url, key = line.split(" on ")[1].split(" ")[0], line.split("TURBOPUFFER_API_KEY=")[1].strip()
        assert len(key) >= 20
        with pytest.raises(turbopuffer.AuthenticationError):
            turbopuffer.Turbopuffer(api_key="local", base_url=url, max_retries=0).namespace("x").metadata()
        with pytest.raises(turbopuffer.NotFoundError):  # let in: the namespace just is not there
            turbopuffer.Turbopuffer(api_key=key, base_url=url, max_retries=0).namespace("x").metadata()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_on_a_terminal_an_implicit_load_is_asked_for_on_stderr(tmp_path, tiny_model_dir):
    import pty
    import subprocess
    import sys

    options, config = tpuf_config(tmp_path)
    for answer, code, loaded in (("n", 2, 0), ("y", 0, 1)):
        leader, follower = pty.openpty()
        os.write(leader, f"{answer}\n".encode())
        as_the_service = "import sys, vecgpt.cli.store as s; s.on_this_machine = lambda _: False; from vecgpt.cli import main; sys.exit(main(sys.argv[1:]))"
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                as_the_service,
                "generate",
                "--config",
                str(config),
                "--model",
                str(tiny_model_dir),
                "hi",
                "-n",
                "1",
                "--json",
            ],
            stdin=follower,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
        )
        os.close(leader), os.close(follower)
        assert proc.returncode == code and "load it? [y/N]" in proc.stderr, proc.stderr
        assert len(tpb.connect(**options).manifests()) == loaded
        if code == 0:
            assert json.loads(proc.stdout)["tokens"]  # stdout: the result alone


def _keys_with_payload(store, name, n=600, heads=3, width=3):
    store.create(name, 4, "l2", ("layer", "head", "position"), payload=width)
    x, p = rng.standard_normal((n, 4)).astype(np.float32), rng.standard_normal((n, width)).astype(np.float32)
    attrs = {"layer": np.zeros(n, int), "head": np.arange(n) % heads, "position": np.arange(n) // heads}
    store.upsert(name, np.arange(n), x, attrs, payload=p)
    return x, p


def test_fetch_pages_large_id_lists_in_multi_queries(small_server, local):
    """600 ids at 50 a query: 12 chunks, asked of each of the 3 head namespaces (first copy, where the payload
    is) as one multi_query each: 3 requests in one wave, bit-exact payloads."""
    store = local(small_server.url)
    x, p = _keys_with_payload(store, "text-page")
    ids = np.concatenate([np.arange(600)[::-1], [7, 7]])
    with tally() as counts:
        v, got = store.fetch("text-page", ids, payload=True)
    assert np.array_equal(v, x[ids]) and np.array_equal(got, p[ids]) and got.dtype == np.float32
    assert (counts["requests"], counts["subqueries"]) == (3, 36)
    assert store.stats()["text-page"]["bytes"] == 600 * (4 * 4 * 2 + 16)  # vectors in 2 copies, 12 payload bytes once


class _DropNext:
    """Server faults: the next API request is handled, then its reply lost (the client retries)."""

    def __init__(self):
        self.left = 1

    def draw(self):
        self.left, kind = 0, ("drop" if self.left else None)
        return kind


def test_text_records_are_conditional_writes_of_up_to_megabytes(small_server, local):
    one = local(small_server.url)
    other = local(small_server.url, prefix=one.prefix, max_retries=1)  # another process, same store
    record = {"tokens": list(range(300_000))}  # ~2.3 MB of JSON: unindexed (filterable values stop at 4 KiB)
    assert one.write_text("big", record, expect=None) == 1
    assert other.read_text("big") == {**record, "version": 1}
    faults, small_server.server.faults = small_server.server.faults, _DropNext()
    try:  # the write lands, its reply is lost; the retry's condition fails, and it is known as our own write
        assert other.write_text("big", {"tokens": [1]}, expect=1) == 2
    finally:
        small_server.server.faults = faults
    assert small_server.server.stats["fault_drop"] >= 1
    with pytest.raises(TextConflict, match="version 2, not 1"):
        one.write_text("big", {"tokens": [2]}, expect=1)
    assert one.write_text("big", None, expect=2) == 3
    with pytest.raises(TextConflict, match="removed"):
        other.write_text("big", {"tokens": [3]}, expect=2)  # a patch: it cannot bring the text back
    assert one.read_text("big") is None and one.texts() == []
    with pytest.raises(VecgptError, match="64 bytes"):
        one.read_text("x" * 65)


@pytest.mark.parametrize("how", ["copy", "branch"])
def test_clone_copies_each_namespace_inside_the_service(small_server, local, how):
    store = local(small_server.url, clone_with=how)
    x, p = _keys_with_payload(store, "text-src", n=30)
    queries = small_server.server.stats["query"]
    with tally() as counts:
        store.clone("text-src", "text-dst")
    assert counts["requests"] == 1 + 1 + 6  # the catalog read and row, 3 heads x 2 copies (no row fetched)
    assert small_server.server.stats["query"] == queries + 1
    assert store.last_clone["namespaces"] == 6
    expect = 6 * 0.032 if how == "branch" else 6 * 10e3 / 1e9 * 2.0 * 0.5  # tiny namespaces: the write minimum
    assert store.last_clone["dollars"] == pytest.approx(expect)
    v, got = store.fetch("text-dst", np.arange(30), payload=True)
    assert np.array_equal(v, x) and np.array_equal(got, p)
    attrs = {"layer": [0], "head": [1], "position": [0]}
    store.upsert("text-dst", np.array([1]), np.zeros((1, 4)), attrs, payload=np.zeros((1, 3)))
    assert np.array_equal(store.fetch("text-src", np.array([1]), payload=True)[1], p[[1]])
    with pytest.raises(VecgptError, match="exists"):
        store.clone("text-src", "text-dst")
    store.drop("text-dst")
    assert store.count("text-src") == 30 and not [n for n in small_server.server.namespaces if "text-dst" in n]


def test_gc_knows_kept_texts_by_their_record(small_server, local, tmp_path, capsys):
    from vecgpt.backends.turbopuffer import gc

    store = local(small_server.url)
    _keys_with_payload(store, "text-0a0a", n=6)  # a crashed run's keys: no record
    _keys_with_payload(store, "text-0b0b", n=6)
    store.write_text("0b0b", {"tokens": [1]}, expect=None)  # a kept text, with its candidates' collection
    store.create("text-0b0b.c", 1, "l2", payload=4)
    store.upsert("text-0b0b.c", np.arange(2), np.zeros((2, 1)), payload=np.ones((2, 4)))
    store.write_text("0c0c", {"tokens": [2]}, expect=None)  # a record whose keys are gone
    config = tmp_path / "tp.toml"
    config.write_text(
        f'backend = "turbopuffer"\n[store]\nbase_url = "{small_server.url}"\nprefix = "{store.prefix}"\n'
        f"max_top_k = 50\nmax_retries = 0\n"
    )

    class Args:
        remove, older_than = False, 0.0

    Args.config = str(config)
    assert gc.run(Args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ["no record" in lines[0], "record v1" in lines[1], "record v1" in lines[2]] == [True] * 3
    assert [line.split()[0] for line in lines[:3]] == ["text-0a0a", "text-0b0b", "text-0c0c"]
    Args.remove = True
    gc.run(Args)
    assert "removed 3 of 3" in capsys.readouterr().out
    assert store.leftover_texts() == [] and store.texts() == [] and store.collections() == []
