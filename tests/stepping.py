"""Texts read alone and stepped together (vecgpt.stepper), for tests that hold the two to the same bits."""

from __future__ import annotations

import numpy as np

from vecgpt.engine import Read
from vecgpt.stepper import Stepper


def reading(session, prompt: list[int], n: int, k: int | None = None, out: list | None = None):
    """An operation: the prompt, then n tokens each the best of the last read; every read's candidates."""
    out = [] if out is None else out
    c = yield Read(session, prompt, k or session.engine.top_k)
    for _ in range(n):
        out.append(c)
        c = yield Read(session, [int(c.ids[0])], k or session.engine.top_k)
    return out


def assert_alone_as_together(engine, prompts: list[list[int]], n: int, k: int) -> Stepper:
    """Each prompt and its n greedy tokens read by a text alone, then by another text beside the others in one
    stepper: every read's candidate ids and logits (k of them) equal, bit for bit. The stepper that ran them all."""
    sessions = [engine.open() for _ in range(2 * len(prompts))]
    alone = []
    for p, s in zip(prompts, sessions):
        one = Stepper(at_once=1)
        job = one.add(reading(s, p, n, k))
        one.run()
        alone.append(job.result)
    stepper = Stepper()
    jobs = [stepper.add(reading(s, p, n, k)) for p, s in zip(prompts, sessions[len(prompts) :])]
    stepper.run()
    for solo, job in zip(alone, jobs):
        assert len(solo) == len(job.result) == n
        for a, b in zip(solo, job.result):
            assert np.array_equal(a.ids, b.ids) and np.array_equal(a.logits, b.logits)
    for s in sessions:
        s.close()
    return stepper
