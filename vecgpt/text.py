"""A text: a prompt and the tokens drawn after it, kept in the store so that any process can continue it.

Its keys and values are rows of the collection text-<id> (the engine's Session writes them as it reads); the
candidates each generated position was drawn from are rows of text-<id>.c (vecgpt.candidates). Beside them the store
files the text's small record (vecgpt.text_record): its model, sampling settings, tokens, `written` (positions <
written have their keys and values in the store), `scored` (generated positions < scored have their candidates
there) and `spent` (what its operations sent).

Writes stay off the token's path. A token's keys go out with the session's next round, or from the writer's own
thread (vecgpt.writer). Its candidates row waits: the rows go out together, one upsert every FLUSH_EVERY tokens and at
the end of each operation. A record is queued once rows beyond what the last one claims have been acknowledged, and
claims only acknowledged rows: the tokens up to the first whose candidates are not stored, `written` no further
than their keys. So a record never names what the store lacks, and kill -9 loses only the tokens after the last
record (at most FLUSH_EVERY + 2 where writes ride with the rounds); a resume reads those again as they were first
read, and equals the uninterrupted run token for token and logit for logit.

Every operation takes the text (a lock where the store has one), first catches up with what another process wrote,
and leaves the store complete: its rows landed, then a record that claims them all. Each record write is
conditional on the version read, so two processes never interleave edits.

Positions are 0-based: tokens[p] was drawn from candidates(p), the scores after reading tokens[:p].
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager, nullcontext, suppress

import numpy as np

from vecgpt import tokenizer
from vecgpt.branching import child_of
from vecgpt.candidates import CANDIDATES, FLUSH_EVERY, CandidateRows, fetch, new_session
from vecgpt.engine import Engine, Inspection, Read, Session, chunks
from vecgpt.errors import VecgptError
from vecgpt.loading import no_space
from vecgpt.meter import SESSION_PREFIX, summarize
from vecgpt.policy import Policy, from_settings
from vecgpt.sampling import Candidates, choose, draw
from vecgpt.stepper import run_one
from vecgpt.text_record import (
    Record,
    check_context,
    check_kernel,
    check_tokens,
    disk_full,
    gc_texts,
    list_texts,
    new_record,
    operation_cost,
    read_record,
    remove,
)

__all__ = ["CANDIDATES", "FLUSH_EVERY", "Text", "gc_texts", "list_texts", "read_record", "remove"]


class Text:
    """A text open in this process; its state is the store's, this object caches it."""

    def __init__(self, engine: Engine, text_id: str, record: dict, session: Session):
        self.engine, self.store, self.id, self.session = engine, engine.store, text_id, session
        self.cost: dict = {}  # the last operation's requests, rounds and positions read
        self.kept = False
        self.resumed = False  # set by resume: `unread` then counts positions read again
        self.tokenizer = tokenizer.of_manifest(engine.manifest)  # the model's, which its manifest names
        self._take(record)
        session.policy = from_settings(self.settings)  # a record from before a field: that field unset

    # ------------------------------------------------------------ opening

    @classmethod
    def start(
        cls,
        engine: Engine,
        prompt: list[int],
        temperature: float = 0.0,
        top_k: int | None = None,
        seed: int = 0,
        attention_top_k: int | None = None,
        policy: Policy | None = None,
    ):
        """A new text holding the prompt; nothing is read until the first `generate`. `attention_top_k`: its
        queries' K (None: the engine's); `policy`: its whole attention policy (vecgpt.policy.Policy, in place of
        the engine's); either kept in its record for as long as it lives."""
        if not prompt:
            raise VecgptError("the prompt is empty; give at least one token")
        check_tokens(engine, prompt)
        tokenizer.of_manifest(engine.manifest)  # a tokenizer.json gone or changed is refused before a write
        record = new_record(engine, prompt, temperature, top_k, seed, attention_top_k, policy)
        text_id = uuid.uuid4().hex[:12]
        version = engine.store.write_text(text_id, record, None)  # first, so `texts gc` finds all that follows
        session = new_session(engine, SESSION_PREFIX + text_id, record["settings"]["top_k"])
        return cls(engine, text_id, {**record, "version": version}, session)

    @classmethod
    def resume(cls, engine: Engine, text_id: str, record: dict | None = None) -> Text:
        """Continue a text from the store (`record`: its record, if just read): the positions its record claims are
        fetched once, the rest read again."""
        record = record or read_record(engine.store, text_id)
        if record["model"] != engine.key:
            raise VecgptError(f"text {text_id} runs model {record['model']}, not {engine.key}")
        check_kernel(engine, text_id, record)
        text = cls(engine, text_id, record, engine.session(SESSION_PREFIX + text_id, create=False))
        if record["written"] or record["scored"] > record["prompt_len"]:  # else nothing was read: nothing to fetch
            text._restore(record)
            text.resumed = True
        return text

    def _restore(self, record: dict) -> None:
        """The state a record names, from the store in one round: keys, values and candidates."""
        scored = np.arange(record["prompt_len"], record["scored"])
        self.session.truncate(0)
        (rows,) = self.session.restore(record["tokens"][: record["written"]], fetch(self.session.name, scored))
        self._take(record)
        self.rows.take(scored, rows[1])

    def _take(self, record: dict) -> None:
        self._record = Record(self.id, record, self.session)
        self.tokens: list[int] = list(record["tokens"])
        self.prompt_len: int = record["prompt_len"]
        self.settings: dict = dict(record["settings"])
        self.rows = CandidateRows(self.session, record["scored"], record["prompt_len"])

    @property
    def record(self) -> dict:
        """The record as this process last read or wrote it (vecgpt.text_record)."""
        return self._record.fields

    def spent(self) -> dict:
        """What the text's operations have sent, in every process that ran them (the record's `spent`: up to
        its own write)."""
        return self._record.spent.now()

    # ------------------------------------------------------------ reading

    @property
    def _candidates(self) -> dict[int, Candidates]:
        return self.rows.known

    @property
    def unread(self) -> int:
        """Tokens before the last one that this process has not read (after a resume: read again)."""
        return max(0, len(self.tokens) - 1 - self.session.position)

    def candidates(self, p: int) -> list[list] | None:
        """[id, logit, text] best first: what position p was drawn from (generated positions only)."""
        c = self.rows.known.get(p)
        return None if c is None else [[int(i), float(x), self.tokenizer.decode([int(i)])] for i, x in zip(*c)]

    def generate(self, n: int, on_token=None, stop: bool = True) -> list[int]:
        """Draw n tokens (fewer if one is <|endoftext|> and `stop`); `on_token(position, token, candidates)`
        is called as each is chosen. Returns the tokens drawn. The text steps alone (vecgpt.stepper)."""
        return run_one(self.generating(n, on_token, stop))

    def generating(self, n: int, on_token=None, stop: bool = True):
        """`generate` as an operation a stepper runs beside other texts': it yields each read it needs (engine.Read)
        and is sent back that read's candidates; it returns the tokens drawn."""
        if n < 0:
            raise VecgptError(f"-n must be 0 or more, not {n}")
        with self._operation():
            check_context(self.engine, self.tokens, n)
            drawn = []
            for _ in range(n):
                p = len(self.tokens)
                scores = yield from self._scores(p)
                token = choose(scores, self.settings["temperature"], self.settings["top_k"], self._draw(p))
                self.tokens.append(token)
                drawn.append(token)
                self._record.keep_up(self.tokens, self.settings, self.rows)
                if on_token is not None:
                    on_token(p, token, self.candidates(p))
                if stop and token == self.tokenizer.eos:
                    break
            return drawn

    def _scores(self, p: int):
        """The candidates for position p (an operation: it yields its reads), read only if not known; a new row."""
        if p not in self.rows.known:
            self.rows.add(p, (yield from self._read(p)))
        return self.rows.known[p]

    def _read(self, p: int):
        """The candidates for position p, read (tokens[:p] must all have been read before) as they were first read:
        the prompt in the engine's chunks, later tokens one at a time, so that a text resumed after kill -9 computes
        exactly what the uninterrupted one did."""
        session = self.session
        start = min(session.position, p - 1)  # the last token is read again if its scores were lost
        session.truncate(start)
        split = min(max(start, self.prompt_len), p)
        prompt = chunks(self.tokens[start:split], start, self.engine.chunk_size)  # a prompt's last chunk, and
        k = self.settings["top_k"]  # each later token, end with a token search
        reads = [(c, k if j == len(prompt) - 1 else None) for j, c in enumerate(prompt)]
        session.check_room(p - start)
        for piece, wanted in reads + [([t], k) for t in self.tokens[split:p]]:
            if session.meter.current["rounds"].get("token_search"):  # a read ended: the next token's
                session.meter.start_token()
            cands = yield Read(session, piece, wanted)
        return cands

    def inspect(self, p: int) -> Inspection:
        """Attention's weights and the logit lens at position p (0-based, prompt included): the token read again
        as the text read it, nothing written (Session.inspect). Its requests are counted in `cost`."""
        with self._operation():
            if not 0 <= p < len(self.tokens):
                raise VecgptError(f"position {p} is beyond the text: its positions are 0 to {len(self.tokens) - 1}")
            run_one(self._read_to(p))
            return self.session.inspect(p, self.tokens[p])

    def _read_to(self, p: int):
        """Positions before p read in this process: a resumed text reads again those it lacks, as `generate`
        would; candidates it knows stay as they were."""
        if p > self.session.position:
            q = max(p, self.prompt_len)
            cands = yield from self._read(q)
            if q not in self.rows.known:
                self.rows.add(q, cands)

    def _draw(self, p: int) -> float:
        return draw(self.settings["seed"], p)

    # ------------------------------------------------------------ editing

    def step_back(self, p: int) -> None:
        """Cut the text to tokens[:p]; the next token drawn is position p again. Nothing is read."""
        with self._operation():
            if not 1 <= p <= len(self.tokens):
                raise VecgptError(f"step back to a position from 1 to {len(self.tokens)}, not {p}")
            self.tokens = self.tokens[:p]
            self.rows.cut(p)
            self.session.truncate(min(self.session.position, p))

    def retry(self, seed: int | None = None) -> int:
        """Draw the last token again with another seed (the next one when not given); nothing is read.
        Later draws use that seed too."""
        with self._operation():
            p = len(self.tokens) - 1
            if p not in self.rows.known:
                raise VecgptError("retry needs a generated token at the end of the text; generate one first")
            self.settings["seed"] = self.settings["seed"] + 1 if seed is None else int(seed)
            self.tokens[p] = choose(
                self.rows.known[p], self.settings["temperature"], self.settings["top_k"], self._draw(p)
            )
            self.session.truncate(min(self.session.position, p))
            return self.tokens[p]

    def branch(self, p: int, token: int) -> Text:
        """A new text: tokens[:p] and then `token`. It shares positions before p: the store copies their rows
        inside itself (`clone`), so only positions from p on are ever read for it (vecgpt.branching)."""
        check_tokens(self.engine, [token])
        with self._operation():
            if not self.prompt_len <= p < len(self.tokens):
                raise VecgptError(f"branch at a generated position, from {self.prompt_len} to {len(self.tokens) - 1}")
            before = summarize(self.session.meter.tokens)
            child = child_of(self, p, token)
            child.cost = operation_cost(before, summarize(self.session.meter.tokens), 0)
        self.cost = child.cost
        return child

    # ------------------------------------------------------------ the record

    @contextmanager
    def _operation(self):
        lock = getattr(self.store, "text_lock", None)
        before, read = summarize(self.session.meter.tokens), self.session.positions_read
        try:
            with lock(self.id) if lock else nullcontext():
                self._catch_up()
                try:
                    yield
                    self._record.commit(self.tokens, self.settings, self.rows)
                except BaseException:
                    with suppress(Exception):  # Ctrl-C: what was drawn so far lands, with a record that claims it
                        self._record.commit(self.tokens, self.settings, self.rows)
                    raise
        except Exception as e:
            if no_space(e):
                raise disk_full(self.store, self.id, self.kept) from None
            raise
        finally:
            after = summarize(self.session.meter.tokens)
            self.cost = operation_cost(before, after, self.session.positions_read - read)

    def _catch_up(self) -> None:
        """Re-read the text if another process changed it since this one last wrote it."""
        held = self._record.changed()
        if held is not None:
            self._restore(held)

    # ------------------------------------------------------------ closing

    def keep(self) -> str:
        """Leave the text in the store for any process (`Text.resume`); its id."""
        self.kept = True
        return self.id

    def close(self) -> None:
        """Remove the text's rows and record from the store."""
        remove(self.store, self.id)

    def __enter__(self) -> Text:
        return self

    def __exit__(self, *exc) -> None:
        if not self.kept:
            self.close()
