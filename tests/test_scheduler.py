"""The stepper's scheduler: a step reads at most its budget of rows (decode steps first, then prompt chunks in the
order their texts came), a read left out waits, a read that ends a prompt steps ahead of the decode steps in a step
of its own (a newcomer's first token two steps after it came, counting steps, not seconds), and every text still
ends with the bits it computes alone."""

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


def same_as_alone(engine, prompts, jobs) -> None:
    for p, job in zip(prompts, jobs):
        assert job.error is None
        alone = run_one(greedy(engine.open(), p, len(job.result) - 1))
        for got, want in zip(job.result, alone, strict=True):
            assert np.array_equal(got.ids, want.ids) and np.array_equal(got.logits, want.logits)


def test_a_decoding_text_reads_at_least_every_other_step_while_long_prompts_are_read(make_store, tiny_model):
    store = make_store("memory")
    push(store, tiny_model, "ip", progress=False, layout="five")
    engine = Engine(store, prefill_chunk=16)
    ran: list[dict] = []  # per step: job id -> (rows, wants candidates)
    stepper = Stepper(at_once=4, budget=17, on_step=lambda jobs: ran.append({id(j): j.read[1:3] for j in jobs}))
    first = stepper.add(greedy(engine.open(), prompt(0, 3), 6))
    stepper.step()  # the first text's prompt
    prompts = [prompt(i, 48) for i in (1, 2)]  # 3 chunks of 16 each
    later = [stepper.add(greedy(engine.open(), p, 1)) for p in prompts]
    stepper.run()
    reading = [id(first) in step for step in ran[1:]]
    last = len(reading) - reading[::-1].index(True)  # the steps up to the first text's last read
    assert all(a or b for a, b in zip(reading[:last], reading[1:last]))  # never left out of two steps in a row
    assert all(sum(len(ids) for ids, _ in step.values()) <= 17 for step in ran)  # a chunk fits beside it, not two
    endings = [step for step in ran[1:] if any(len(ids) > 1 and k for ids, k in step.values())]
    assert len(endings) == 2 and all(len(step) == 1 for step in endings)  # each prompt's last chunk: a step alone
    same_as_alone(engine, [prompt(0, 3), *prompts], [first, *later])


def test_a_newcomer_gets_its_first_token_two_steps_after_it_came_mid_step(make_store, tiny_model):
    """16 texts decode; a newcomer comes while a step runs: the next step reads its prompt alone, so its first
    token is read in the second step counted from its coming (the running one included), and the decoding texts
    read in the step after. A second newcomer, coming during that short step, joins the next with them."""
    store = make_store("memory")
    push(store, tiny_model, "ip", progress=False, layout="five")
    engine = Engine(store)
    prompts = [prompt(i, 3 + i % 4) for i in range(18)]
    jobs, ran = {}, []  # prompt index -> its job; per step: the prompt indices of the texts it read

    def on_step(chosen) -> None:  # in the step, after its forward pass: what is added comes while a step runs
        ran.append(sorted(i for i, job in jobs.items() for c in chosen if c is job))
        if len(ran) in (3, 4):
            jobs[13 + len(ran)] = stepper.add(greedy(engine.open(), prompts[13 + len(ran)], 2))

    stepper = Stepper(at_once=32, on_step=on_step)
    jobs.update({i: stepper.add(greedy(engine.open(), p, 4)) for i, p in enumerate(prompts[:16])})
    stepper.run()
    batch = list(range(16))
    assert ran[:3] == [batch] * 3  # the prompts together, then two decode steps; the first newcomer comes in the 3rd
    assert ran[3] == [16]  # its prompt alone: its first token; the second newcomer comes meanwhile
    assert ran[4] == [*batch, 16, 17]  # the decoding texts, the first newcomer's next read, the second's prompt
    assert stepper.first_tokens == {1: 16, 2: 2}  # the batch's in the first step; each newcomer's in its second
    same_as_alone(engine, prompts, [jobs[i] for i in range(18)])
