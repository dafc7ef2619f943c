"""What the Milvus backend adds to the conformance suite: Milvus Lite's one process per folder said in one line,
requests split under Milvus's limits (small limits injected), its dimension limit, wrong URIs, collection names
Milvus accepts; and, where VECGPT_MILVUS_URI names a server, the same store against it (`live`)."""

import os
import re
import uuid

import numpy as np
import pytest

pytest.importorskip("pymilvus")

from procs import assert_one_line_error, cli, finish, write_config  # noqa: E402

from vecgpt import tokenizer  # noqa: E402
from vecgpt.api import generate  # noqa: E402
from vecgpt.backends.base import Where, get_store, tally  # noqa: E402
from vecgpt.backends.milvus.client import decode, encode  # noqa: E402
from vecgpt.backends.milvus.requests import SLACK, Limits  # noqa: E402
from vecgpt.engine import Engine  # noqa: E402
from vecgpt.errors import VecgptError  # noqa: E402
from vecgpt.loading import push  # noqa: E402

rng = np.random.default_rng(11)
ATTRS = ("layer", "head", "position")


def filled(store, name="c", n=300, dim=24, metric="l2"):
    x = rng.standard_normal((n, dim)).astype(np.float32)
    store.create(name, dim, metric, attrs=ATTRS, payload=4)
    attrs = {"layer": np.arange(n) % 3, "head": (np.arange(n) // 3) % 4, "position": np.arange(n) // 12}
    store.upsert(name, np.arange(n) * 3 + 1, x, attrs, x[:, :4])
    return x


def requests(call, *args, **kw) -> tuple[object, int]:
    """call(*args, **kw) and the requests it sent."""
    with tally() as counts:
        out = call(*args, **kw)
    return out, counts["requests"]


def test_a_second_process_is_told_in_one_line_that_milvus_lite_allows_one(make_store, tmp_path):
    store = make_store("milvus", path=str(tmp_path / "m"))
    filled(store)  # Milvus Lite started in this process
    config = write_config(tmp_path / "m.toml", "milvus", {"path": str(tmp_path / "m")})
    rc, _, err = finish(cli("ls", "--config", str(config)), timeout=120)
    assert_one_line_error(rc, err)
    assert "open in another process" in err and "one process per file" in err
    store.close()  # the last store of this process on it: Milvus Lite stops, another process may open it
    rc, out, err = finish(cli("ls", "--config", str(config)), timeout=120)
    assert rc == 0, err


def test_opening_a_store_starts_nothing_until_a_collection_is_asked_for(make_store, tmp_path):
    """Another process reads manifests and text records while one generates: only collections need Milvus Lite."""
    store = make_store("milvus", path=str(tmp_path / "m"))
    store.write_manifest("k", {"fingerprint": "k"})
    assert store.read_manifest("k") == {"fingerprint": "k"} and store.texts() == []
    assert store._client is None


def test_requests_are_split_under_the_limits(make_store):
    """Limits of 50 rows a search, 3 queries a search, and requests of about 40 rows: each request inside them, and
    the answers those of one request each; a search of more rows than 50 split by id range."""
    store = make_store("milvus")
    x = filled(store)
    q = rng.standard_normal((7, 24)).astype(np.float32)
    where = Where(eq={"layer": 1}, lt={"position": 12})  # 48 rows
    whole = [store.search("c", q, k, w) for k, w in [(None, where), (5, None), (5, where)]]
    fetched = store.fetch("c", np.arange(300)[::-1] * 3 + 1, payload=True)
    small = Limits(top_k=50, nq=3, bytes=SLACK + 40 * (8 + 4 * 24 + 8 * 3 + 4 * 4))
    store.limits = small
    for (k, w), want in zip([(None, where), (5, None), (5, where)], whole):
        got, sent = requests(store.search, "c", q, k, w)
        assert sent == 3  # 7 queries, 3 a request
        assert got.ids.tolist() == want.ids.tolist() and np.array_equal(got.dists, want.dists)
    got, sent = requests(store.fetch, "c", np.arange(300)[::-1] * 3 + 1, payload=True)
    assert sent == 8 and all(np.array_equal(a, b) for a, b in zip(got, fetched))  # 40 rows a request
    _, sent = requests(store.upsert, "c", np.arange(100), x[::-1][:100] * 2, payload=x[:100, :4])  # no ties
    assert sent == 3
    # more rows than a search returns (367 = 300 + 67 new ids): a search per range of 50 ids, then the nearest
    split = [requests(store.search, "c", q[:2], k) for k in (None, 120)]
    store.limits = Limits()
    for (got, sent), k in zip(split, (None, 120)):
        want = store.search("c", q[:2], k)
        assert sent >= 8 and got.ids.shape == want.ids.shape == (2, k or 367)
        if k is None:
            got, want = (np.take_along_axis(h.ids, np.argsort(h.ids, 1), 1) for h in (got, want))
            assert np.array_equal(got, want)
        else:
            assert got.ids.tolist() == want.ids.tolist() and np.array_equal(got.dists, want.dists)


def test_a_dimension_above_milvus_limit_is_one_line(make_store):
    store = make_store("milvus")
    with pytest.raises(VecgptError, match=r"Milvus takes vectors of dimension 1 to 32,768, not 32,769"):
        store.create("wide", 32_769, "ip")


@pytest.mark.parametrize(
    "uri, says",
    [("ftp://host", "give http://host:19530"), ("http://127.0.0.1:9", "cannot reach Milvus at http://127.0.0.1:9")],
)
def test_a_wrong_uri_is_one_line(tmp_path, uri, says):
    store = get_store("milvus", path=str(tmp_path), uri=uri, timeout=2.0)
    with pytest.raises(VecgptError, match=re.escape(says)) as e:
        store.collections()
    assert "\n" not in str(e.value)


def test_collection_names_are_ones_milvus_takes_and_come_back():
    for name in ["h.3.attn.c_attn", "text-0a1b_c.candidates", "wte", "ln_f"]:
        stored = encode("vecgpt", name)
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", stored) and decode("vecgpt", stored) == name
    assert decode("other", encode("vecgpt", "wte")) is None


LIVE = os.environ.get("VECGPT_MILVUS_URI")


@pytest.mark.live
@pytest.mark.skipif(not LIVE, reason="live Milvus test: needs VECGPT_MILVUS_URI (and VECGPT_MILVUS_TOKEN if it asks)")
def test_live_server_round_trip_and_generate(tmp_path, tiny_model):
    store = get_store("milvus", path=str(tmp_path), uri=LIVE, prefix=f"vecgpt_test_{uuid.uuid4().hex[:8]}")
    try:
        x = filled(store)
        hits = store.search("c", x[:2], k=1, where=Where(eq={"layer": 0}))
        assert hits.ids[:, 0].tolist() == [1, 4] and np.all(np.abs(hits.dists) < 1e-3)
        assert store.count("c") == 300 and np.array_equal(store.fetch("c", np.array([4])), x[1:2])
        push(store, tiny_model, "ip", progress=False)
        with Engine(store).open() as text:
            assert len(generate(text, tokenizer.encode("Hello"), 3, stop=False).tokens) == 4
    finally:
        for name in store.collections():
            store.drop(name)
        store.close()
