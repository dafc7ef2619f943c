"""The playground under load, over HTTP on the shipped model: texts generated at once each get, bit for bit, the
tokens and candidates' logits of their runs alone, stepped together (vecgpt.stepper); a page arriving mid-batch
gets its first token at most two steps after its generation is handed in (counted by the stepper), and its tokens
also while every text of the batch is held between two of its tokens; and a page closed, a text deleted, the
stores listed and idle texts collected mid-generation hold up no one. Nothing here is timed:
benchmarks/playground_load.py (the same functions) measures."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from vecgpt.playground.server import Settings

from browser import Running

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import playground_load as load  # noqa: E402

N = 6  # tokens each text of a batch draws
WAIT_S = 120  # a thread still running after this is stuck: the test fails instead of hanging


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The shipped model on a fresh FAISS folder; no request rate in the way of 50 requests a second."""
    pytest.importorskip("faiss")
    folder = tmp_path_factory.mktemp("load") / "faiss"
    server = Running(Settings(store=str(folder), rate_per_s=1e5, burst=1e6))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def alone(served):
    """Each of 17 texts generated alone: (settings, pages)."""
    chosen = load.settings(17)
    solo, _ = load.in_turn(served.url, chosen, N)
    for page in solo:
        load.close(served.url, page)
        assert len(page.tokens) == N and len(page.candidates) == N and page.ended == "done", page
    return chosen, solo


def closed(url: str, pages: list) -> None:
    for page in pages:
        if page.text_id:
            load.close(url, page)


def settled(server) -> None:
    """Every generation has left its store's steppers (waited for, at most WAIT_S)."""
    shelf, deadline = server.library.shelves[0], time.monotonic() + WAIT_S
    while not shelf.idle():
        assert time.monotonic() < deadline, "texts still in a stepper"
        time.sleep(0.05)


def test_sixteen_texts_at_once_get_their_solo_tokens_and_a_page_arriving_mid_batch_its_own(served, alone):
    (chosen, solo), shelf = alone, served.library.shelves[0]
    for service in shelf.services.values():
        service.stepper.steps.clear()
        service.stepper.first_tokens.clear()
    pages, _, late = load.at_once(served.url, chosen[:16], N, newcomer=chosen[16])
    closed(served.url, [*pages, late])
    assert load.differing(pages, solo[:16]) == [] and [p.ended for p in pages] == ["done"] * 16
    assert late.drawn == solo[16].drawn and late.ended == "done"  # started when half the batch's tokens were in
    steps = sum((service.stepper.steps for service in shelf.services.values()), Counter())
    assert max(steps) > 1, steps  # texts did read together: one step for several
    # each page's first token, the newcomer's too: read in the step after the one running as it was handed in
    firsts = sum((service.stepper.first_tokens for service in shelf.services.values()), Counter())
    assert firsts.total() == 17 and max(firsts) <= 2, firsts
    settled(served)


def test_a_page_gets_its_first_token_while_every_text_of_a_batch_waits_between_two_tokens(served, alone):
    """16 texts each held before its third token (joined, between reads): a newcomer's reads go on without them."""
    (chosen, solo), arrived, calls = alone, threading.Event(), Counter()

    def hold(position: int) -> None:  # before each token, in the text's generating thread
        calls[threading.get_ident()] += 1
        if calls[threading.get_ident()] == 3:
            arrived.wait(WAIT_S)

    pages, late = [load.Page(s) for s in chosen[:16]], load.Page(chosen[16])
    served.app.state.before_token = hold
    try:
        threads = [threading.Thread(target=load.one, args=(served.url, p, N), daemon=True) for p in pages]
        for t in threads:
            t.start()
        deadline = time.monotonic() + WAIT_S
        while min(len(p.tokens) for p in pages) < 2:
            assert time.monotonic() < deadline, [len(p.tokens) for p in pages]
            time.sleep(0.01)
        held = [len(p.tokens) for p in pages]
        load.one(served.url, late, N, on_token=lambda page: arrived.set())
        for t in threads:
            t.join(WAIT_S)
        assert not any(t.is_alive() for t in threads), "a text of the batch never finished"
    finally:
        arrived.set()
        served.app.state.before_token = None
    closed(served.url, [*pages, late])
    assert held == [2] * 16  # the whole batch was between its second and third tokens when the newcomer came
    assert late.drawn == solo[16].drawn and load.differing(pages, solo[:16]) == []
    settled(served)


def test_a_page_closed_or_a_text_deleted_mid_generation_holds_up_no_one(served, alone):
    """Six texts at once: one page goes away after two tokens, another's text is deleted after two; meanwhile the
    stores are listed and idle texts collected (each holds the store alone). The other four get their solo tokens,
    and every generation leaves its stepper."""
    (chosen, solo), url = alone, served.url
    pages = [load.Page(s) for s in chosen[:6]]
    gone, deleted = pages[0], pages[1]

    def acting(page: load.Page) -> bool:
        if page is deleted and len(page.tokens) == 2:
            load.close(url, page)
            load.call(f"{url}/api/stores")
            served.library.collect()
        return page is gone and len(page.tokens) == 2  # True: the page closes its stream

    threads = [threading.Thread(target=load.one, args=(url, p, N, acting), daemon=True) for p in pages[2:]]
    threads += [threading.Thread(target=generate_only, args=(url, p, acting), daemon=True) for p in pages[:2]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads), "a page never got to the end of its stream"
    settled(served)
    closed(url, [gone, *pages[2:]])
    assert gone.ended == "closed" and len(gone.tokens) == 2
    assert deleted.ended.startswith("error") and "closed" in deleted.ended, deleted.ended
    assert load.differing(pages[2:], solo[2:6]) == [] and [p.ended for p in pages[2:]] == ["done"] * 4


def generate_only(url: str, page, on_token) -> None:
    """Asks for far more tokens than it reads: its text is still generating when the page acts."""
    load.generate(url, load.start(url, page), 10 * N, on_token)
