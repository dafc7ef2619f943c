"""The Python API the CLI is a thin layer over.

>>> from vecgpt import api
>>> out = api.generate_text("ROMEO:", n=8)            # shipped model, FAISS store
>>> out["text"]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vecgpt import __version__, tokenizer, weights
from vecgpt.backends.base import LOCATIONS
from vecgpt.config import Config, open_store, settle_layout
from vecgpt.engine import Engine
from vecgpt.errors import VecgptError
from vecgpt.loading import push, store_fingerprint
from vecgpt.policy import SETTINGS as POLICY_SETTINGS
from vecgpt.policy import Policy
from vecgpt.policy import check as check_policy
from vecgpt.policy import settings as policy_settings
from vecgpt.reference import Reference
from vecgpt.sampling import Candidates, choose, draw
from vecgpt.stepper import run_one
from vecgpt.text import Text


@dataclass
class Generation:
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    tok: object = field(default_factory=tokenizer.Gpt2Tokenizer, repr=False)  # the model's tokenizer

    @property
    def text(self) -> str:
        return self.tok.decode([t for t in self.tokens if t != self.tok.eos])


def check_request(
    hp: weights.HParams, prompt_tokens: list[int], n: int, top_k: int, temperature: float = 0.0, seed: int = 0
) -> None:
    if n < 0:
        raise VecgptError(f"-n must be 0 or more, not {n}")
    if not prompt_tokens:
        raise VecgptError("the prompt is empty; give at least one token")
    if not 0 <= temperature < float("inf"):  # also refuses NaN
        raise VecgptError(f"--temperature must be 0 (greedy) or a positive number, not {temperature}")
    if seed < 0:
        raise VecgptError(f"--seed must be 0 or more, not {seed}")
    if not 1 <= top_k <= hp.n_vocab:
        raise VecgptError(f"--top-k {top_k} must be between 1 and the vocabulary size {hp.n_vocab}")
    if len(prompt_tokens) + n > hp.n_ctx:
        raise VecgptError(
            f"the prompt's {len(prompt_tokens)} tokens plus -n {n} exceed the model's context of {hp.n_ctx} tokens"
        )
    if max(prompt_tokens) >= hp.n_vocab:
        raise VecgptError(f"token id {max(prompt_tokens)} is outside the model's vocabulary of {hp.n_vocab}")


def generate(
    reader,
    prompt_tokens: list[int],
    n: int,
    temperature: float = 0.0,
    top_k: int = 40,
    seed: int = 0,
    stop: bool = True,
    on_text: Callable[[str], None] | None = None,
    tok=None,
) -> Generation:
    """Greedy or sampled continuation; `reader.read(ids, k)` feeds tokens and returns Candidates.

    `on_text(piece)`, when given, gets the text as it is made: after each token the characters it completes
    (maybe none), then the rest at the end; the pieces join to the generation's `text`. `tok`: the model's
    tokenizer (vecgpt.tokenizer.of_model; by default GPT-2's), which decodes and ends the text."""
    tok = tok or tokenizer.Gpt2Tokenizer()
    out, stream = Generation(list(prompt_tokens), tok=tok), tokenizer.TextStream(tok)
    say = on_text or (lambda piece: None)
    if n == 0:
        return out
    cands: Candidates = reader.read(prompt_tokens, top_k)
    for step in range(n):
        token = choose(cands, temperature, top_k, draw(seed, len(prompt_tokens) + step))
        out.tokens.append(token)
        out.steps.append({"token": token, "candidates": decoded(cands, tok)})
        say(stream.feed(token))
        if (stop and token == tok.eos) or step == n - 1:
            break
        if hasattr(reader, "meter"):
            reader.meter.start_token()
        cands = reader.read([token], top_k)
    say(stream.end())
    return out


def decoded(cands: Candidates, tok) -> list[list]:
    """[id, logit, text] per candidate; a token that is part of a character reads as U+FFFD."""
    return [[int(i), float(x), tok.decode([int(i)])] for i, x in zip(*cands)]


def probabilities(logits: np.ndarray, temperature: float, top_k: int) -> np.ndarray:
    """What `sampling.choose` draws from: softmax(logits / temperature) over the first top_k, 0 beyond;
    greedy (temperature 0) puts all of it on the first."""
    p = np.zeros(len(logits))
    if temperature <= 0:
        p[0] = 1.0
        return p
    z = logits[:top_k] / temperature
    w = np.exp(z - z.max())
    p[: len(w)] = w / w.sum()
    return p


def candidate_rows(text: Text, position: int) -> list[dict] | None:
    """What a generated position was drawn from, best first: id, text, logit, probability, chosen."""
    rows = text.candidates(position)
    if rows is None:
        return None
    s, chosen = text.settings, text.tokens[position]
    p = probabilities(np.array([r[1] for r in rows], np.float64), s["temperature"], s["top_k"])
    return [
        {"id": int(i), "text": t, "logit": float(x), "probability": float(q), "chosen": int(i) == chosen}
        for (i, x, t), q in zip(rows, p)
    ]


def text_json(text: Text) -> dict:
    """A text as `vecgpt texts show --json` prints it and the playground's export downloads it: its tokens,
    settings, each generated position's candidates, and what its operations have sent (`spent`, the record's)."""
    generated, decode = range(text.prompt_len, len(text.tokens)), text.tokenizer.decode
    return {
        "id": text.id,
        "model": text.record["model"],
        "prompt_len": text.prompt_len,
        "prompt": decode(text.tokens[: text.prompt_len]),
        "text": decode(text.tokens[text.prompt_len :]),
        "tokens": [{"position": p, "id": t, "text": decode([t])} for p, t in enumerate(text.tokens)],
        "settings": {k: text.settings.get(k) for k in ("temperature", "top_k", "seed", *POLICY_SETTINGS)},
        "candidates": [{"position": p, "rows": candidate_rows(text, p)} for p in generated],
        "spent": text.record.get("spent") or {},
        "created": text.record["created"],
        "updated": text.record["updated"],
        "version": __version__,
    }


def settings(temperature: float, top_k: int, seed: int) -> dict:
    return {"seed": seed, "temperature": temperature, "top_k": top_k, "version": __version__}


def location(store, backend: str) -> dict:
    """The backend and where it keeps its data (path, schema or prefix): never a DSN, its password or a key."""
    found = {name: str(getattr(store, name)) for name in LOCATIONS if getattr(store, name, None) is not None}
    return {"backend": backend, **found}


def config_engine(store, config: Config, key: str) -> Engine:
    """The engine of model `key` on `store` with the config's reading settings: how the CLI, the API and the
    playground all build one."""
    return Engine(
        store,
        top_k=config.top_k,
        prompt_block=config.prompt_block,
        model=key,
        prefill_chunk=config.prefill_chunk,
        attention_top_k=config.attention_top_k,
        attention_threshold=config.attention_threshold,
        attention_sinks=config.attention_sinks,
        attention_window=config.attention_window,
        attention_index=config.attention_index,
    )


def open_engine(config: Config, model: weights.Model, progress: bool = True, confirm=None) -> Engine:
    """A store holding `model` in the configured encoding, loading it first if absent (other models stay).

    `confirm(store)`, when given, is called before such a load and may refuse it (raise)."""
    settle_layout(config, model.hparams)  # "auto": four, not three, for a rotary family behind a network
    store = open_store(config)
    key = store_fingerprint(model, config.metric, config.layout)
    try:
        if store.read_manifest(key) is None:
            if confirm is not None:
                confirm(store)
            push(store, model, config.metric, progress=progress, layout=config.layout)
    except BaseException:
        store.close()
        raise
    return config_engine(store, config, key)


def generate_text(
    prompt: str | None,
    n: int = 8,
    config: Config | None = None,
    model: str | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    stop: bool = True,
    progress: bool = False,
    confirm=None,
    on_text: Callable[[str], None] | None = None,
    keep: bool = False,
    resume: str | None = None,
    on_kept: Callable[[str], None] | None = None,
) -> dict:
    """Generate through a store; the dict of `vecgpt generate --json`. `on_text` as for `generate`.
    keep: leave the text in the store (its id is `text_id`); resume: continue that kept text with the settings it
    was started with (prompt, model and sampling arguments are then ignored); it stays kept. on_kept(text_id) is
    called once a kept text exists, before generating."""
    config = config or Config()
    if resume:
        engine = engine_for_text(config, resume)
        open_text = lambda: Text.resume(engine, resume)  # noqa: E731
    else:
        engine, open_text = _new_text(config, prompt, n, model, temperature, top_k, seed, progress, confirm)
    try:
        text = open_text()
        if keep or resume:
            text.keep()  # before generating: after Ctrl-C or kill -9 the text stays, complete up to its last write
            if on_kept:
                on_kept(text.id)
        try:
            out = run_text(text, n, stop, on_text)
        finally:
            if not text.kept:
                text.close()
    finally:
        engine.store.close()
    return {**out, **about(engine, text, config)}


def _new_text(config, prompt, n, model, temperature, top_k, seed, progress, confirm):
    """The engine for a new text's request (its model loaded if the store lacks it), and how to start the text."""
    m = weights.load(model or config.model)
    k = config.top_k if top_k is None else top_k
    ids = tokenizer.of_model(m).encode(prompt or "")
    check_request(m.hparams, ids, n, k, temperature, seed)
    config.top_k = max(config.top_k, k)
    engine = open_engine(config, m, progress=progress, confirm=confirm)
    return engine, lambda: Text.start(engine, ids, temperature, k, seed)


def about(engine: Engine, text: Text, config: Config) -> dict:
    """What `generate --json` says of the run beside its tokens: where, which model, layout and encoding."""
    return {
        "backend": config.backend,
        "metric": engine.metric,
        "layout": engine.manifest.get("layout") or "four",
        "model_fingerprint": engine.manifest["model_fingerprint"],
        **settings(text.settings["temperature"], text.settings["top_k"], text.settings["seed"]),
        **{k: text.settings.get(k) for k in POLICY_SETTINGS},
        "store": location(engine.store, config.backend),
        "text_id": text.id,
        "kept": text.kept,
    }


def run_text(text: Text, n: int, stop: bool, on_text) -> dict:
    """Generate n tokens of a text, saying the text as it is made; what `generate --json` reports of it."""
    return run_one(text_run(text, n, stop, on_text))


def text_run(text: Text, n: int, stop: bool, on_text):
    """run_text as an operation a stepper runs beside other texts' (vecgpt.stepper)."""
    tok = text.tokenizer
    say, stream, steps = on_text or (lambda piece: None), tokenizer.TextStream(tok), []
    for t in text.tokens[text.prompt_len :]:  # a resumed text: a character may span the last token and the next
        stream.feed(t)
    reread = text.unread if text.resumed else 0

    def on_token(position: int, token: int, candidates: list) -> None:
        steps.append({"position": position, "token": token, "candidates": candidates})
        say(stream.feed(token))

    tokens = yield from text.generating(n, on_token, stop)
    say(stream.end())
    return {
        "prompt_tokens": text.tokens[: text.prompt_len],
        "tokens": tokens,
        "text": tok.decode([t for t in tokens if t != tok.eos]),
        "text_tokens": list(text.tokens),
        "steps": steps,
        "requests": (requests := text.session.meter.summary()),
        "scores": requests["scores"],  # q.k products over the call: from a key search, from memory (own key)
        "positions_reread": reread,
    }


def engine_for_text(config: Config, text_id: str) -> Engine:
    """The engine a kept text runs on: its store, and the model its record names."""
    store = open_store(config)
    try:
        record = store.read_text(text_id)
        if record is None:
            raise VecgptError(f"the store has no text {text_id}; `vecgpt texts` lists the open ones")
        return config_engine(store, config, record["model"])
    except BaseException:
        store.close()
        raise


def generate_reference(
    prompt: str,
    n: int = 8,
    model: str | None = None,
    temperature: float = 0.0,
    top_k: int = 40,
    seed: int = 0,
    stop: bool = True,
    dtype=np.float64,
    on_text: Callable[[str], None] | None = None,
    attention_top_k: int | None = None,
    policy: Policy | None = None,
) -> dict:
    m = weights.load(model, dtype=dtype)
    tok = tokenizer.of_model(m)
    ids = tok.encode(prompt)
    check_request(m.hparams, ids, n, top_k, temperature, seed)
    policy = check_policy(policy or Policy(top_k=attention_top_k), m.hparams.n_ctx)
    gen = generate(reference(m, dtype, policy), ids, n, temperature, top_k, seed, stop, on_text, tok)
    return {
        "prompt_tokens": gen.prompt_tokens,
        "tokens": gen.tokens,
        "text": gen.text,
        "steps": gen.steps,
        "backend": f"numpy-{np.dtype(dtype).name}",
        "model_fingerprint": m.fingerprint,
        **settings(temperature, top_k, seed),
        **policy_settings(policy),
        "store": None,
        "text_id": None,
    }


def compare(prompt: str, n: int = 8, config: Config | None = None, model: str | None = None, confirm=None) -> dict:
    """Store against numpy: the top-k scores after the prompt side by side, then greedy tokens of both."""
    config = config or Config()
    store_run = generate_text(prompt, n, config, model, stop=False, confirm=confirm)
    m = weights.load(model or config.model, dtype=np.float64)  # one load serves both numpy runs
    tok, ids = tokenizer.of_model(m), store_run["prompt_tokens"]
    ref = generate(reference(m, np.float64), ids, n, top_k=config.top_k, stop=False, tok=tok)
    full = reference(m, np.float64).logits(store_run["prompt_tokens"])[-1]  # numpy's score for any store token
    s, r = store_run["steps"][0]["candidates"], ref.steps[0]["candidates"] if ref.steps else []
    ref_logits = {c[0]: c[1] for c in r}
    rows = [
        {
            "rank": i + 1,
            "token": tok,
            "text": text,
            "store": logit,
            "numpy": float(full[tok]),
            "abs_error": abs(logit - float(full[tok])),
            "numpy_rank": _rank(tok, r),
        }
        for i, (tok, logit, text) in enumerate(s)
    ]
    first_diff = next((i for i, (a, b) in enumerate(zip(store_run["tokens"], ref.tokens)) if a != b), None)
    return {
        "prompt_tokens": store_run["prompt_tokens"],
        "scores": rows,
        "max_abs_error": max((row["abs_error"] for row in rows), default=0.0),
        "same_top_set": {c[0] for c in s} == set(ref_logits),
        "store_tokens": store_run["tokens"],
        "numpy_tokens": ref.tokens,
        "identical_steps": len(store_run["tokens"]) if first_diff is None else first_diff,
        "backend": config.backend,
        "metric": store_run["metric"],
        "model_fingerprint": store_run["model_fingerprint"],
    }


def reference(model: weights.Model, dtype, policy: Policy | None = None):
    """The numpy forward pass of the model's family: reference.py's GPT-2, or reference_llama's."""
    if isinstance(model, weights.LlamaModel):
        from vecgpt.reference_llama import LlamaReference

        return LlamaReference(model, dtype, policy)
    return Reference(model, dtype, policy=policy)


def _rank(token: int, candidates: list) -> int | None:
    return next((i + 1 for i, c in enumerate(candidates) if c[0] == token), None)
