"""A text: a prompt and the tokens drawn after it, kept in the store so that any process can continue it.

Its keys and values are rows of the collection text-<id> (the engine's Session writes them as it reads);
the candidates each generated position was drawn from are rows of text-<id>.c (one row a position,
appended, never rewritten). Beside them the store files the text's small record: its model, sampling
settings, tokens, `written` (positions < written have their keys and values in the store), `scored`
(generated positions < scored have their candidates there) and `spent` (what its operations sent). A record
claims only rows that were acknowledged before it was sent, so after kill -9 it never names what the store lacks.

Every operation takes the text (a lock where the store has one), first catches up with what another
process wrote, and leaves the store complete; each record write is conditional on the version read, so two
processes never interleave edits. Steady decoding adds no round trip: a step's writes go out in order
beside the next step's searches (vecgpt.writer); an operation ends when they have landed and the record is exact.

Positions are 0-based: tokens[p] was drawn from candidates(p), the scores after reading tokens[:p].
"""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager, nullcontext, suppress

import numpy as np

from vecgpt import tokenizer
from vecgpt.engine import Engine, Inspection, Read, Session, chunks
from vecgpt.errors import VecgptError
from vecgpt.meter import SESSION_PREFIX, later, summarize
from vecgpt.sampling import Candidates, choose, draw
from vecgpt.stepper import run_one

CANDIDATES = ".c"  # text-<id>.c: a row a generated position, its candidates as `pack` lays them out


class Text:
    """A text open in this process; its state is the store's, this object caches it."""

    def __init__(self, engine: Engine, text_id: str, record: dict, session: Session):
        self.engine, self.store, self.id, self.session = engine, engine.store, text_id, session
        self.cost: dict = {}  # the last operation's requests, rounds and positions read
        self.kept = False
        self.resumed = False  # set by resume: `unread` then counts positions read again
        self._take(record)
        session.attention_top_k = self.settings.get("attention_top_k")  # a record from before it: every key

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
    ):
        """A new text holding the prompt; nothing is read until the first `generate`. `attention_top_k`: its
        queries' K (Session.attention_top_k; None: the engine's), kept in its record for as long as it lives."""
        if not prompt:
            raise VecgptError("the prompt is empty; give at least one token")
        check_tokens(engine, prompt)
        now = time.time()
        record = {
            "model": engine.key,
            "tokens": [int(t) for t in prompt],
            "prompt_len": len(prompt),
            "settings": {
                "seed": seed,
                "temperature": temperature,
                "top_k": top_k or engine.top_k,
                "attention_top_k": engine.check_top_k(attention_top_k) or engine.attention_top_k,
            },
            "written": 0,
            "scored": len(prompt),
            "created": now,
            "updated": now,
        }
        text_id = uuid.uuid4().hex[:12]
        version = engine.store.write_text(text_id, record, None)  # first, so `texts gc` finds all that follows
        session = new_session(engine, SESSION_PREFIX + text_id, record["settings"]["top_k"])
        return cls(engine, text_id, {**record, "version": version}, session)

    @classmethod
    def resume(cls, engine: Engine, text_id: str) -> Text:
        """Continue a text from the store: its written positions are fetched once, the rest read again."""
        record = read_record(engine.store, text_id)
        if record["model"] != engine.key:
            raise VecgptError(f"text {text_id} runs model {record['model']}, not {engine.key}")
        text = cls(engine, text_id, record, engine.session(SESSION_PREFIX + text_id, create=False))
        text._restore(record)
        text.resumed = True
        return text

    def _restore(self, record: dict) -> None:
        """The state a record names, from the store in one round: keys, values and candidates."""
        scored = np.arange(record["prompt_len"], record["scored"])
        self.session.truncate(0)
        (rows,) = self.session.restore(
            record["tokens"][: record["written"]], later.fetch(self.session.name + CANDIDATES, scored, payload=True)
        )
        self._take(record)
        self._candidates = dict(zip(scored.tolist(), unpack(rows[1])))

    def _take(self, record: dict) -> None:
        self.version, self.record = record["version"], record
        self.tokens: list[int] = list(record["tokens"])
        self.prompt_len: int = record["prompt_len"]
        self.settings: dict = dict(record["settings"])
        self.scored: int = record["scored"]  # candidates of generated positions below it are in the store
        self._candidates: dict[int, Candidates] = {}
        self._queued: dict[int, int] = {}  # position -> the ticket of its candidates row's write (Session.write)
        self._spent = (dict(record.get("spent") or {}), self._sent())  # the record's tally, and this meter's then

    def _sent(self) -> dict:
        s = summarize(self.session.meter.tokens)
        return {
            "requests": s["total"],
            "round_trips": s["round_trips"],
            "seconds": s["seconds"],
            "positions_read": self.session.positions_read,
        }

    def spent(self) -> dict:
        """What the text's operations have sent, in every process that ran them (the record's `spent`: up to
        its own write)."""
        base, then = self._spent
        return {k: round(base.get(k, 0) + n - then[k], 6) for k, n in self._sent().items()}

    # ------------------------------------------------------------ reading

    @property
    def unread(self) -> int:
        """Tokens before the last one that this process has not read (after a resume: read again)."""
        return max(0, len(self.tokens) - 1 - self.session.position)

    def candidates(self, p: int) -> list[list] | None:
        """[id, logit, text] best first: what position p was drawn from (generated positions only)."""
        c = self._candidates.get(p)
        return None if c is None else [[int(i), float(x), tokenizer.decode([int(i)])] for i, x in zip(*c)]

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
            if len(self.tokens) + n > self.engine.hparams.n_ctx:
                raise VecgptError(
                    f"the text's {len(self.tokens)} tokens plus -n {n} exceed the model's context of "
                    f"{self.engine.hparams.n_ctx} tokens"
                )
            drawn = []
            for _ in range(n):
                p = len(self.tokens)
                scores = yield from self._scores(p)
                token = choose(scores, self.settings["temperature"], self.settings["top_k"], self._draw(p))
                self.tokens.append(token)
                drawn.append(token)
                self._save()
                if on_token is not None:
                    on_token(p, token, self.candidates(p))
                if stop and token == tokenizer.ENDOFTEXT:
                    break
            return drawn

    def _scores(self, p: int):
        """The candidates for position p (an operation: it yields its reads), read only if not known: tokens[:p]
        must all have been read. Read as they were first read (the prompt in the engine's chunks, later tokens one
        at a time), so that a text resumed after kill -9 computes exactly what the uninterrupted one did."""
        if p not in self._candidates:
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
            self._candidates[p] = cands
            self._queue(p)
        return self._candidates[p]

    def inspect(self, p: int) -> Inspection:
        """Attention's weights and the logit lens at position p (0-based, prompt included): the token read again
        as the text read it, nothing written (Session.inspect). Its requests are counted in `cost`."""
        with self._operation():
            if not 0 <= p < len(self.tokens):
                raise VecgptError(f"position {p} is beyond the text: its positions are 0 to {len(self.tokens) - 1}")
            run_one(self._read_to(p))
            return self.session.inspect(p, self.tokens[p])

    def _read_to(self, p: int) -> None:
        """Positions before p read in this process: a resumed text reads again those it lacks, as `generate`
        would (the prompt as one block), their candidates as they were."""
        if p > self.session.position:
            q = max(p, self.prompt_len)
            known = self._candidates.pop(q, None)
            yield from self._scores(q)
            if known is not None:
                self._candidates[q] = known

    def _draw(self, p: int) -> float:
        return draw(self.settings["seed"], p)

    # ------------------------------------------------------------ editing

    def step_back(self, p: int) -> None:
        """Cut the text to tokens[:p]; the next token drawn is position p again. Nothing is read."""
        with self._operation():
            if not 1 <= p <= len(self.tokens):
                raise VecgptError(f"step back to a position from 1 to {len(self.tokens)}, not {p}")
            self.tokens = self.tokens[:p]
            self._candidates = {q: c for q, c in self._candidates.items() if q <= p}
            self.scored = min(self.scored, p + 1)
            self.session.truncate(min(self.session.position, p))
            self._save()

    def retry(self, seed: int | None = None) -> int:
        """Draw the last token again with another seed (the next one when not given); nothing is read.
        Later draws use that seed too."""
        with self._operation():
            p = len(self.tokens) - 1
            if p not in self._candidates:
                raise VecgptError("retry needs a generated token at the end of the text; generate one first")
            self.settings["seed"] = self.settings["seed"] + 1 if seed is None else int(seed)
            self.tokens[p] = choose(
                self._candidates[p], self.settings["temperature"], self.settings["top_k"], self._draw(p)
            )
            self.session.truncate(min(self.session.position, p))
            self._save()
            return self.tokens[p]

    def branch(self, p: int, token: int) -> Text:
        """A new text: tokens[:p] and then `token`. It shares positions before p: the store copies their rows
        inside itself (`clone`), so only positions from p on are ever read for it."""
        check_tokens(self.engine, [token])
        with self._operation():
            if not self.prompt_len <= p < len(self.tokens):
                raise VecgptError(f"branch at a generated position, from {self.prompt_len} to {len(self.tokens) - 1}")
            before = summarize(self.session.meter.tokens)
            child = self._child(p, token)
            child.cost = operation_cost(before, summarize(self.session.meter.tokens), 0)
        self.cost = child.cost
        return child

    def _child(self, p: int, token: int) -> Text:
        cloned = hasattr(self.store, "clone")
        now = time.time()
        record = {
            **self.record,
            "tokens": self.tokens[:p] + [int(token)],
            "settings": dict(self.settings),
            "spent": {},
            "written": min(self.session.written, p) if cloned else 0,
            "scored": min(self._landed(), p + 1) if cloned else self.prompt_len,
            "created": now,
            "updated": now,
        }
        record.pop("version")
        child_id = uuid.uuid4().hex[:12]
        name = SESSION_PREFIX + child_id
        (version,) = self.session.store.together(later.write_text(child_id, record, None))
        if cloned:
            own = self.session.name
            self.session.store.together(later.clone(own, name), later.clone(own + CANDIDATES, name + CANDIDATES))
            session = self.engine.session(name, create=False)
            session.adopt(self.session, record["written"])
        else:  # the child reads its shared positions itself
            session = new_session(self.engine, name, self.settings["top_k"])
        child = Text(self.engine, child_id, {**record, "version": version}, session)
        for q in range(self.prompt_len, p + 1):
            child._candidates[q] = self._candidates[q]
            if q >= child.scored:
                child._queue(q)
        return child

    # ------------------------------------------------------------ the record

    @contextmanager
    def _operation(self):
        lock = getattr(self.store, "text_lock", None)
        before, read = summarize(self.session.meter.tokens), self.session.positions_read
        with lock(self.id) if lock else nullcontext():
            self._catch_up()
            try:
                yield
                self._commit()
            except BaseException:
                with suppress(VecgptError):  # Ctrl-C: what was drawn so far lands, with a record that claims it
                    self._commit()
                raise
            finally:
                after = summarize(self.session.meter.tokens)
                self.cost = operation_cost(before, after, self.session.positions_read - read)

    def _commit(self) -> None:
        """The last rows and record land; then, if rows landed since, a record that claims them."""
        self.session.drain()
        if (self.record["written"], self.record["scored"]) != (self.session.written, self._landed()):
            self._save()
            self.session.drain()

    def _catch_up(self) -> None:
        """Re-read the text if another process changed it since this one last wrote it."""
        (record,) = self.session.store.together(later.read_text(self.id))
        if record is None:
            raise VecgptError(f"text {self.id} was closed by another process")
        if record["version"] != self.version:
            self._restore(record)

    def _queue(self, p: int) -> None:
        """Position p's candidates, written behind what is already queued, as one row of text-<id>.c."""
        row = pack(self._candidates[p])[None]
        self._queued[p] = self.session.write(
            later.upsert(self.session.name + CANDIDATES, np.array([p]), np.array([[p]], np.float32), None, row)
        )

    def _landed(self) -> int:
        """`scored` as the store holds it: the candidates rows whose writes were acknowledged."""
        s = self.scored
        while s in self._candidates and self.session.acked(self._queued.get(s, -1)):
            s += 1
        return s

    def _save(self) -> None:
        """The record as it stands, queued behind the rows before it; it claims only rows already acknowledged."""
        self.scored = self._landed()
        self.record = {
            **self.record,
            "tokens": list(self.tokens),
            "settings": dict(self.settings),
            "written": self.session.written,
            "scored": self.scored,
            "spent": self.spent(),
            "updated": time.time(),
        }
        self.record.pop("version", None)
        self.session.write(later.write_text(self.id, self.record, self.version))
        self.version += 1
        self.record["version"] = self.version

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


def new_session(engine: Engine, name: str, top_k: int) -> Session:
    """A session on a new text collection, with the collection its candidates go to (a row of 4 top_k floats)."""
    session = engine.session(name)
    session.store.create(name + CANDIDATES, 1, "l2", payload=4 * top_k)
    return session


def remove(store, text_id: str, version: int | None = None) -> None:
    """A text's collections, then its record (at `version`; None: whichever it has)."""
    store.drop(SESSION_PREFIX + text_id)
    store.drop(SESSION_PREFIX + text_id + CANDIDATES)
    if version is None:
        record = store.read_text(text_id)
        version = None if record is None else record["version"]
    if version is not None:
        store.write_text(text_id, None, version)


def pack(c: Candidates) -> np.ndarray:
    """[4k] float32: the ids, then each float64 logit as three float32s whose float64 sum is exactly it."""
    hi = c.logits.astype(np.float32)
    rest = c.logits - hi
    mid = rest.astype(np.float32)
    lo = (rest - mid).astype(np.float32)
    return np.concatenate([c.ids.astype(np.float32), hi, mid, lo])


def unpack(rows: np.ndarray) -> list[Candidates]:
    k = rows.shape[1] // 4
    ids, hi, mid, lo = (rows[:, i * k : (i + 1) * k] for i in range(4))
    logits = hi.astype(np.float64) + mid.astype(np.float64) + lo.astype(np.float64)
    return [Candidates(i.astype(np.int64), x) for i, x in zip(ids, logits)]


def operation_cost(before: dict, after: dict, positions_read: int) -> dict:
    """What an operation sent (meter summaries before and after it), and the positions it read."""
    kinds = {k: after["by_kind"][k] - before["by_kind"].get(k, 0) for k in after["by_kind"]}
    return {
        "requests": after["total"] - before["total"],
        "round_trips": after["round_trips"] - before["round_trips"],
        "by_kind": {k: n for k, n in kinds.items() if n},
        "seconds": round(after["seconds"] - before["seconds"], 6),
        "scores": {k: n - before["scores"][k] for k, n in after["scores"].items()},
        "positions_read": positions_read,
    }


def check_tokens(engine: Engine, ids: list[int]) -> None:
    bad = [t for t in ids if not 0 <= int(t) < engine.hparams.n_vocab]
    if bad:
        raise VecgptError(f"token id {bad[0]} is outside the model's vocabulary of {engine.hparams.n_vocab}")


def read_record(store, text_id: str) -> dict:
    record = store.read_text(text_id)
    if record is None:
        raise VecgptError(f"the store has no text {text_id}; `vecgpt texts` lists the open ones")
    return record


def list_texts(store) -> list[dict]:
    """Every text in the store: id, model, tokens, age in seconds (since its last write), bytes held."""
    sizes, now, out = store.stats(), time.time(), []
    for text_id in store.texts():
        record = store.read_text(text_id)
        if record is not None:
            out.append(
                {
                    "id": text_id,
                    "model": record["model"],
                    "tokens": len(record["tokens"]),
                    "age_s": round(now - record["updated"], 1),
                    "bytes": sum(
                        sizes.get(SESSION_PREFIX + text_id + end, {}).get("bytes", 0) for end in ("", CANDIDATES)
                    ),
                }
            )
    return out


def gc_texts(store, older_than_s: float) -> list[str]:
    """Remove texts not written for older_than_s seconds (and text collections left without a record)."""
    removed, now, lock = [], time.time(), getattr(store, "text_lock", None)
    for text_id in store.texts():
        record = store.read_text(text_id)
        if record is None or now - record["updated"] < older_than_s:
            continue
        try:
            with lock(text_id) if lock else nullcontext():
                remove(store, text_id, record["version"])
        except VecgptError:  # open in a process, or written meanwhile: not abandoned
            continue
        removed.append(text_id)
    held = set(store.texts())
    for name in store.collections():
        text_id = name[len(SESSION_PREFIX) :].removesuffix(CANDIDATES)
        if name.startswith(SESSION_PREFIX) and text_id not in held:
            store.drop(name)
            removed += [] if text_id in removed else [text_id]
    return removed
