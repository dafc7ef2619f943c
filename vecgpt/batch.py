"""Many texts at once, stepped together: one forward pass a step over every text's new rows (vecgpt.stepper).

>>> from vecgpt import batch
>>> outs = batch.generate_many(["ROMEO:", "JULIET:"], n=8)   # each: what `generate --json` gives for it alone

`vecgpt generate --batch FILE` reads one prompt a line (`read_prompts`). A text's tokens and logits are those it
computes alone, whatever else runs beside it; a text that fails gives {"error": ...} in its place and the others
go on. At most `at_once` texts read at a time; the next starts as one finishes (it joins at the next step).
One thread runs them all: a text's operation is a generator the stepper advances (Text.generating).

`keep`: every text is started and kept before any is read (`on_kept(i, text_id)` as each is), so that after Ctrl-C
or kill -9 each can be continued (`vecgpt generate --resume ID`) and ends as its uninterrupted run would.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from vecgpt import api, tokenizer, weights
from vecgpt.backends.base import first_line
from vecgpt.config import Config
from vecgpt.errors import VecgptError
from vecgpt.stepper import Stepper
from vecgpt.text import Text

AT_ONCE = 16  # texts reading at a time by default: turbopuffer's multi_query takes 16 subqueries a request


def read_prompts(path: str) -> list[str]:
    """A batch file's prompts, one a line ("\\n" inside a prompt: a backslash-n); errors name the line."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise VecgptError(f"cannot read the batch file {path}: {e.strerror or e}") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline ending the last line
    if not lines:
        raise VecgptError(f"{path} holds no prompt; give one prompt a line")
    prompts = []
    for number, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError as e:
            raise VecgptError(f"{path}:{number}: not UTF-8 (byte {e.start + 1}); save the file as UTF-8") from None
        if not line.strip():
            raise VecgptError(f"{path}:{number}: an empty line; give one prompt a line, none empty")
        prompts.append(line.replace("\\n", "\n"))
    return prompts


def check_prompts(hp, prompts: list[str], n: int, top_k: int, temperature: float, seed: int, where: str, tok=None):
    """Each prompt's tokens (`tok`: the model's tokenizer, by default GPT-2's), or a one-line error naming the first
    bad one (`where`:line), before any search."""
    out = []
    for number, prompt in enumerate(prompts, 1):
        ids = (tok or tokenizer).encode(prompt)
        try:
            api.check_request(hp, ids, n, top_k, temperature, seed)
        except VecgptError as e:
            raise VecgptError(f"{where}:{number}: {e}") from None
        out.append(ids)
    return out


def generate_many(
    prompts: list[str],
    n: int = 8,
    config: Config | None = None,
    model: str | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    stop: bool = True,
    at_once: int = AT_ONCE,
    progress: bool = False,
    confirm=None,
    on_result: Callable[[int, dict], None] | None = None,
    where: str = "prompt",
    keep: bool = False,
    on_kept: Callable[[int, str], None] | None = None,
) -> list[dict]:
    """Generate a text for each prompt, the texts stepped together; their `generate --json` dicts in order.
    on_result(i, dict) is called as text i finishes; keep: see the module's doc."""
    if at_once < 1:
        raise VecgptError(f"--at-once must be 1 or more, not {at_once}")
    config = config or Config()
    m = weights.load(model or config.model)
    k = config.top_k if top_k is None else top_k
    ids = check_prompts(m.hparams, prompts, n, k, temperature, seed, where, tokenizer.of_model(m))
    config.top_k = max(config.top_k, k)
    engine = api.open_engine(config, m, progress=progress, confirm=confirm)
    try:
        said = (on_kept or (lambda i, text_id: None)) if keep else None
        return Batch(engine, config, at_once).run(ids, n, temperature, k, seed, stop, on_result, said)
    finally:
        engine.store.close()


class Batch:
    """Texts of one engine generated together, at most `at_once` at a time, in one stepper."""

    def __init__(self, engine, config: Config, at_once: int, on_step=None):
        self.engine, self.config, self.stepper = engine, config, Stepper(at_once, on_step)

    def run(self, ids: list, n: int, temperature: float, k: int, seed: int, stop: bool, on_result=None, on_kept=None):
        """Each prompt's `generate --json` dict, in order; on_kept: keep every text (`keep_all`), else none."""
        results: list = [None] * len(ids)
        kept = self.keep_all(ids, temperature, k, seed, on_kept) if on_kept else [None] * len(ids)

        def ended(i: int, job) -> None:
            results[i] = job.result if job.error is None else {"error": first_line(job.error), "prompt_tokens": ids[i]}
            if on_result is not None:
                on_result(i, results[i])

        for i, prompt in enumerate(ids):
            self.stepper.add(self.text(prompt, n, temperature, k, seed, stop, kept[i]), partial(ended, i))
        self.stepper.run()
        return results

    def keep_all(self, ids: list, temperature: float, k: int, seed: int, on_kept) -> list:
        """Every text started and kept before any is read, on_kept(i, its id) as each is: each one's record, or the
        error that refused it. Each Text is dropped: its session's memory is taken again only as it is read."""
        out = []
        for i, prompt in enumerate(ids):
            try:
                text = Text.start(self.engine, prompt, temperature, k, seed)
            except VecgptError as e:
                out.append(e)
                continue
            out.append((text.keep(), text.record))
            on_kept(i, text.id)
        return out

    def text(self, ids: list[int], n: int, temperature: float, k: int, seed: int, stop: bool, kept=None):
        """One text's operation: what `generate --json` gives, or {"error": one line}. kept: the (id, record) of the
        text `keep_all` started for it, or the error that refused it."""
        try:
            if isinstance(kept, VecgptError):
                raise kept
            text = Text.start(self.engine, ids, temperature, k, seed) if kept is None else self.resume(*kept)
        except VecgptError as e:
            return {"error": str(e), "prompt_tokens": ids}
        try:
            out = yield from api.text_run(text, n, stop, None)
            return {**out, **api.about(self.engine, text, self.config)}
        except Exception as e:  # this text fails; the others go on
            return {"error": str(e) or type(e).__name__, "prompt_tokens": ids, "text_id": text.id}
        finally:
            if not text.kept:
                text.close()

    def resume(self, text_id: str, record: dict) -> Text:
        text = Text.resume(self.engine, text_id, record)
        text.keep()
        return text
