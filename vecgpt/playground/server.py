"""What a playground process holds: the stores of its configs, an engine per model, the texts it has open.

A text's state lives in its store, so any process serving the same store can continue it (`Text.resume`);
a process keeps only a cache of Text objects. Operations on different texts run at once: each holds its text's
lock and its store's `Gate` shared; what reads or changes the store as a whole (its stats, a model's load,
closing idle texts) holds the gate alone. Texts generating at once are stepped together (`Shelf.generate`: one
vecgpt.stepper.Service per model on a store): one forward pass a step over all their new rows, one search per
matrix for all of them, each text's numbers its own. Locks are taken in one order: a text's, then a store's gate.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from dataclasses import dataclass, field

from vecgpt import api, tokenizer
from vecgpt.config import Config, load_config, open_store
from vecgpt.errors import VecgptError
from vecgpt.playground.budget import Budget

SECRET_KEYS = ("dsn", "api_key", "password", "key", "token")


@dataclass
class Settings:
    configs: list[str | None] = field(default_factory=lambda: [None])  # TOML paths; None: the default config
    store: str | None = None  # --store: overrides each config's location
    idle_s: float = 900.0  # a text untouched this long is closed
    max_texts: int = 64  # texts open in this process at once
    max_prompt_chars: int = 4000
    max_body_bytes: int = 16384
    host: str = "127.0.0.1"  # the address listened on: its name is one the Host header may carry
    token: str | None = None  # when set, every request but /static/ needs it (header, cookie or ?token=)
    allow_hosts: list[str] = field(default_factory=list)  # more names the Host header may carry
    max_dollars_per_hour: float = 1.0  # over every store that charges, all workers together
    workers: int = 1  # processes sharing the port: each may spend its share of the dollars
    rate_per_s: float = 10.0  # requests a second per client address, on average
    burst: float = 100.0  # requests a client may make at once


class Refused(VecgptError):
    """A request over a limit or naming nothing known: a 4xx with a one-line message. Any other error is the
    store's (a 503)."""

    def __init__(self, message: str, status: int = 400, retry_after_s: float | None = None):
        super().__init__(message)
        self.status, self.retry_after_s = status, retry_after_s


FLAGS = {"--top-k": "top_k", "--temperature": "temperature", "--seed": "seed", "-n": "n"}  # CLI flag: API field


def check_request(hp, tokens: list[int], n: int, top_k: int, temperature: float, seed: int) -> None:
    """`vecgpt generate`'s checks (-n within the context, top-k within the vocabulary ...) as a 400 that names
    the API's fields, not the CLI's flags."""
    try:
        api.check_request(hp, tokens, n, top_k, temperature, seed)
    except VecgptError as e:
        line = str(e)
        for flag, name in FLAGS.items():
            line = re.sub(rf"(?<![\w-]){flag}(?![\w-])", name, line)
        raise Refused(line) from None


@dataclass
class Entry:
    text: object  # vecgpt.text.Text
    store: int
    model: str
    used: float = field(default_factory=time.monotonic)
    lock: threading.RLock = field(default_factory=threading.RLock)  # one operation on the text at a time
    # position -> (token, what drawing it cost) for tokens this process drew: a reopened page shows them again
    costs: dict = field(default_factory=dict)

    def drop_costs(self, position: int) -> None:
        """Forget the costs of the tokens from `position` on (stepped back, drawn again)."""
        for p in [p for p in self.costs if p >= position]:
            del self.costs[p]


class Gate:
    """A store's operations on texts hold it shared (`with gate.shared()`), several at once; an operation on the
    store as a whole holds it alone (`with gate`), once those running have ended (new ones wait behind it).
    A thread may take it again while it holds it."""

    def __init__(self):
        self.cond = threading.Condition()
        self.sharing = 0  # threads holding it shared
        self.owner: int | None = None  # the thread holding it alone
        self.wanting = 0  # threads waiting to hold it alone
        self.mine = threading.local()  # this thread's depth of `shared`

    @contextlib.contextmanager
    def shared(self):
        depth, me = getattr(self.mine, "depth", 0), threading.get_ident()
        if depth == 0 and self.owner != me:
            with self.cond:
                while self.owner is not None or self.wanting:
                    self.cond.wait()
                self.sharing += 1
        self.mine.depth = depth + 1
        try:
            yield
        finally:
            self.mine.depth = depth
            if depth == 0 and self.owner != me:
                with self.cond:
                    self.sharing -= 1
                    self.cond.notify_all()

    def __enter__(self):
        me = threading.get_ident()
        if getattr(self.mine, "depth", 0):
            raise RuntimeError("a thread holding a store shared cannot take it alone")
        with self.cond:
            self.wanting += 1
            while self.owner not in (None, me) or self.sharing:
                self.cond.wait()
            self.wanting -= 1
            self.mine.alone = getattr(self.mine, "alone", 0) + 1
            self.owner = me
        return self

    def __exit__(self, *exc) -> None:
        with self.cond:
            self.mine.alone -= 1
            if not self.mine.alone:
                self.owner = None
            self.cond.notify_all()


class Shelf:
    """One config's store, its gate, the engines of the models it holds and their steppers."""

    def __init__(self, label: str, config: Config):
        self.label, self.config = label, config
        self.lock = Gate()
        self.store = open_store(config)
        self.making = threading.Lock()  # an engine is made once
        self.checking = threading.Lock()  # ... and a numpy reference (seconds to load: engines do not wait)
        self.engines: dict[str, object] = {}
        self.services: dict[str, object] = {}  # model key -> the stepper its texts generate in
        self.references: dict[str, object] = {}

    def engine(self, key: str):
        """Model `key`'s engine, built as `vecgpt generate` builds it from the config."""
        with self.making:
            if key not in self.engines:
                self.engines[key] = api.config_engine(self.store, self.config, key)
            return self.engines[key]

    def generate(self, text, n: int) -> list[int]:
        """text.generate(n), stepped together with every other text generating on the same model of this store."""
        from vecgpt.stepper import Service

        with self.making:
            service = self.services.setdefault(text.engine.key, Service())
        return service.run(text.generating(n))

    def idle(self) -> bool:
        """No text is generating on this store."""
        return all(s.idle() for s in list(self.services.values()))

    def reference(self, key: str):
        """The numpy reference on the same weights as model `key`."""
        import numpy as np

        from vecgpt import weights

        with self.checking:
            if key not in self.references:
                manifest = self.engine(key).manifest
                model = weights.load(manifest["source"], dtype=np.float64)
                if model.fingerprint != manifest["model_fingerprint"]:
                    raise VecgptError(f"{manifest['source']} is no longer the model the store holds; cannot check")
                self.references[key] = model
            return api.reference(self.references[key], np.float64)  # the model's family's

    def secrets(self) -> list[str]:
        return [str(v) for k, v in self.config.store.items() if any(s in k.lower() for s in SECRET_KEYS) and v]

    @contextlib.contextmanager
    def measured(self, entry: Entry):
        """Hold the text (and the store, shared) for operations on it; the dict yielded gets what they cost: the
        meter's summary (requests, subqueries, round trips and seconds, by kind), positions read and, where the
        store keeps a usage tally (turbopuffer), dollars at the published prices (`share`)."""
        from vecgpt.meter import summarize

        with entry.lock, self.lock.shared():
            session, cost = entry.text.session, {}
            before, read = summarize(session.meter.tokens), session.positions_read
            charged = self.charged()
            yield cost
            after = summarize(session.meter.tokens)
            cost.update(difference(before, after), positions_read=session.positions_read - read)
            if charged is not None:
                cost["dollars"] = self.share(charged, cost["total"])

    def charged(self) -> tuple[float, float] | None:
        """(dollars, requests billed) of the store's usage tally so far, where it charges and keeps one."""
        price = self.price()
        if price is None:
            return None
        usage = self.store.usage
        return price(usage), usage.get("query_requests", 0) + usage.get("write_requests", 0)

    def share(self, before: tuple[float, float], requests: float) -> float:
        """An operation's dollars: what the store billed since `before`; where other texts' requests were billed
        meanwhile (texts generated at once), the part of it that its own `requests` are of all billed."""
        dollars, billed = self.charged()
        spent, sent = dollars - before[0], billed - before[1]
        return spent if sent <= requests else spent * requests / sent

    def price(self):
        """The dollars of a usage tally where the store charges and keeps one (turbopuffer), else None."""
        from vecgpt.backends.base import extra

        return extra(self.config.backend, "dollars") if hasattr(self.store, "usage") else None

    def dollars(self) -> float:
        """What this process's store object has spent since it opened."""
        return self.price()(self.store.usage)

    def same_model(self, manifest: dict) -> str:
        """This store's key for the weights of `manifest` (another store's model): its own key where held (the same
        encoding), else one of this config's encoding, loaded from the model's source where missing (as a store
        holding no model gets one), unless its service bills the load."""
        from vecgpt import weights
        from vecgpt.backends.base import extra
        from vecgpt.loading import push, store_fingerprint

        if self.store.read_manifest(manifest["fingerprint"]) is not None:
            return manifest["fingerprint"]
        model = weights.load(manifest["source"])
        if model.fingerprint != manifest["model_fingerprint"]:
            raise VecgptError(f"{manifest['source']} is no longer the model the text runs; cannot compare")
        key = store_fingerprint(model, self.config.metric, self.config.layout)
        if self.store.read_manifest(key) is None:
            if extra(self.config.backend, "estimate_cost") is not None:
                raise Refused(f"store {self.label} does not hold the text's model; run `vecgpt load` with its config")
            with self.lock:  # a model's load: the store alone
                push(self.store, model, self.config.metric, progress=False, layout=self.config.layout)
        return key

    def forced(self, key: str, tokens: list[int], prompt_len: int, top_k: int) -> tuple[list, dict]:
        """The candidates of each position from prompt_len to len(tokens) - 1 with `tokens` teacher-forced, read
        as a text reads them (the prompt as one block, then a token at a time) in a session of its own on model
        `key`, dropped after; and what that cost (as `measured` reports it)."""
        from vecgpt.meter import summarize

        if len(tokens) <= prompt_len:
            return [], {}
        with self.lock.shared():
            charged, session = self.charged(), self.engine(key).session()
            try:
                found = [session.read(tokens[:prompt_len], top_k)]
                for t in tokens[prompt_len:-1]:
                    session.meter.start_token()
                    found.append(session.read([t], top_k))
            finally:
                session.close()
        cost = {**summarize(session.meter.tokens), "positions_read": session.positions_read}
        if charged is not None:
            cost["dollars"] = self.share(charged, cost["total"])
        return found, cost

    def current(self, entry: Entry) -> None:
        """Catch up with what another process wrote to the text (an operation that draws nothing)."""
        with entry.lock, self.lock.shared():
            entry.text.generate(0)


def shelf_of(path: str | None, store: str | None) -> Shelf:
    from vecgpt.backends.base import location_key

    config = load_config(path)
    if store is not None:
        config.store[location_key(config.backend)] = store
    return Shelf(path or "default", config)


class Library:
    """The shelves of a server process and its open texts."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.shelves = [shelf_of(path, settings.store) for path in settings.configs]
        self.texts: dict[str, Entry] = {}
        self.lock = threading.Lock()
        for shelf in self.shelves:
            ensure_model(shelf)
        charging = [shelf.dollars for shelf in self.shelves if shelf.price() is not None]
        self.budget = Budget(settings.max_dollars_per_hour / settings.workers, charging)

    def within_budget(self, index: int) -> None:
        """A 429 for an operation on a store that charges once this process's dollars for the hour are spent."""
        if self.shelves[index].price() is None:
            return
        line = self.budget.over()
        if line is not None:
            raise Refused(line, 429, self.budget.wait_s())

    def close(self) -> None:
        for shelf in self.shelves:
            shelf.store.close()

    def shelf(self, index: int) -> Shelf:
        if not 0 <= index < len(self.shelves):
            raise Refused(f"store {index} is not one of this server's {len(self.shelves)} stores")
        return self.shelves[index]

    def labeled(self, label: str) -> int:
        """The index of the store with this label (a config's path, or "default")."""
        for index, shelf in enumerate(self.shelves):
            if shelf.label == label:
                return index
        names = ", ".join(repr(s.label) for s in self.shelves)
        raise Refused(f"no store {label!r}: this server's stores are {names} (/api/stores lists them)", 404)

    def start(self, store: int, model: str | None, prompt: str, temperature: float, top_k: int, seed: int) -> Entry:
        from vecgpt.text import Text

        limits = self.settings
        if len(prompt) > limits.max_prompt_chars:
            raise Refused(
                f"the prompt has {len(prompt)} characters; this server takes at most {limits.max_prompt_chars}"
            )
        if not prompt:
            raise Refused("type a prompt first")
        self.room()
        shelf = self.shelf(store)
        self.within_budget(store)
        with shelf.lock.shared():
            if model and shelf.store.read_manifest(model) is None:
                raise Refused(f"store {store} holds no model {model}; /api/stores lists what it holds")
            key = model or only_key(shelf)
            engine = shelf.engine(key)
            ids = tokenizer.of_manifest(engine.manifest).encode(prompt)
            check_request(engine.hparams, ids, 0, top_k, temperature, seed)
            text = Text.start(engine, ids, temperature=temperature, top_k=top_k, seed=seed)
        return self.remember(text, store, key)

    def room(self) -> None:
        """A 429 once this process has its limit of texts open."""
        with self.lock:
            if len(self.texts) >= self.settings.max_texts:
                raise Refused(
                    f"this server has {len(self.texts)} texts open, its limit; close one or wait "
                    f"{self.settings.idle_s:.0f} s for idle texts to be closed",
                    429,
                )

    def again(self, entry: Entry, attention_top_k: int | None = None, policy=None) -> Entry:
        """A new text with the prompt, temperature, top_k and seed of the entry's text and another attention policy
        (nothing read yet): a whole vecgpt.policy.Policy, or top-k over K = attention_top_k earlier keys (the
        engine's sinks and window kept); refused in one line before any search where the engine cannot run it."""
        from vecgpt.policy import Policy
        from vecgpt.text import Text

        self.room()
        shelf = self.shelf(entry.store)
        engine = shelf.engine(entry.model)
        try:
            engine.check_policy(policy if policy is not None else Policy(top_k=attention_top_k))
        except VecgptError as e:
            raise Refused(str(e)) from None
        with entry.lock:
            shelf.current(entry)
            t, s = entry.text, entry.text.settings
            prompt = t.tokens[: t.prompt_len]
        with shelf.lock.shared():
            text = Text.start(
                engine, prompt, s["temperature"], s["top_k"], s["seed"], attention_top_k=attention_top_k, policy=policy
            )
        return self.remember(text, entry.store, entry.model)

    def remember(self, text, store: int, model: str) -> Entry:
        """The text's entry: this one, or the one another request resumed it as meanwhile."""
        with self.lock:
            return self.texts.setdefault(text.id, Entry(text, store, model))

    def entry(self, text_id: str) -> Entry:
        """The text, from this process's cache or resumed from whichever store holds it."""
        with self.lock:
            found = self.texts.get(text_id)
        if found is None:
            found = self.resume(text_id)
        found.used = time.monotonic()
        self.within_budget(found.store)
        return found

    def resume(self, text_id: str) -> Entry:
        from vecgpt.text import Text

        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", text_id):
            raise Refused(f"{text_id!r} is not a text id", 404)
        for index, shelf in enumerate(self.shelves):
            with shelf.lock.shared():
                record = shelf.store.read_text(text_id)
                if record is not None:
                    key = record["model"]
                    return self.remember(Text.resume(shelf.engine(key), text_id), index, key)
        raise Refused(f"no text {text_id} (closed, or idle longer than {self.settings.idle_s:.0f} s)", 404)

    def forget(self, text_id: str) -> None:
        with self.lock:
            self.texts.pop(text_id, None)

    def collect(self) -> list[str]:
        """Close every text idle longer than idle_s: this process's cache, then the store's records."""
        from vecgpt.text import gc_texts

        now, idle = time.monotonic(), self.settings.idle_s
        with self.lock:
            for text_id in [i for i, e in self.texts.items() if now - e.used > idle]:
                del self.texts[text_id]
        closed = []
        for shelf in self.shelves:
            with shelf.lock:
                closed += gc_texts(shelf.store, idle)
        with self.lock:
            for text_id in closed:
                self.texts.pop(text_id, None)
        return closed

    def secrets(self) -> list[str]:
        token = [self.settings.token] if self.settings.token else []
        return [s for shelf in self.shelves for s in shelf.secrets()] + token


POLICY_SUMMARY = ("kept_per_head", "dropped_bound")  # meter.policy_summary's


def difference(before: dict, after: dict) -> dict:
    """after - before, for two meter summaries: each total and each by-kind tally (zeros left out)."""

    def minus(a, b):
        return round(a - b, 6) if isinstance(a, float) else a - b

    out = {}
    for key, value in after.items():
        if key in POLICY_SUMMARY:  # not a tally: the text's kept keys per head and largest dropped bound so far
            out[key] = value
        elif isinstance(value, dict):
            kinds = {k: minus(v, before[key].get(k, 0)) for k, v in value.items()}
            out[key] = {k: v for k, v in kinds.items() if v}
        else:
            out[key] = minus(value, before[key])
    return out


def only_key(shelf: Shelf) -> str:
    from vecgpt.engine import only_model

    return only_model(shelf.store)


def ensure_model(shelf: Shelf) -> None:
    """A store holding no model gets the config's model, unless its service bills the load."""
    from vecgpt import weights
    from vecgpt.backends.base import extra
    from vecgpt.loading import push

    if shelf.store.manifests() or extra(shelf.config.backend, "estimate_cost") is not None:
        return
    push(shelf.store, weights.load(shelf.config.model), shelf.config.metric, progress=False, layout=shelf.config.layout)
