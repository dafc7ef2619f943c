"""The stepper's scheduler: a step reads at most its budget of rows (decode steps first, then prompt chunks in the
order their texts came), a read left out waits, and every text still ends with the bits it computes alone."""

from __future__ import annotations

import numpy as np

from vecgpt.engine import Engine
from vecgpt.loading import push
from vecgpt.stepper import Stepper, run_one


def prompt(i: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(i).integers(0, 1000, n)]


def greedy(session, ids: list[int], n: int):
    """Read the prompt, then n greedy tokens: every read's candidates, as an operation for a stepper."""
    out = [(yield from session.reading(ids))]
    for _ in range(n):
        out.append((yield from session.reading([int(out[-1].ids[0])])))
    return out


def test_prompts_arriving_together_are_read_within_the_budget_and_exact(make_store, tiny_model):
    store = make_store("memory")
    push(store, tiny_model, "ip", progress=False, layout="five")
    engine = Engine(store, prefill_chunk=16)
    prompts = [prompt(i, 40) for i in range(8)]  # 8 texts x 3 chunks: 320 rows were one step without a budget
    rows_by_step: list[int] = []
    stepper = Stepper(
        at_once=8, budget=40, on_step=lambda jobs: rows_by_step.append(sum(len(j.read.ids) for j in jobs))
    )
    jobs = [stepper.add(greedy(engine.open(), p, 3)) for p in prompts]
    stepper.run()
    assert max(rows_by_step) <= 40 and len(rows_by_step) > 4
    for p, job in zip(prompts, jobs):
        assert job.error is None
        alone = run_one(greedy(engine.open(), p, 3))
        for got, want in zip(job.result, alone):
            assert np.array_equal(got.ids, want.ids) and np.array_equal(got.logits, want.logits)


def test_a_decoding_text_reads_every_step_while_a_long_prompt_waits_its_turn(make_store, tiny_model):
    store = make_store("memory")
    push(store, tiny_model, "ip", progress=False, layout="five")
    engine = Engine(store, prefill_chunk=16)
    ran: list[set] = []
    stepper = Stepper(at_once=4, budget=17, on_step=lambda jobs: ran.append({id(j) for j in jobs}))
    first = stepper.add(greedy(engine.open(), prompt(0, 3), 6))
    stepper.step()  # the first text's prompt
    later = [stepper.add(greedy(engine.open(), prompt(i, 48), 1)) for i in (1, 2)]
    stepper.run()
    decoding = [steps for steps in ran[1:7]]
    assert all(id(first) in steps for steps in decoding)  # a decode step is never left out
    assert all(len(steps) <= 2 for steps in ran[1:])  # one prompt chunk (16 rows) fits beside it, not two
    assert first.error is None and all(j.error is None for j in later)
