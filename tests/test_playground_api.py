"""The playground's JSON API without a browser: limits as one-line 4xx messages, no secret in any answer, and a
text started on one server process continued on another (texts at once: test_playground_load.py)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from vecgpt import weights
from vecgpt.playground.routes import clean
from vecgpt.playground.server import Settings

from browser import Running, call, events
from conftest import tiny_params

SMALL = weights.HParams(n_layer=2, n_head=4, n_embd=64, n_ctx=64, n_vocab=512)  # a vocabulary searched fast


@pytest.fixture(scope="module")
def small_config(tmp_path_factory) -> Path:
    """A config running a 512-token model (" the", " and": inside its vocabulary)."""
    folder = tmp_path_factory.mktemp("small")
    model = weights.save(folder / "model", SMALL, tiny_params(SMALL))
    config = folder / "small.toml"
    config.write_text(f'model = "{model}"\n[store]\npath = "{folder / "faiss"}"\n')
    return config


def one_line_error(status: int, body: dict, code: int, words: str) -> None:
    assert status == code, body
    assert words in body["error"] and "\n" not in body["error"], body


def start(url: str, **body) -> dict:
    status, view = call(f"{url}/api/texts", "POST", {"prompt": " the", **body})
    assert status == 200, view
    return view


def run(url: str, text_id: str, n: int) -> list[int]:
    """Generate n tokens through the event stream; the token ids it sent."""
    got = events(f"{url}/api/texts/{text_id}/generate?n={n}")
    assert got[-1][0] == "done", got
    return [data["id"] for kind, data in got if kind == "token"]


def test_limits_are_one_line_4xx(playground):
    url = playground.url
    one_line_error(*call(f"{url}/api/texts", "POST", {"prompt": "x" * 4001}), 400, "at most 4000")
    one_line_error(*call(f"{url}/api/texts", "POST", {"prompt": "hi", "top_k": 50258}), 400, "vocabulary size 50257")
    one_line_error(*call(f"{url}/api/texts", "POST", {"prompt": "hi", "top_k": "many"}), 400, "top_k must be")
    one_line_error(*call(f"{url}/api/texts", "POST", raw=b"x" * 20000), 413, "at most 16384")
    one_line_error(*call(f"{url}/api/texts", "POST", raw=b"{not json"), 400, "not JSON")
    one_line_error(*call(f"{url}/api/texts/nosuchtext"), 404, "no text nosuchtext")
    view = start(url)
    status, body = call(f"{url}/api/texts/{view['id']}/generate?n=300")
    one_line_error(status, body, 400, "exceed the model's context of 256")
    one_line_error(*call(f"{url}/api/texts/{view['id']}/candidates/0"), 400, "not a generated token")


def test_open_texts_are_limited_and_idle_ones_closed(tmp_path, small_config):
    server = Running(Settings(configs=[str(small_config)], store=str(tmp_path / "f"), max_texts=2, idle_s=1.0))
    try:
        first, _ = start(server.url), start(server.url)
        one_line_error(*call(f"{server.url}/api/texts", "POST", {"prompt": " the"}), 429, "2 texts open")
        deadline = time.monotonic() + 30
        while call(f"{server.url}/api/texts/{first['id']}")[0] != 404:  # closed by the collector
            assert time.monotonic() < deadline, "idle texts were not closed"
            time.sleep(0.3)
        start(server.url)  # room again
    finally:
        server.stop()


def test_no_secret_reaches_an_answer():
    secret = "pg-SECRET-PASS-41d8e2"
    line = clean(f"connection to postgresql://vec:{secret}@db:5432/x failed\nTraceback ...", [secret])
    assert secret not in line and "\n" not in line and "postgresql://***@db" in line
    assert "tpuf-KEY" not in clean("bad key tpuf-KEY-1", ["tpuf-KEY-1"])


def test_stores_show_documents_and_bytes_and_no_options(playground):
    status, body = call(f"{playground.url}/api/stores")
    (store,) = body["stores"]
    assert status == 200 and store["documents"] > 0 and store["bytes"] > 0
    assert set(store["location"]) == {"backend", "path"} and store["models"]


def serve(config: Path, store: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """`vecgpt serve` in its own process on a free port; the URL it prints."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vecgpt.cli",
            "serve",
            "--config",
            str(config),
            "--store",
            str(store),
            "--port",
            "0",
            *extra,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stderr.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not found:
        proc.kill()
        raise AssertionError(f"vecgpt serve said {line!r}")
    url = found.group(0)
    deadline = time.monotonic() + 60
    while True:
        try:
            if call(f"{url}/api/stores")[0] == 200:
                return proc, url
        except OSError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, "vecgpt serve did not answer"
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    proc.stderr.close()


def test_a_text_started_on_one_process_continues_on_another(tmp_path, small_config):
    store = tmp_path / "shared"
    a, url_a = serve(small_config, store)
    b, url_b = serve(small_config, store)
    try:
        setting = {"prompt": " the and", "temperature": 0.8, "seed": 3, "top_k": 20}
        alone = start(url_a, **setting)
        whole = run(url_a, alone["id"], 6)
        text = start(url_a, **setting)
        first = run(url_a, text["id"], 3)
        assert [t["id"] for t in call(f"{url_b}/api/texts/{text['id']}")[1]["tokens"][-3:]] == first
        rest = run(url_b, text["id"], 3)  # process b continues what process a started
        assert first + rest == whole
        status, again = call(f"{url_a}/api/texts/{text['id']}")
        assert status == 200, again
        assert [t["id"] for t in again["tokens"][-6:]] == whole  # a re-reads what b wrote
        assert run(url_b, start(url_a, **setting)["id"], 6) == whole  # started on a, nothing read, all on b
    finally:
        stop(a), stop(b)


def test_two_workers_share_one_port(tmp_path, small_config):
    proc, url = serve(small_config, tmp_path / "w", "--workers", "2")
    try:
        text = start(url)
        assert len(run(url, text["id"], 2)) == 2
        assert call(f"{url}/api/texts/{text['id']}")[0] == 200  # whichever worker answers finds it
    finally:
        stop(proc)


def test_candidates_are_what_sampling_draws_from(playground):
    url = playground.url
    view = start(url, prompt="ROMEO:", temperature=0.8, top_k=5, seed=2)
    (token,) = run(url, view["id"], 1)
    status, c = call(f"{url}/api/texts/{view['id']}/candidates/{view['prompt_len']}")
    logits = np.array([r["logit"] for r in c["rows"]])
    z = logits[:5] / 0.8
    want = np.exp(z - z.max())
    got = np.array([r["probability"] for r in c["rows"]])
    # softmax(logits / T) over the top 5 in float64; 1e-15 covers a different order of the 5-term sum
    assert status == 200 and np.allclose(got[:5], want / want.sum(), rtol=0, atol=1e-15) and not got[5:].any()
    assert [r["id"] for r in c["rows"] if r["chosen"]] == [token]


def test_operations_pay_only_unread_positions(playground):
    url = playground.url
    view = start(url, prompt="ROMEO:")
    got = events(f"{url}/api/texts/{view['id']}/generate?n=4")
    reads = [data["cost"]["positions_read"] for kind, data in got if kind == "token"]
    assert reads == [view["prompt_len"], 1, 1, 1]  # the prompt once, then each new token once
    p = view["prompt_len"] + 2
    cands = call(f"{url}/api/texts/{view['id']}/candidates/{p}")[1]["rows"]
    status, child = call(f"{url}/api/texts/{view['id']}/branch", "POST", {"position": p, "token": cands[1]["id"]})
    assert status == 200 and child["cost"]["positions_read"] == 0 and child["cost"]["total"] > 0
    more = events(f"{url}/api/texts/{child['id']}/generate?n=1")
    assert more[0][1]["cost"]["positions_read"] == 1  # only the new candidate: positions before it are shared
    status, back = call(f"{url}/api/texts/{view['id']}/step-back", "POST", {"position": p})
    assert status == 200 and back["cost"]["positions_read"] == 0 and len(back["tokens"]) == p
    status, again = call(f"{url}/api/texts/{child['id']}/retry", "POST", {"position": p, "seed": 9})
    assert status == 200 and again["cost"]["positions_read"] == 0 and len(again["tokens"]) == p + 1


def test_the_pages_need_no_network(playground):
    from vecgpt.playground.routes import STATIC

    shipped = {f.name: f.read_text() for f in STATIC.iterdir()}
    assert {"playground.html", "playground.js", "attention.html", "attention.js", "style.css"} <= set(shipped)
    for name, text in shipped.items():
        text = text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # a namespace's name, nothing loaded
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text), f"{name} loads something from the network"
    for path in ("/", "/attention", "/static/playground.js", "/static/style.css", "/favicon.ico"):
        with urllib.request.urlopen(playground.url + path) as r:
            assert r.status == 200


@contextlib.contextmanager
def charging_server(tmp_path, monkeypatch, small_config, **settings):
    """A playground server on the local turbopuffer look-alike (a store that charges), holding the small model."""
    pytest.importorskip("turbopuffer")
    from vecgpt.backends.turbopuffer.server import Running as Turbopuffer
    from vecgpt.backends.turbopuffer.store import TurbopufferStore
    from vecgpt.config import load_config, open_store
    from vecgpt.loading import push

    if not hasattr(TurbopufferStore, "write_text"):
        pytest.skip("the turbopuffer store keeps no texts yet")
    monkeypatch.setenv("TURBOPUFFER_API_KEY", "play-key")
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    service = Turbopuffer(api_key="play-key")
    config = tmp_path / "tpuf.toml"
    model = load_config(small_config).model
    config.write_text(
        f'backend = "turbopuffer"\nmodel = "{model}"\n[store]\nbase_url = "{service.url}"\nprefix = "d-"\n'
    )
    store = open_store(load_config(config))
    push(store, weights.load(model), "l2", progress=False)  # a billed store is never loaded by the server
    store.close()
    server = Running(Settings(configs=[str(config)], **settings))
    try:
        yield server
    finally:
        server.stop()
        service.stop()


def test_turbopuffer_tokens_show_their_dollars(tmp_path, monkeypatch, small_config):
    with charging_server(tmp_path, monkeypatch, small_config) as server:
        view = start(server.url)
        costs = [
            data["cost"]
            for kind, data in events(f"{server.url}/api/texts/{view['id']}/generate?n=2")
            if kind == "token"
        ]
        assert len(costs) == 2 and all(c["dollars"] > 0 for c in costs)
        assert "play-key" not in json.dumps(call(f"{server.url}/api/stores")[1])
