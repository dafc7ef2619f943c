"""Texts in flight on one model advance together, a step at a time, in one thread (continuous batching).

A text's operation (`Text.generating`: generate tokens; reading a prompt) is a generator that yields each read it
needs (engine.Read: a chunk of its prompt, or its one new token) and gets back that read's candidates. The stepper
plays the scheduler of a serving engine: each `step` admits waiting operations (at most `at_once` in flight), picks
the reads it runs, runs them as one engine.Step (one block of rows: each matrix one search for all the texts, each
text's keys searched in its own collection in the same round), and hands each its result. Texts join and leave
between steps; nothing waits on a timer. A prompt is read in chunks (Engine.chunk_size), so a long prompt does not
hold up the texts that decode. A text alone is a stepper of one, on the same path.

Which reads a step runs (`scheduled`), its rows within `budget` (at least one read): every decode step, then prompt
chunks in the order their texts came. But a text that arrives while others decode does not wait out a whole step
of theirs for its first token: in a step after one that read the decode steps, the reads that end a prompt (its
last chunk, which gives the text its first token) run alone, a short step, and the decode steps come in the next.
So texts decoding read at least every other step, and a newcomer's first token comes in the second step from its
arrival (the one running then included), a short one unless the first was.

>>> stepper = Stepper(at_once=16)
>>> jobs = [stepper.add(text.generating(20)) for text in texts]
>>> stepper.run()          # jobs[i].result: what text i's generating returned (or jobs[i].error)
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Generator


class Job:
    """One text's operation in a stepper: its generator, the read it waits for, and how it ended."""

    def __init__(self, operation: Generator, on_end=None):
        self.operation, self.on_end = operation, on_end
        self.read = None  # the engine.Read it waits for
        self.done, self.result, self.error = False, None, None
        self.came = 0  # the steps its stepper had run when it was added

    def advance(self, answer=None) -> None:
        """Hand the operation its read's answer (an error is raised in it); it runs to its next read, or ends."""
        try:
            if isinstance(answer, BaseException):
                self.read = self.operation.throw(answer)
            else:
                self.read = self.operation.send(answer)
        except StopIteration as stop:
            self.finish(stop.value, None)
        except Exception as e:  # this text fails; the others go on
            self.finish(None, e)

    def finish(self, result, error) -> None:
        self.done, self.read, self.result, self.error = True, None, result, error
        if self.on_end is not None:
            self.on_end(self)

    def close(self) -> None:
        """Stop the operation where it is (Ctrl-C): it leaves its text as the store holds it."""
        if not self.done:
            self.operation.close()
            self.done = True


BUDGET = 256  # rows a step reads at most (a decode step is one row, a prompt's chunk up to engine.PREFILL_CHUNK)


class Stepper:
    """Operations of texts on one engine, stepped together."""

    def __init__(self, at_once: int = 16, on_step=None, budget: int = BUDGET):
        """on_step(jobs): called after each step with the jobs whose reads it ran (the throughput experiment's).
        budget: the rows a step reads at most (one read always runs, however long)."""
        self.at_once, self.on_step, self.budget = at_once, on_step, budget
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.steps = Counter()  # steps run, by the number of texts in them
        self.ahead = False  # the last step read only the reads that end a prompt, others waiting
        self.ended = 0  # steps run to their end
        # a text's first token: the steps from its operation's arrival to the one that read its prompt's last chunk,
        # that one and the one running as it came included -> how many times
        self.first_tokens = Counter()

    def add(self, operation: Generator, on_end=None) -> Job:
        """An operation to start at the next step with room for it."""
        job = Job(operation, on_end)
        job.came = self.ended
        self.waiting.append(job)
        return job

    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> None:
        """Admit what fits, then one forward pass over the chosen running texts' next reads."""
        while self.waiting and len(self.running) < self.at_once:
            job = self.waiting.popleft()
            job.advance()  # runs to its first read (or ends at once: nothing to read)
            if not job.done:
                self.running.append(job)
        if not self.running:
            return
        chosen = self.scheduled()
        firsts = [ends_prompt(job.read) for job in chosen]
        answers = chosen[0].read.session.step([job.read for job in chosen]).run()
        self.steps[len(chosen)] += 1
        if self.on_step is not None:
            self.on_step(chosen)
        for job, answer, first in zip(chosen, answers, firsts):
            if first and not isinstance(answer, BaseException):
                self.first_tokens[self.ended + 1 - job.came] += 1
            job.advance(answer)
        self.running = [job for job in self.running if not job.done]
        self.ended += 1

    def scheduled(self) -> list[Job]:
        """The jobs whose reads this step runs, within the budget: the reads that end a prompt alone (oldest first) if
        the last step read the others and they still wait; else every decode step, then prompt chunks oldest first."""
        ending = [job for job in self.running if ends_prompt(job.read)]
        self.ahead = bool(ending) and len(ending) < len(self.running) and not self.ahead
        if self.ahead:
            return within(ending, self.budget)
        return within(sorted(self.running, key=lambda j: len(j.read.ids) > 1), self.budget)  # stable: decodes first

    def run(self) -> None:
        """Step until every operation has ended; cut short (Ctrl-C), every operation is closed first."""
        try:
            while self.busy():
                self.step()
        except BaseException:
            for job in [*self.running, *self.waiting]:
                job.close()
            raise


def ends_prompt(read) -> bool:
    """A read of a prompt's last chunk (or of a one-token prompt), which gives its text its first token's candidates;
    not a decode step's one new token, nor a prompt's earlier chunk."""
    start = read.session.position if read.start is None else read.start
    return read.k is not None and (len(read.ids) > 1 or start == 0)


def within(jobs: list[Job], budget: int) -> list[Job]:
    """The jobs, in order, whose reads fit the budget of rows together (one that does not is left out, and later
    ones may still fit); at least the first."""
    rows, chosen = 0, []
    for job in jobs:
        if chosen and rows + len(job.read.ids) > budget:
            continue
        chosen.append(job)
        rows += len(job.read.ids)
    return chosen


def run_one(operation: Generator):
    """One operation, stepped alone: its result, or its error raised."""
    stepper = Stepper(at_once=1)
    job = stepper.add(operation)
    stepper.run()
    if job.error is not None:
        raise job.error
    return job.result


class Service:
    """A stepper run by a thread of its own for callers in other threads (the playground's pages): `run` hands in
    an operation and waits for its end, while the operations of every caller step together.

    A page hands in each token as an operation of its own, so its text leaves the stepper between two tokens. By
    default no count of texts caps a step, only the budget of rows: with at most 16, a 17th page was left out of a
    step in turn, and a newcomer queued behind the texts handing in their next token, a step later."""

    def __init__(self, at_once: int = BUDGET):
        self.stepper, self.cond = Stepper(at_once), threading.Condition()
        self.thread: threading.Thread | None = None

    def run(self, operation: Generator):
        """The operation's result once it has been stepped to its end with the others (its error raised)."""
        ended = threading.Event()
        with self.cond:
            job = self.stepper.add(operation, lambda _: ended.set())
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="vecgpt-stepper", daemon=True)
                self.thread.start()
            self.cond.notify_all()
        ended.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def idle(self) -> bool:
        return not self.stepper.busy()

    def _loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(self.stepper.busy)
            try:
                self.stepper.step()
            except BaseException as e:  # a fault of the stepper's own: every text in it gets it, none waits on
                for job in [*self.stepper.running, *self.stepper.waiting]:
                    job.finish(None, e if isinstance(e, Exception) else RuntimeError(repr(e)))
                self.stepper.running, self.stepper.waiting = [], deque()
