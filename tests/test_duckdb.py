"""DuckDB-specific checks: a query's distances are those it gets alone, the one-line errors (a file another process
holds, a folder for a file, a dimension DuckDB cannot hold), and a text killed mid-generate resuming from the file
(tests/test_texts.py watches its writer from a second process, which a DuckDB file does not admit)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from procs import cli, env, finish, store_config
from test_texts import PROMPT, SAMPLED, long_model, run_json, uninterrupted  # noqa: F401 (long_model: a fixture)

from vecgpt.backends.base import Search, Where, get_store
from vecgpt.errors import VecgptError
from vecgpt.meter import Metered

duckdb = pytest.importorskip("duckdb")

from vecgpt.backends.duckdb.records import duck_errors  # noqa: E402

rng = np.random.default_rng(3)


@pytest.fixture
def store(tmp_path):
    opened = get_store("duckdb", path=str(tmp_path / "store.duckdb"))
    yield opened
    opened.close()


def filled(store, metric: str, n: int = 512, dim: int = 40) -> None:
    store.create("c", dim, metric, attrs=("layer", "head", "position"))
    attrs = {"layer": np.arange(n) % 2, "head": (np.arange(n) // 2) % 4, "position": np.arange(n) // 8}
    store.upsert("c", np.arange(n), rng.standard_normal((n, dim)).astype(np.float32), attrs)


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_a_query_among_others_gets_the_distances_it_gets_alone_bit_for_bit(store, metric):
    """DuckDB scores each (query, row) pair with one call of its distance function, so a statement holding several
    queries (texts sharing a round) gives each the bits of its statement alone: every row, a filter, top-k, with the
    rows' vectors, and a layer's heads as one grouped search."""
    filled(store, metric)
    q = rng.standard_normal((5, 40)).astype(np.float32)
    shapes = [{}, {"where": Where(eq={"layer": 1}, lt={"position": 30})}, {"k": 7}, {"k": 512, "vectors": True}]
    for shape in shapes:
        together = store.search_many([Search("c", q, **shape)])[0]
        for i in range(len(q)):
            alone = store.search_many([Search("c", q[i : i + 1], **shape)])[0]
            order, mine = np.argsort(alone.ids[0], kind="stable"), np.argsort(together.ids[i], kind="stable")
            assert together.ids[i][mine].tolist() == alone.ids[0][order].tolist()
            assert together.dists[i][mine].tobytes() == alone.dists[0][order].tobytes()
    grouped = Search("c", q[:4, None].repeat(3, 1), where=Where(eq={"layer": 0}, ge={"position": 3}), by="head")
    (heads,) = Metered(store).search_many([grouped])
    for h in range(4):
        alone = store.search("c", q[h : h + 1], where=Where(eq={"layer": 0, "head": h}, ge={"position": 3}))
        order = np.argsort(alone.ids[0])
        for row in range(3):
            mine = np.argsort(heads.ids[h, row])
            assert heads.ids[h, row][mine].tolist() == alone.ids[0][order].tolist()
            assert heads.dists[h, row][mine].tobytes() == alone.dists[0][order].tobytes()


def test_l2_is_the_square_of_duckdbs_distance_taken_exactly(store):
    """array_distance is the float32 L2 distance, not its square: squared in float64, exactly (24-bit mantissas)."""
    filled(store, "l2", n=50)
    q = rng.standard_normal((1, 40)).astype(np.float32)
    hits = store.search("c", q)
    root = store.con.execute(
        "SELECT array_distance(v, ?::FLOAT[40]) FROM " + store._col("c").table + " ORDER BY id", [q[0].tolist()]
    ).fetchnumpy()
    roots = next(iter(root.values())).astype(np.float32)
    assert hits.dists.dtype == np.float64
    assert hits.dists[0][np.argsort(hits.ids[0])].tolist() == [float(r) * float(r) for r in roots]


def test_a_file_open_in_another_process_is_one_line_saying_what_to_do(store):
    script = textwrap.dedent(
        f"""
        from vecgpt.backends.base import get_store
        from vecgpt.errors import VecgptError
        try:
            get_store("duckdb", path={str(store.path)!r})
        except VecgptError as e:
            print(e)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], env=env(), capture_output=True, text=True, timeout=60)
    line = out.stdout.strip()
    assert "\n" not in line and "is open in another process" in line and "close it there" in line, out
    assert str(store.path) in line


def test_bad_paths_and_shapes_are_refused_in_one_line(store, tmp_path):
    with pytest.raises(VecgptError, match="is a folder; .* names the store's file"):
        get_store("duckdb", path=str(tmp_path))
    (tmp_path / "junk").write_bytes(b"not a database" * 1000)
    with pytest.raises(VecgptError, match="not a valid DuckDB database file.*; move it away or give another"):
        get_store("duckdb", path=str(tmp_path / "junk"))
    with pytest.raises(VecgptError, match="dimension 1 to 100000"):
        store.create("wide", 100_001, "ip")
    with pytest.raises(VecgptError, match="reserved"):
        store.create("c", 4, "ip", attrs=("payload",))


def test_after_kill_9_a_resume_reads_again_only_what_was_lost(tmp_path, long_model):  # noqa: F811
    """test_texts.py's kill -9 check, the writer watched through its output (its text as drawn) instead of the store,
    which no second process may open while the writer holds it."""
    config, options = store_config("duckdb", tmp_path)
    args = ["--config", str(config), "--model", long_model.source, "--yes"]
    writer = cli("generate", PROMPT, "-n", "200", "--keep", *args, *SAMPLED)
    try:
        seen = writer.stdout.read(len(PROMPT) + 40)  # the prompt, then a few tokens' text
        assert len(seen) == len(PROMPT) + 40, finish(writer)[2]
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    store = get_store("duckdb", **options)
    (text_id,) = store.texts()
    held = store.read_text(text_id)
    store.close()
    assert len(held["tokens"]) > held["prompt_len"]
    b = run_json("generate", "--resume", text_id, "-n", "3", "--json", *args)
    assert b["text_tokens"][: len(held["tokens"])] == held["tokens"]  # nothing the record held is lost
    assert b["positions_reread"] == len(held["tokens"]) - 1 - held["written"]
    assert b["text_tokens"] == uninterrupted(args, len(b["text_tokens"]) - len(b["prompt_tokens"]))


@pytest.mark.parametrize(
    "raised", [RuntimeError("Query interrupted"), duckdb.InterruptException("INTERRUPT Error: Interrupted!")]
)
def test_ctrl_c_during_a_statement_is_a_keyboard_interrupt(store, raised):
    """DuckDB stops a statement on Ctrl-C and raises RuntimeError("Query interrupted") in the KeyboardInterrupt's
    place (seen here with a SIGINT during a long statement; CI once saw the CLI end with that traceback). The store's
    methods give it back as KeyboardInterrupt, so the CLI ends with its one line and exit 130; other errors pass."""

    @duck_errors
    def interrupted(self):
        raise raised

    @duck_errors
    def failing(self):
        raise RuntimeError("something else")

    plain = store.inner if isinstance(store, Metered) else store
    with pytest.raises(KeyboardInterrupt):
        interrupted(plain)
    with pytest.raises(RuntimeError, match="something else"):
        failing(plain)
