"""Batch invariance: a text's logits are bit for bit what it computes alone, whatever else shares its rounds.

Texts in a stepper (vecgpt.stepper) are read in one forward pass a step (engine.Step): a model matrix is searched
once with every text's rows. Every store computes each query of a multi-query search alone (memory: a matrix-vector product a query;
FAISS: its by-index kernel a pair; LanceDB: a plan of its own for each query vector, unioned; pgvector: its
distance function a pair, a wide document's parts added smallest first), so a text's bits cannot depend on its
company, and these tests compare every logit's bits (k = the vocabulary), step by step, against the same text
read alone: in batches of 2, 5 and 16 texts of different prompt lengths, texts joining later, joining mid-text
and leaving mid-text; through a text's operations (resume, step back, retry, branch); and beside a text that
fails.

turbopuffer does not say how its service computes a multi_query's subqueries, so there a text in company is held
to the tolerance rule (vecgpt.tolerance) against float64 numpy instead, and the local server (`--float32`) sums
each subquery of a multi_query in an order that depends on its place in the request, never kinder than that.
"""

from __future__ import annotations

import itertools
import os
from typing import NamedTuple

import numpy as np
import pytest

from vecgpt import encoding, tokenizer, tolerance
from vecgpt.config import auto_layout
from vecgpt.engine import Engine, Read, chunks
from vecgpt.loading import push, store_fingerprint
from vecgpt.sampling import Candidates
from vecgpt.stepper import Stepper, run_one
from vecgpt.text import Text

from conftest import BACKENDS, SLOW, store_options

RULE = {
    "turbopuffer",
    "milvus",
}  # the service's arithmetic is its own (Milvus: a request's queries one product): a text in company is held to the rule; every other
# store computes each query alone, and a new store is held to the bits until it is listed here
# The layouts and batch sizes each store runs: every layout where a run is cheap, 16 texts on the fast stores (in
# their default layout), each slower store in its default layout only.
COVER = {
    "memory": {"four": (2, 5), "three": (2, 5), "five": (2, 5, 16)},
    "faiss": {"four": (2, 5), "three": (2, 5), "five": (2, 5, 16)},
    "pgvector": {"four": (2, 5), "three": (2, 5), "five": (2, 5)},
    "lancedb": {"five": (2, 5)},
    "turbopuffer": {"three": (5,)},  # its five texts start together and apart: held to the rule, not to a text alone
    "milvus": {"five": (2,)},  # Milvus Lite: about 0.3 s a token
}
CASES = [
    pytest.param(b, layout, sizes, id=f"{b}-{layout}-" + "-".join(map(str, sizes)))
    for b in BACKENDS
    for layout, sizes in COVER.get(b, {"five": (2, 5)}).items()
]
PROMPTS = [
    "O",
    "To be, or not to be, that is the question",
    "ROMEO:",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "Good morrow",
    "Now is the winter of our discontent",
    "KING",
    "All the world's a stage,",
    "Friends, Romans, countrymen, lend me your ears",
    "What's in a name?",
    "If music be the food of love, play on",
    "Hello",
    "The quick brown fox",
    "A horse! a horse! my kingdom for a horse!",
    "Is this a dagger which I see before me",
    "Cry",
]


def every_logit(engine: Engine, backend: str) -> int:
    """The k a test reads with: the vocabulary, every logit; on Milvus Lite (conftest.SLOW) the top 40, as each hit
    it returns is parsed in Python (50,257 a query took seconds a read)."""
    return 40 if backend in SLOW else engine.hparams.n_vocab


def opened(make_store, backend: str, model, layout: str) -> Engine:
    store = make_store.loaded(backend, model, "l2", layout)
    return Engine(store, model=store_fingerprint(model, "l2", layout))


class Part(NamedTuple):
    """One text of a batch: its prompt (an index into PROMPTS) and tokens to read after it (greedy), when it starts
    (once the batch's first text has done `after` reads), and the reads it does alone before joining the stepper
    and after leaving it (None: it stays to its end)."""

    prompt: int
    n: int = 3
    after: int = 0
    joins: int = 0
    leaves: int | None = None


# Batches of texts of different prompt lengths (1 to 13 tokens): texts that start together; texts starting once
# the first has read its prompt, or a token or two; texts reading alone before they join; one leaving mid-text.
BATCHES = {
    2: [Part(0, n=2), Part(1)],
    5: [Part(2, n=2), Part(3), Part(4, n=2, after=1), Part(5, joins=2), Part(6, n=2, leaves=2)],
    16: [Part(i, n=2 + i % 2, after=i % 4, joins=int(i % 5 == 4), leaves=2 if i == 9 else None) for i in range(16)],
}  # a prompt's tokens read (n) are the same in every batch: its reads alone serve them all


def prompt_ids(part: Part) -> list[int]:
    return tokenizer.encode(PROMPTS[part.prompt])


def greedy(session, part: Part, k: int, out=None, progress=None):
    """An operation: the prompt read as one block, then `part.n` tokens one at a time, each the best of the last
    read; every read's candidates (appended to `out` as they come). Reads `joins` to `leaves` go to the stepper
    (yielded), the others are read alone."""
    out, ids = [] if out is None else out, prompt_ids(part)
    for i in range(part.n + 1):
        stepped = part.joins <= i and (part.leaves is None or i < part.leaves)
        out.append((yield Read(session, ids, k)) if stepped else session.read(ids, k))
        ids = [int(out[-1].ids[0])]
        if progress is not None:
            progress(i + 1)
    return out


def alone(engine: Engine, part: Part, k: int) -> list[Candidates]:
    """The part's reads, each read alone (Session.read), none in a stepper."""
    with engine.open() as session:
        return run_one(greedy(session, part._replace(joins=part.n + 1), k))


def stepped(stepper: Stepper, parts: list[Part], start) -> list:
    """Operations started as their parts say (`start(i, reads_done)`: text i's operation), stepped to their end;
    each one's result, or the error it ended with."""
    done, jobs = [0] * len(parts), {}

    def mark(reads: int) -> None:
        done[0] = reads

    while stepper.busy() or len(jobs) < len(parts):
        for i, part in enumerate(parts):
            if i not in jobs and done[0] >= part.after:
                jobs[i] = stepper.add(start(i, mark if i == 0 else None))
        stepper.step()
    return [job.result if job.error is None else job.error for _, job in sorted(jobs.items())]


def together(engine: Engine, parts: list[Part], k: int) -> tuple[list[list[Candidates]], Stepper]:
    """The parts read in one stepper, each starting when its Part says."""
    stepper, sessions = Stepper(at_once=len(parts)), [engine.open() for _ in parts]
    try:
        results = stepped(stepper, parts, lambda i, mark: greedy(sessions[i], parts[i], k, progress=mark))
    finally:
        for s in sessions:
            s.close()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results, stepper


def same_bits(want: list[Candidates], got: list[Candidates], what: str) -> None:
    assert len(got) == len(want), what
    for step, (a, b) in enumerate(zip(want, got)):
        assert np.array_equal(a.ids, b.ids), f"{what}, step {step}: the ids differ"
        assert np.array_equal(a.logits, b.logits), (
            f"{what}, step {step}: logits differ by up to {np.abs(a.logits - b.logits).max():.3g}"
        )


def within_rule(model64, part: Part, got: list[Candidates], layout: str, what: str) -> None:
    """Every logit within the derived tolerance of float64 numpy's, teacher-forced on the text's own tokens; the
    order of its top 40 as the rule allows."""
    prompt, tokens = prompt_ids(part), [int(c.ids[0]) for c in got]
    exact = tolerance.forced_logits(model64, prompt, tokens)
    tol = tolerance.logit_tolerance(model64, prompt, tokens, "l2", tolerance.U32, exact, layout=layout)
    for step, (c, row, t) in enumerate(zip(got, exact, tol)):
        error = np.abs(c.logits - row[c.ids]).max()
        assert error <= t, f"{what}, step {step}: a logit {error:.3g} from numpy's, above {t:.3g}"
        top = Candidates(c.ids[:40], c.logits[:40])
        assert not tolerance.disagreements(top, row, 40, t), f"{what}, step {step}"


def spy_token_searches(store, monkeypatch, vocab: int) -> list[int]:
    """The number of queries of every token search (k = the vocabulary) the store is sent: one a text alone."""
    sizes, search_many = [], store.search_many

    def spy(searches):
        sizes.extend(len(s.queries) for s in searches if s.k == vocab)
        return search_many(searches)

    monkeypatch.setattr(store, "search_many", spy)
    return sizes


@pytest.mark.parametrize("backend, layout, sizes", CASES)
def test_a_texts_logits_are_its_own_whatever_shares_its_rounds(
    make_store, tiny_model, model64, backend, layout, sizes, monkeypatch
):
    """Every text's every logit (k = the vocabulary), every step, alone and in batches of 2, 5 and (the fast
    stores) 16 texts: bit for bit the same where the store computes each query alone; on turbopuffer within the
    rule. The token searches went out merged: one search held several texts' queries."""
    engine = opened(make_store, backend, tiny_model, layout)
    k = every_logit(engine, backend)
    exact = backend not in RULE
    solo = {(p.prompt, p.n): alone(engine, p, k) for size in sizes for p in BATCHES[size]} if exact else {}
    queries = spy_token_searches(engine.store, monkeypatch, k)
    for size in sizes:
        del queries[:]
        got, stepper = together(engine, BATCHES[size], k)
        assert max(stepper.steps) >= 2 and max(queries) >= 2, f"{size} texts never shared a step"
        for i, (part, cands) in enumerate(zip(BATCHES[size], got)):
            what = f"{backend}-{layout}, text {i} of {size} ({len(prompt_ids(part))}-token prompt)"
            if exact:
                same_bits(solo[part.prompt, part.n], cands, what)
            else:
                within_rule(model64, part, cands, layout, what)


# ------------------------------------------------------------ a text's operations in company

TEXT_LAYOUT = {"memory": "four", "faiss": "three", "lancedb": "five", "pgvector": "four", "turbopuffer": "three"}
STORIES = ["ROMEO:", "To be, or not to be, that is the question", "Good morrow"]


def story(engine: Engine, prompt: str, seed: int) -> list[tuple]:
    """A text's operations (an operation a stepper runs): generate 3 tokens, step back one and generate 2, retry the
    last, branch at the first generated position with its second candidate and generate 2 there, keep the text,
    resume it through a new Engine and generate 2. (tokens, prompt length, candidates by position) of the text, its
    branch and the resumed text."""
    text = Text.start(engine, tokenizer.encode(prompt), temperature=0.8, seed=seed)
    texts = [text]
    try:
        yield from text.generating(3, stop=False)
        text.step_back(len(text.tokens) - 1)
        yield from text.generating(2, stop=False)
        text.retry()
        p = text.prompt_len
        texts.append(text.branch(p, text.candidates(p)[1][0]))
        yield from texts[1].generating(2, stop=False)
        text.keep()
        texts.append(Text.resume(Engine(engine.store, model=engine.key), text.id))
        yield from texts[2].generating(2, stop=False)
        return [(list(t.tokens), t.prompt_len, dict(t._candidates)) for t in texts]
    finally:
        for t in texts[1:]:
            t.close()


def rule_on_text(model64, tokens: list[int], prompt_len: int, cands: dict, layout: str, what: str) -> None:
    """Each position's candidates within the rule against float64 numpy, fed the text's own tokens."""
    prompt, rest = tokens[:prompt_len], tokens[prompt_len:] + [0]  # one more row: the scores after the last token
    exact = tolerance.forced_logits(model64, prompt, rest)
    tol = tolerance.logit_tolerance(model64, prompt, rest, "l2", tolerance.U32, exact, layout=layout)
    for p, c in sorted(cands.items()):
        row, t = exact[p - prompt_len], tol[p - prompt_len]
        assert not tolerance.disagreements(c, row, len(c.ids), t), f"{what}, position {p}"


def test_resume_step_back_and_branch_of_texts_in_company_are_bit_exact(make_store, tiny_model, model64, backend):
    """Texts each generating, stepping back, retrying, branching and resuming at once, in one stepper, whatever
    operation the others are in: every text, branch and resumed text draws the tokens and holds the candidates
    (ids and logits, every position) that the same operations give alone, bit for bit (turbopuffer: within the
    rule). A resumed text holds the candidates its text drew from, as they were."""
    layout = TEXT_LAYOUT.get(backend) or auto_layout(backend, {})
    engine = opened(make_store, backend, tiny_model, layout)
    stories = STORIES[:2] if backend in {"lancedb", "turbopuffer"} else STORIES
    stepper = Stepper()
    jobs = [stepper.add(story(engine, s, i)) for i, s in enumerate(stories)]
    stepper.run()
    for job in jobs:
        if job.error is not None:
            raise job.error
    got = [job.result for job in jobs]
    assert max(stepper.steps) >= 2, "the texts never shared a step"
    for i, prompt in enumerate(stories):
        (tokens, _, kept), (resumed_tokens, _, restored) = got[i][0], got[i][2]
        assert resumed_tokens[: len(tokens)] == tokens
        for p in kept:
            same_bits([kept[p]], [restored[p]], f"text {i}'s candidates at {p}, resumed")
        if backend not in RULE:
            want = run_one(story(engine, prompt, i))
            for name, (a, b) in zip(("text", "branch", "resumed text"), zip(want, got[i])):
                assert a[0] == b[0], f"text {i}'s {name}: other tokens in company"
                assert a[2].keys() == b[2].keys(), f"text {i}'s {name}"
                for p in a[2]:
                    same_bits([a[2][p]], [b[2][p]], f"{backend}-{layout}, text {i}'s {name}, position {p}")
        else:
            for name, (tokens, prompt_len, cands) in zip(("text", "branch", "resumed text"), got[i]):
                rule_on_text(model64, tokens, prompt_len, cands, layout, f"text {i}'s {name}")


# ------------------------------------------------------------ a text that fails


def failing(engine: Engine, part: Part, k: int, how: str, monkeypatch, mark, got: dict):
    """`part` read in a stepper by a text that fails after its second read: its collection dropped, or the store
    raising on every call that names it. What it read and the error it met go to `got`."""
    out: list = []
    store = engine.store
    search_many, upsert = store.search_many, store.upsert
    with engine.open() as session:

        def refuse(method, names):
            def call(*args, **kwargs):
                if session.name in names(args[0]):
                    raise RuntimeError(f"injected: the store refuses {session.name}")
                return method(*args, **kwargs)

            return call

        def fail(reads: int) -> None:
            mark(reads)
            if reads == 2 and how == "dropped":
                store.drop(session.name)
            elif reads == 2:
                monkeypatch.setattr(store, "search_many", refuse(search_many, lambda ss: {s.collection for s in ss}))
                monkeypatch.setattr(store, "upsert", refuse(upsert, lambda name: {name}))

        try:
            yield from greedy(session, part, k, out, fail)
        except Exception as e:  # the test looks at it
            got.update(read=out, error=e)


@pytest.mark.parametrize(
    "backend, how", [(b, "dropped") for b in BACKENDS] + [(b, "raising") for b in ("memory", "faiss") if b in BACKENDS]
)
def test_a_text_that_fails_leaves_the_others_running_and_exact(
    make_store, tiny_model, model64, backend, how, monkeypatch
):
    """Three texts in a stepper; one fails after its second read (its collection dropped under it, or the store
    raising on its calls). It gets the error; the others read to their end, each logit bit for bit what it is
    alone (turbopuffer: within the rule), and the stepper holds no text once they end."""
    layout = auto_layout(backend, {})
    engine = opened(make_store, backend, tiny_model, layout)
    k = every_logit(engine, backend)
    doomed, others = Part(0, n=4), [Part(2), Part(4, after=1)]
    solo = [alone(engine, p, k) for p in others] if backend not in RULE else []
    sessions, failed = [engine.open() for _ in others], {}

    def start(i, mark):
        if i == 0:
            return failing(engine, doomed, k, how, monkeypatch, mark, failed)
        return greedy(sessions[i - 1], others[i - 1], k)

    stepper = Stepper()
    try:
        _, *got = stepped(stepper, [doomed, *others], start)
    finally:
        for s in sessions:
            s.close()
    assert "error" in failed, "the doomed text never failed"
    assert 2 <= len(failed["read"]) <= doomed.n, f"the text read {len(failed['read'])} times: {failed['error']!r}"
    assert not stepper.busy()
    for i, (part, cands) in enumerate(zip(others, got)):
        assert not isinstance(cands, BaseException), cands
        what = f"{backend}-{layout}, text {i + 1} beside a text {how}"
        if backend not in RULE:
            same_bits(solo[i], cands, what)
        else:
            within_rule(model64, part, cands, layout, what)


# ------------------------------------------------------------ the local turbopuffer


def test_the_local_turbopuffer_is_no_kinder_than_the_service(tmp_path):
    """The tests' server (`--float32`) sums a multi_query subquery's distance from a dimension that depends on its
    place in the request: the same query vector at places 0 to 3 gets its distances in other bits at some place
    (place 0: those of the query alone), each within the float32 bound of the exact distance."""
    turbopuffer = pytest.importorskip("turbopuffer")
    options = store_options("turbopuffer", tmp_path)
    client = turbopuffer.Turbopuffer(api_key=os.environ["TURBOPUFFER_API_KEY"], base_url=options["base_url"])
    ns = client.namespace(options["prefix"] + "places")
    rng = np.random.default_rng(7)
    x, q = (rng.standard_normal((100, 64)) * 4).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    ns.write(upsert_columns={"id": list(range(100)), "vector": x.tolist()}, distance_metric="euclidean_squared")
    try:
        sub = {"rank_by": ("vector", "kNN", q.tolist()), "top_k": 100, "filters": ["id", "Gte", 0]}
        rows = [ns.query(**sub).rows] + [r.rows for r in ns.multi_query(queries=[sub] * 4).results]
    finally:
        ns.delete_all()
    dists = np.array([[d for _, d in sorted((r.id, r["$dist"]) for r in found)] for found in rows])
    exact = ((x.astype(np.float64) - q) ** 2).sum(1)
    assert np.array_equal(dists[0], dists[1]) and not all(np.array_equal(dists[0], d) for d in dists[2:])
    assert (np.abs(dists - exact) <= encoding.gamma(64 + 3, tolerance.U32) * exact).all()


# ------------------------------------------------------------ pgvector's wide documents


def test_a_wide_pgvector_documents_parts_add_up_alike_in_any_row_order():
    """pgvector keeps a document wider than a page as rows of parts and adds up their distances (split.merge) in
    one order, whatever order a statement returned the rows in: a statement over several texts' query vectors
    may return a query's rows in another order than its statement alone. Three parts whose float64 sum rounds
    differently by order: the same bits in every order."""
    pytest.importorskip("psycopg")
    from vecgpt.backends.pgvector.split import merge

    tiny = 2.0**-53
    ids, dists = np.array([7, 7, 7, 3, 3, 3]), np.array([1.0, tiny, tiny, 0.5, tiny / 2, tiny / 2])
    assert (1.0 + tiny) + tiny != (tiny + tiny) + 1.0  # the order would show
    sums = set()
    for order in itertools.permutations(range(6)):
        rows = np.array(order)
        got_ids, got, _ = merge(
            [(ids[rows[:2]], dists[rows[:2]], None), (ids[rows[2:]], dists[rows[2:]], None)], None, 3
        )
        assert got_ids.tolist() == [3, 7]
        sums.add(got.tobytes())
    assert len(sums) == 1


# ------------------------------------------------------------ prompts read in chunks


def test_chunks_end_where_the_text_says():
    """A read's chunks end at positions that are multiples of the size, counted from the text's start, wherever
    the read began: the same positions whatever else is read."""
    assert chunks(list(range(10)), 0, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert chunks(list(range(10, 16)), 10, 4) == [[10, 11], [12, 13, 14, 15]]
    assert chunks([7], 5, 4) == [[7]] and chunks([], 3, 4) == []
    assert chunks(list(range(5)), 0, 64) == [list(range(5))]


@pytest.mark.parametrize("backend", [b for b in ("memory", "faiss") if b in BACKENDS])
def test_prompts_read_in_chunks_beside_decoding_texts_are_bit_exact(make_store, tiny_model, backend):
    """Prompts of 1 token to the whole context but the tokens drawn, read 8 tokens a step beside texts that decode:
    every text's candidates (every logit) as alone, and a step held rows of a chunk and of decoding texts at once."""
    store = make_store(backend)
    push(store, tiny_model, "l2", progress=False, layout="five")
    key = store_fingerprint(tiny_model, "l2", "five")
    engine, n_ctx = Engine(store, model=key, prefill_chunk=8), tiny_model.hparams.n_ctx
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 50000, size=n).tolist() for n in (1, 5, 8, 9, 23, n_ctx - 3)]

    def drawn(stepper: Stepper) -> list[dict]:
        texts = [Text.start(engine, p, temperature=0.0, top_k=engine.hparams.n_vocab) for p in prompts]
        jobs = [stepper.add(t.generating(3, stop=False)) for t in texts]
        stepper.run()
        try:
            assert all(job.error is None for job in jobs), [job.error for job in jobs]
            return [dict(t._candidates) for t in texts]
        finally:
            for t in texts:
                t.close()

    solo = []
    for p in prompts:
        with Text.start(engine, p, temperature=0.0, top_k=engine.hparams.n_vocab) as t:
            t.generate(3, stop=False)
            solo.append(dict(t._candidates))
    sizes: list[int] = []
    search_many = store.search_many

    def spy(searches):
        sizes.extend(len(s.queries) for s in searches if s.collection.endswith("h.0.mlp.c_fc"))
        return search_many(searches)

    store.search_many = spy
    together = drawn(Stepper())
    assert max(sizes) > 8, sizes  # a step held a chunk's 8 rows and more: chunks and other texts' rows at once
    for i, (a, b) in enumerate(zip(solo, together)):
        assert a.keys() == b.keys()
        for p in a:
            same_bits([a[p]], [b[p]], f"{backend}: a {len(prompts[i])}-token prompt, position {p}")
