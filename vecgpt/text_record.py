"""A text's record, the small versioned JSON the store files beside its rows (store.write_text), and the texts a store
holds: listed, collected when abandoned, removed.

A record names the model, the sampling settings (seed, temperature, top-k, attention's top-k), the tokens, `written`
(positions < written have their keys and values in the store), `scored` (generated positions < scored have their
candidates there), `spent` (what the text's operations sent, in every process that ran them) and when it was created
and last updated. Each write is conditional on the version last read or written (TextConflict otherwise).
"""

from __future__ import annotations

import time
from contextlib import nullcontext, suppress

from vecgpt.candidates import CANDIDATES, CandidateRows
from vecgpt.engine import Engine, Session
from vecgpt.errors import VecgptError
from vecgpt.meter import SESSION_PREFIX, later, summarize
from vecgpt.policy import Policy
from vecgpt.policy import settings as policy_settings


def new_record(
    engine: Engine, prompt: list[int], temperature: float, top_k, seed: int, attention_top_k, policy=None
) -> dict:
    """A new text's record: the prompt, nothing read."""
    now = time.time()
    return {
        "model": engine.key,
        "tokens": [int(t) for t in prompt],
        "prompt_len": len(prompt),
        "settings": {
            "seed": seed,
            "temperature": temperature,
            "top_k": top_k or engine.top_k,
            **policy_settings(text_policy(engine, attention_top_k, policy)),
            "kernel": getattr(engine.store, "kernel", None),  # an in-process store's: how its products are summed
        },
        "written": 0,
        "scored": len(prompt),
        "created": now,
        "updated": now,
    }


def text_policy(engine: Engine, attention_top_k: int | None = None, policy: Policy | None = None) -> Policy:
    """A new text's attention policy: `policy` as given (the playground's policy box), else the engine's, or top-k
    with K = attention_top_k (the playground's top-k box); refused in one line where the engine cannot run it."""
    if policy is not None:
        return engine.check_policy(policy)
    if attention_top_k is None:
        return engine.policy
    return engine.check_policy(engine.policy._replace(top_k=attention_top_k, threshold=None))


def check_kernel(engine: Engine, text_id: str, record: dict) -> None:
    """A text continues on the kernel it was computed with (its bits depend on it): refused in one line otherwise."""
    was, now = record["settings"].get("kernel"), getattr(engine.store, "kernel", None)
    if was is not None and now is not None and was != now:
        raise VecgptError(
            f"text {text_id} was computed with the {was!r} kernel and this store runs {now!r}: open the store with "
            f'[store] kernel = "{was}" to continue it as it began'
        )


class Record:
    """A text's record as this process last read or wrote it. A write goes through the text's session, so it lands
    after every row queued before it, and claims only rows acknowledged before it was queued."""

    def __init__(self, text_id: str, fields: dict, session: Session):
        self.id, self.session = text_id, session
        self.fields, self.version = fields, fields["version"]
        self.spent = Spent(fields, session)

    def keep_up(self, tokens: list[int], settings: dict, rows: CandidateRows) -> None:
        """After a token: waiting rows go out every FLUSH_EVERY tokens, and a record once more of them landed than
        this one claims."""
        if rows.due():
            rows.flush()
        if rows.landed() > len(self.fields["tokens"]):
            self.save(tokens, settings, rows)

    def commit(self, tokens: list[int], settings: dict, rows: CandidateRows) -> None:
        """The end of an operation: the waiting rows go out and every write lands; then, if the record claims less
        than the store holds, a record that claims it all."""
        rows.flush()
        self.session.drain()
        if any(self.fields.get(k) != v for k, v in self.claim(tokens, settings, rows).items()):
            self.save(tokens, settings, rows)
            self.session.drain()

    def claim(self, tokens: list[int], settings: dict, rows: CandidateRows) -> dict:
        return {**claim(tokens, self.session.written, rows.landed()), "settings": dict(settings)}

    def save(self, tokens: list[int], settings: dict, rows: CandidateRows) -> None:
        """The record as the store holds the text now, queued behind every write before it."""
        fields = updated(self.fields, **self.claim(tokens, settings, rows), spent=self.spent.now())
        self.session.write(later.write_text(self.id, fields, self.version))
        self.version += 1
        self.fields = {**fields, "version": self.version}

    def changed(self) -> dict | None:
        """The store's record if another process wrote it since this one last did, else None."""
        (held,) = self.session.store.together(later.read_text(self.id))
        if held is None:
            raise VecgptError(f"text {self.id} was closed by another process")
        return None if held["version"] == self.version else held


def claim(tokens: list[int], written: int, landed: int) -> dict:
    """What a record may say of a text whose keys landed below `written` and candidates rows below `landed`: the
    tokens up to the first whose candidates are not stored, and the keys of those that save a read (the last one's
    only with the next position's candidates: without them that token is read again)."""
    n = min(landed, len(tokens))
    usable = n if landed > n else n - 1
    return {"tokens": list(tokens[:n]), "written": min(written, usable), "scored": landed}


def updated(record: dict, **fields) -> dict:
    """The record with these fields, to be written (without its version: the store gives the next)."""
    out = {**record, **fields, "updated": time.time()}
    out.pop("version", None)
    return out


class Spent:
    """What a text's operations have sent: the record's tally, and what this process's session sent since."""

    def __init__(self, record: dict, session: Session):
        self.base, self.session = dict(record.get("spent") or {}), session
        self.then = sent(session)

    def now(self) -> dict:
        return {k: round(self.base.get(k, 0) + n - self.then[k], 6) for k, n in sent(self.session).items()}


def sent(session: Session) -> dict:
    s = summarize(session.meter.tokens)
    return {
        "requests": s["total"],
        "round_trips": s["round_trips"],
        "seconds": s["seconds"],
        "positions_read": session.positions_read,
    }


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


def disk_full(store, text_id: str, kept: bool) -> VecgptError:
    """A write of the text that failed for want of disk room, as one line: what the store keeps, what to do."""
    held = None
    with suppress(Exception):
        held = len(store.read_text(text_id)["tokens"])
    then = f"continue it with `vecgpt generate --resume {text_id}`" if kept else "run it again"
    return VecgptError(
        f"the disk filled while writing text {text_id}: its last record ({held} tokens) and every row it claims are "
        f"intact; free room and {then}"
    )


def check_context(engine: Engine, tokens: list[int], n: int) -> None:
    if len(tokens) + n > engine.hparams.n_ctx:
        raise VecgptError(
            f"the text's {len(tokens)} tokens plus -n {n} exceed the model's context of {engine.hparams.n_ctx} tokens"
        )


def check_tokens(engine: Engine, ids: list[int]) -> None:
    bad = [t for t in ids if not 0 <= int(t) < engine.hparams.n_vocab]
    if bad:
        raise VecgptError(f"token id {bad[0]} is outside the model's vocabulary of {engine.hparams.n_vocab}")


def read_record(store, text_id: str) -> dict:
    record = store.read_text(text_id)
    if record is None:
        raise VecgptError(f"the store has no text {text_id}; `vecgpt texts` lists the open ones")
    return record


def remove(store, text_id: str, version: int | None = None) -> None:
    """A text's collections, then its record (at `version`; None: whichever it has)."""
    store.drop(SESSION_PREFIX + text_id)
    store.drop(SESSION_PREFIX + text_id + CANDIDATES)
    if version is None:
        record = store.read_text(text_id)
        version = None if record is None else record["version"]
    if version is not None:
        store.write_text(text_id, None, version)


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
