"""HTTP: the pages, the JSON API, and generation as server-sent events.

Handlers run in worker threads; a generation runs in a thread of its own, which hands each token to its event
stream on the event loop (no thread waits on a stream). Generations of different texts run at once, their
reads stepped together (server.Shelf.generate).

Errors are JSON {"error": one line}: 4xx for a request to fix, 503 for a store that failed (the server keeps
running). A message never carries a config's DSN or key: `clean` strips them and any URL with credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import sys
import threading
import time
from importlib import resources

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from vecgpt import api
from vecgpt.errors import VecgptError
from vecgpt.playground import views
from vecgpt.playground.server import Library, Refused, check_request

STATIC = resources.files("vecgpt.playground") / "static"


def clean(message: str, secrets: list[str]) -> str:
    """One line, with every known secret and any scheme://user:password@ credential removed."""
    line = (str(message).strip().splitlines() or ["unknown error"])[0]
    for secret in secrets:
        line = line.replace(secret, "***")
    return re.sub(r"(\w+://)[^\s/@]*@", r"\1***@", line)[:300]


def failure(e: Exception, library: Library) -> JSONResponse:
    if isinstance(e, Refused):
        wait = {"Retry-After": str(math.ceil(e.retry_after_s))} if e.retry_after_s else None
        return JSONResponse({"error": clean(e, library.secrets())}, e.status, headers=wait)
    return JSONResponse({"error": f"store error: {clean(e, library.secrets())}"}, 503)


def guarded(handler):
    """Run a sync handler(library, request, body) in a worker thread; its dict as JSON, its error as one line."""

    async def endpoint(request: Request):
        library: Library = request.app.state.library
        try:
            body = await read_json(request, library.settings.max_body_bytes)
            return JSONResponse(await run_in_threadpool(handler, library, request, body))
        except Exception as e:  # noqa: BLE001 - every failure is one line for the page
            return failure(e, library)

    return endpoint


async def read_json(request: Request, limit: int) -> dict:
    if request.method == "GET":
        return {}
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Refused(f"the request body has {declared} bytes; this server takes at most {limit}", 413)
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise Refused(f"the request body is over this server's limit of {limit} bytes", 413)
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        raise Refused("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused("the request body must be a JSON object")
    return body


TYPES = {str: "a string", int: "a whole number", float: "a finite number"}
REQUIRED = object()  # a field with no default


def field(body: dict, name: str, kind, default=REQUIRED, null: bool = False):
    """A JSON field of type `kind` (a whole number: an int, or a float without a fraction; never true or false),
    `default` where absent, None where null and `null` allows it; else a 400 naming the field and its type."""
    if name not in body:
        if default is REQUIRED:
            raise Refused(f"{name} is missing: it takes {TYPES[kind]}")
        return default
    value = body[name]
    if value is None and null:
        return None
    if not fits(value, kind):
        raise Refused(f"{name} must be {TYPES[kind]}, not {described(value)}")
    return kind(value)


def fits(value, kind) -> bool:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return False
    if kind is str or isinstance(value, str):
        return kind is str and isinstance(value, str)
    if isinstance(value, int):
        return kind is int or abs(value) <= sys.float_info.max
    return math.isfinite(value) and (kind is float or value.is_integer())


def described(value) -> str:
    """A JSON value as an error names it: its type, and the value where short."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("..." * (len(value) > 40))
    if isinstance(value, (list, dict)):
        return "an array" if isinstance(value, list) else "an object"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "-infinity" if value < 0 else "infinity"
    text = str(value) if not isinstance(value, int) or value.bit_length() < 128 else "a number too long to show"
    return f"the number {text}"


def param(values, name: str, default=REQUIRED) -> int:
    """A whole number in a query or path parameter (text), `default` where absent; else a 400."""
    if name not in values:
        if default is REQUIRED:
            raise Refused(f"{name} is missing: it takes a whole number")
        return default
    text = values[name]
    try:
        if re.fullmatch(r"[+-]?\d+", text.strip()):
            return int(text)
    except ValueError:  # more digits than Python converts
        pass
    raise Refused(f"{name} must be a whole number, not {text[:40]!r}")


# ----------------------------------------------------------------------------- texts


def stores(library, request, body):
    return {"stores": views.stores_view(library.shelves)}


def spending(library, request, body):
    """This process's dollars in the last hour on stores that charge, and its limit."""
    return library.budget.view()


def start(library, request, body):
    entry = library.start(
        field(body, "store", int, 0),
        field(body, "model", str, None, null=True) or None,
        field(body, "prompt", str, ""),
        field(body, "temperature", float, 0.0),
        field(body, "top_k", int, 40),
        field(body, "seed", int, 0),
    )
    return views.text_view(entry, library.shelf(entry.store))


def top_k(library, request, body):
    """POST /api/texts/{id}/top-k {attention_top_k: K}: `policy` with K alone (the engine's sinks and window kept)."""
    entry = library.entry(request.path_params["text_id"])
    new = library.again(entry, attention_top_k=field(body, "attention_top_k", int))
    return views.text_view(new, library.shelf(new.store))


def policy(library, request, body):
    """POST /api/texts/{id}/policy {attention_top_k?, attention_threshold?, attention_sinks?, attention_window?}: a
    new text as the text began (its prompt, temperature, top_k and seed) under this attention policy (a field absent
    or null: unset; all unset: every key), nothing read yet: the page generates it as any text."""
    from vecgpt.policy import Policy

    entry = library.entry(request.path_params["text_id"])
    new = library.again(
        entry,
        policy=Policy(
            field(body, "attention_top_k", int, None, null=True),
            field(body, "attention_threshold", float, None, null=True),
            field(body, "attention_sinks", int, None, null=True),
            field(body, "attention_window", int, None, null=True),
        ),
    )
    return views.text_view(new, library.shelf(new.store))


def current(make):
    """A handler answering make(entry, shelf, request) on the text as the store holds it now (caught up with
    what another process wrote)."""

    def handler(library, request, body):
        entry = library.entry(request.path_params["text_id"])
        shelf = library.shelf(entry.store)
        with entry.lock:
            shelf.current(entry)
            return make(entry, shelf, request)

    return handler


show = current(lambda entry, shelf, request: views.text_view(entry, shelf))
candidates = current(lambda entry, shelf, request: views.candidates_view(entry, int(request.path_params["position"])))
check = current(lambda entry, shelf, request: views.check_view(entry, shelf))
export = current(lambda entry, shelf, request: api.text_json(entry.text))  # `vecgpt texts show ID --json`


def compare(library, request, body):
    """GET /api/texts/{id}/compare?store=LABEL: the text's tokens read again on store LABEL (another store, or
    the same model in another encoding), its candidates beside the text's; the text held meanwhile."""
    entry, label = library.entry(request.path_params["text_id"]), request.query_params.get("store")
    if not label:
        raise Refused("name a store to compare with: ?store=LABEL (/api/stores lists the labels)")
    index = library.labeled(label)
    library.within_budget(index)
    shelf, other = library.shelf(entry.store), library.shelf(index)
    with entry.lock:
        try:
            shelf.current(entry)
        except VecgptError:
            refuse_if_closed(library, shelf, entry.text)
            raise
        t = entry.text
        key = other.same_model(shelf.engine(entry.model).manifest)
        found, cost = other.forced(key, t.tokens, t.prompt_len, t.settings["top_k"])
        return {**views.compare_view(entry, shelf, other, key, found), "cost": cost}


def step_back(library, request, body):
    """Step back to a generated token: drop it and what follows."""
    entry, position = library.entry(request.path_params["text_id"]), field(body, "position", int)
    shelf = library.shelf(entry.store)
    with shelf.measured(entry) as cost:
        shelf.current(entry)
        check_position(entry, position, len(entry.text.tokens))
        entry.text.step_back(position)
        entry.drop_costs(position)
    return {**views.text_view(entry, shelf), "cost": cost}


def branch(library, request, body):
    entry, position = library.entry(request.path_params["text_id"]), field(body, "position", int)
    token, shelf = field(body, "token", int), library.shelf(entry.store)
    if not 0 <= token < shelf.engine(entry.model).hparams.n_vocab:
        raise Refused(f"token {token} is outside the model's vocabulary")
    with shelf.measured(entry) as cost:
        shelf.current(entry)
        check_position(entry, position)
        new = entry.text.branch(position, token)
    return {**views.text_view(library.remember(new, entry.store, entry.model), shelf), "cost": cost}


def retry(library, request, body):
    """Retry at a generated position: keep the tokens before it, draw it again with another seed (which later
    draws of the text use too)."""
    entry, position = library.entry(request.path_params["text_id"]), field(body, "position", int)
    seed, shelf = field(body, "seed", int, 1), library.shelf(entry.store)
    if seed < 0:
        raise Refused(f"seed must be 0 or more, not {seed}")
    with shelf.measured(entry) as cost:
        shelf.current(entry)
        check_position(entry, position)
        if position + 1 < len(entry.text.tokens):
            entry.text.step_back(position + 1)
        entry.text.retry(seed)
        entry.drop_costs(position)
    return {**views.text_view(entry, shelf), "cost": cost}


def check_position(entry, position: int, end: int | None = None) -> None:
    """A generated position (or, with `end`, up to it)."""
    t = entry.text
    if not t.prompt_len <= position < (end + 1 if end is not None else len(t.tokens)):
        raise Refused(f"position {position} is not a generated token (those are {t.prompt_len}..{len(t.tokens) - 1})")


def refuse_if_closed(library, shelf, t) -> None:
    """After an operation on text `t` failed: a 404 if another process closed it (its record is gone)."""
    if shelf.store.read_text(t.id) is None:
        library.forget(t.id)
        raise Refused(f"text {t.id} is closed; start a new one", 404) from None


def inspected(lens_only: bool):
    """GET /api/texts/{id}/attention/{position}[?layer=L]: attention's q.k and weights at a position (every
    layer's, or layer L's) and the logit lens; /lens/{position}: the lens alone. Both read the position again."""

    def handler(library, request, body):
        entry, position, layer = inspect_request(library, request)
        t, shelf = entry.text, library.shelf(entry.store)
        try:
            with shelf.measured(entry) as cost:
                found = t.inspect(position)
        except VecgptError:
            refuse_if_closed(library, shelf, t)
            raise
        layers = None if lens_only else ([layer] if layer is not None else list(range(t.engine.hparams.n_layer)))
        return {**views.inspection_view(entry, found, layers), "cost": cost}

    return handler


def inspect_request(library, request):
    """(the text's entry, a position within it, the ?layer= asked for or None), or a one-line 4xx."""
    entry, query = library.entry(request.path_params["text_id"]), dict(request.query_params)
    position, t = param(request.path_params, "position"), entry.text
    n_layer = t.engine.hparams.n_layer
    layer = param(query, "layer", None)
    if layer is not None and not 0 <= layer < n_layer:
        raise Refused(f"layer {layer} is out of range: this model's layers are 0 to {n_layer - 1}")
    if not 0 <= position < len(t.tokens):
        raise Refused(f"position {position} is beyond the text: its positions are 0 to {len(t.tokens) - 1}")
    return entry, position, layer


def close(library, request, body):
    entry = library.entry(request.path_params["text_id"])
    with entry.lock, library.shelf(entry.store).lock.shared():
        entry.text.close()
    library.forget(entry.text.id)
    return {"closed": entry.text.id}


# ----------------------------------------------------------------------------- generation as events


async def generate(request: Request):
    """GET /api/texts/{id}/generate?n=N: an event per token as it is drawn, then "done" (or one "error")."""
    library: Library = request.app.state.library
    try:
        n = param(request.query_params, "n", 8)
        entry = await run_in_threadpool(library.entry, request.path_params["text_id"])
        t, shelf = entry.text, library.shelf(entry.store)
        await run_in_threadpool(shelf.current, entry)
        s = t.settings
        check_request(shelf.engine(entry.model).hparams, t.tokens, n, s["top_k"], s["temperature"], s["seed"])
    except Exception as e:  # noqa: BLE001
        return failure(e, library)
    loop, events = asyncio.get_running_loop(), asyncio.Queue()

    def put(kind: str, data: dict) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: the server is stopping
            loop.call_soon_threadsafe(events.put_nowait, (kind, data))

    hook, gone = getattr(request.app.state, "before_token", None), threading.Event()
    threading.Thread(target=produce, args=(library, entry, n, put, hook, gone), daemon=True).start()
    return StreamingResponse(relay(events, gone), media_type="text/event-stream", headers={"Cache-Control": "no-store"})


def produce(library: Library, entry, n: int, put, hook, gone: threading.Event) -> None:
    """Draw n tokens one at a time (each its own operation and cost), handing each to put(kind, data), stopping
    early once the page has gone (its Stop button, or closed). Each token is stepped with those of the other texts
    generating on the same model of the store (Shelf.generate)."""
    t, shelf = entry.text, library.shelf(entry.store)
    try:
        for _ in range(n):
            if gone.is_set():
                break
            if hook is not None:
                hook(len(t.tokens))
            library.within_budget(entry.store)
            with shelf.measured(entry) as cost:
                drawn = shelf.generate(t, 1)
                position = len(t.tokens) - 1
            if not drawn:
                break
            entry.costs[position] = (drawn[-1], cost)
            put("token", {**views.token_rows(t, [drawn[-1]], position)[0], "cost": cost})
            if drawn[-1] == t.tokenizer.eos:
                break
        put("done", {"tokens": len(t.tokens)})
    except Exception as e:  # noqa: BLE001
        put("error", json.loads(failure(e, library).body))
    finally:
        entry.used = time.monotonic()


async def relay(events: asyncio.Queue, gone: threading.Event):
    """The events as they come; when the reader goes away (this generator is closed or cancelled), `gone`."""
    try:
        while True:
            kind, data = await events.get()
            yield f"event: {kind}\ndata: {json.dumps(data)}\n\n"
            if kind in ("done", "error"):
                return
    finally:
        gone.set()


# ----------------------------------------------------------------------------- streaming attention


def attention_memory(library, request, body):
    from vecgpt.cli.attention import memory_rows

    q = dict(request.query_params)
    heads, context = param(q, "heads", 12), param(q, "context", 1024)
    head_dim, tile = param(q, "head_dim", 64), param(q, "tile", 8)
    block = param(q, "query_block", 0)
    dtype = q.get("dtype", "float32")
    for name, value, top in (("heads", heads, 1024), ("context", context, 131072), ("head_dim", head_dim, 4096)):
        if not 1 <= value <= top:
            raise Refused(f"{name} must be between 1 and {top:,}, not {value}")
    if not 1 <= tile <= context or dtype not in ("float32", "float64"):
        raise Refused("tile must be between 1 and the context; dtype float32 or float64")
    return {**memory_rows(heads, [context], head_dim, block or None, tile, dtype)[0], "weights": GPT2_SMALL}


def gpt2_small() -> dict:
    """GPT-2 small's weights in float32: the scale the page draws the attention memory against."""
    from vecgpt import weights

    n = weights.parameter_count(weights.HParams(n_layer=12, n_head=12, n_embd=768, n_ctx=1024, n_vocab=50257))
    return {"name": "GPT-2 small", "parameters": n, "bytes": 4 * n, "dtype": "float32"}


GPT2_SMALL = gpt2_small()


def softmax_walk(library, request, body):
    from vecgpt.cli.attention import parse_scores, walk

    tile, words = field(body, "tile", int, 1), score_words(body)
    if not words:
        raise Refused("scores is empty: give numbers, as a string or an array")
    if len(words) > 4096 or not 1 <= tile <= 4096:
        raise Refused("at most 4,096 scores, and a tile from 1 to 4,096")
    try:
        return walk(parse_scores(words), tile)
    except ValueError as e:
        raise Refused(str(e)) from None


def score_words(body: dict) -> list[str]:
    """The softmax walk's scores, a string of numbers (where "-inf" may be written) or an array of numbers."""
    raw = body.get("scores", "")
    if isinstance(raw, str):
        return raw.replace(",", " ").split()
    bad = [x for x in raw if not fits(x, float)][:1] if isinstance(raw, list) else [raw]
    if bad:
        what = described(raw) if not isinstance(raw, list) else f"an array holding {described(bad[0])}"
        raise Refused(f"scores must be a string or an array of numbers, not {what}")
    return [repr(float(x)) for x in raw]


# ----------------------------------------------------------------------------- pages


def page(name: str):
    async def endpoint(request: Request):
        return HTMLResponse((STATIC / name).read_text())

    return endpoint


async def favicon(request: Request):
    return Response((STATIC / "favicon.svg").read_bytes(), media_type="image/svg+xml")


ROUTES = [
    Route("/", page("playground.html")),
    Route("/attention", page("attention.html")),
    Route("/favicon.ico", favicon),
    Route("/api/stores", guarded(stores)),
    Route("/api/spending", guarded(spending)),
    Route("/api/texts", guarded(start), methods=["POST"]),
    Route("/api/texts/{text_id}", guarded(show)),
    Route("/api/texts/{text_id}", guarded(close), methods=["DELETE"]),
    Route("/api/texts/{text_id}/generate", generate),
    Route("/api/texts/{text_id}/candidates/{position:int}", guarded(candidates)),
    Route("/api/texts/{text_id}/step-back", guarded(step_back), methods=["POST"]),
    Route("/api/texts/{text_id}/branch", guarded(branch), methods=["POST"]),
    Route("/api/texts/{text_id}/retry", guarded(retry), methods=["POST"]),
    Route("/api/texts/{text_id}/check", guarded(check)),
    Route("/api/texts/{text_id}/top-k", guarded(top_k), methods=["POST"]),
    Route("/api/texts/{text_id}/policy", guarded(policy), methods=["POST"]),
    Route("/api/texts/{text_id}/compare", guarded(compare)),
    Route("/api/texts/{text_id}/attention/{position}", guarded(inspected(lens_only=False))),
    Route("/api/texts/{text_id}/lens/{position}", guarded(inspected(lens_only=True))),
    Route("/api/texts/{text_id}/export", guarded(export)),
    Route("/api/attention-memory", guarded(attention_memory)),
    Route("/api/softmax-walk", guarded(softmax_walk), methods=["POST"]),
    Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
]
