"""The JSON the pages read: a text, a position's candidates, the stores, the numpy check, the comparison with
another store; a text's export is
`api.text_json`. Never a DSN or key: a store is described by `api.location` (backend and where it keeps its data)."""

from __future__ import annotations

import math

from vecgpt import api
from vecgpt.playground.server import Entry, Refused, Shelf
from vecgpt.policy import from_settings, settings


def token_rows(text, tokens: list[int], start: int = 0) -> list[dict]:  # `text`'s tokens, read by its tokenizer
    return [{"position": start + i, "id": t, "text": text.tokenizer.decode([t])} for i, t in enumerate(tokens)]


def text_view(entry: Entry, shelf: Shelf) -> dict:
    t = entry.text
    hp = shelf.engine(entry.model).hparams
    return {
        "id": t.id,
        "store": entry.store,
        "model": entry.model,
        "prompt_len": t.prompt_len,
        "tokens": token_rows(t, t.tokens),
        "text": t.tokenizer.decode(t.tokens[t.prompt_len :]),
        "settings": t.settings,
        "spent": t.record.get("spent") or {},  # what the text's operations have sent, in every process
        "costs": {
            p: cost for p, (token, cost) in list(entry.costs.items()) if p < len(t.tokens) and t.tokens[p] == token
        },
        "n_ctx": hp.n_ctx,
        "n_vocab": hp.n_vocab,
    }


probabilities = api.probabilities  # what sampling draws from, as the page shows it


def candidates_view(entry: Entry, position: int) -> dict:
    t = entry.text
    if not t.prompt_len <= position < len(t.tokens):
        raise Refused(f"position {position} is not a generated token (those are {t.prompt_len}..{len(t.tokens) - 1})")
    rows = api.candidate_rows(t, position)
    if rows is None:
        raise Refused(f"position {position} has no candidates stored", 404)
    return {
        "position": position,
        "chosen": t.tokens[position],
        **{k: t.settings[k] for k in ("temperature", "top_k")},
        "rows": rows,
    }


def stores_view(shelves: list[Shelf]) -> list[dict]:
    from vecgpt.loading import models

    out = []
    for index, shelf in enumerate(shelves):
        with shelf.lock:
            held, stats = models(shelf.store), shelf.store.stats()
        sizes = [v for v in stats.values() if isinstance(v, dict)]
        out.append(
            {
                "index": index,
                "label": shelf.label,
                "location": api.location(shelf.store, shelf.config.backend),
                "metric": shelf.config.metric,
                "loads": not bills_loads(shelf),  # a comparison loads a model it lacks
                "documents": sum(v.get("documents", 0) for v in sizes),
                "bytes": sum(v.get("bytes", 0) for v in sizes),
                "models": [
                    {
                        "key": m["fingerprint"],
                        "model_fingerprint": m.get("model_fingerprint"),  # the weights, in any encoding
                        "source": m["source"],
                        "documents": m.get("documents"),
                        "bytes": m["bytes"],
                    }
                    for m in held
                ],
            }
        )
    return out


def bills_loads(shelf: Shelf) -> bool:
    from vecgpt.backends.base import extra

    return extra(shelf.config.backend, "estimate_cost") is not None


def check_view(entry: Entry, shelf: Shelf) -> dict:
    """The largest |store logit - numpy logit| over each generated position's candidates."""
    t = entry.text
    rows = []
    last = len(t.tokens) - 1  # the last token is drawn, not necessarily read: its candidates came from before it
    if last >= t.prompt_len:
        logits = shelf.reference(entry.model).logits(t.tokens[:last])  # [last, n_vocab]
        for p in range(t.prompt_len, last + 1):
            cands = t.candidates(p) or []
            diff = max((abs(x - float(logits[p - 1, i])) for i, x, _ in cands), default=None)
            rows.append({"position": p, "max_abs_diff": diff})
    return {"id": t.id, "positions": rows}


def compare_view(entry: Entry, shelf: Shelf, other: Shelf, key: str, found: list) -> dict:
    """Each generated position's candidates beside those another store (or encoding) read with the same tokens
    (`found`, Shelf.forced): the largest |logit difference| over the ids both have, and whether the ids differ
    in order or set."""
    t, rows = entry.text, []
    for p, theirs in zip(range(t.prompt_len, len(t.tokens)), found):
        mine = t.candidates(p)
        if mine is None:
            rows.append({"position": p, "max_abs_diff": None, "order_differs": None, "shared": 0})
            continue
        a, b = {i: x for i, x, _ in mine}, dict(zip(theirs.ids.tolist(), theirs.logits.tolist()))
        both = a.keys() & b.keys()
        rows.append(
            {
                "position": p,
                "max_abs_diff": max((abs(a[i] - b[i]) for i in both), default=None),
                "order_differs": [i for i, _, _ in mine] != theirs.ids.tolist(),
                "shared": len(both),
            }
        )
    return {
        "id": t.id,
        "this": encoding_view(shelf, entry.model),
        "other": encoding_view(other, key),
        "positions": rows,
    }


def encoding_view(shelf: Shelf, key: str) -> dict:
    manifest = shelf.engine(key).manifest
    return {
        "label": shelf.label,
        "model": key,
        "metric": manifest["metric"],
        "layout": manifest.get("layout") or "four",
    }


def inspection_view(entry: Entry, found, layers: list[int] | None) -> dict:
    """A position read again (vecgpt.engine.Inspection): attention's q.k and weights of `layers` (None: none),
    each head's over the positions 0..position, and the logit lens after every layer."""
    t, (n_layer, n_head, n) = entry.text, found.weights.shape
    top = t.candidates(found.position + 1)
    return {
        "id": t.id,
        "position": found.position,
        "token": token_rows(t, [found.token], found.position)[0],
        "n_layer": n_layer,
        "n_head": n_head,
        "key_heads": found.key_heads,  # the key head each query head reads (grouped-query attention)
        "scale": 1 / math.sqrt(t.engine.hparams.head_dim),  # weight = softmax(q.k * scale)
        "attention_top_k": t.settings.get("attention_top_k"),
        "policy": settings(from_settings(t.settings)),  # the text's: its keys were kept by it (None: unset)
        "keys": token_rows(t, t.tokens[:n]),
        "attention": [
            {"layer": i, "head": h, "scores": finite(found.scores[i, h]), "weights": found.weights[i, h].tolist()}
            for i in layers or []
            for h in range(n_head)
        ],
        "lens": [
            {
                "layer": i,
                "tokens": [{"id": int(k), "text": t.tokenizer.decode([int(k)]), "logit": float(x)} for k, x in zip(*c)],
            }
            for i, c in enumerate(found.lens)
        ],
        "lens_searches": len(found.lens),
        "next": None if top is None else {"id": top[0][0], "logit": top[0][1], "text": top[0][2]},
    }


def finite(scores) -> list:
    """q.k as JSON: None for a key the text's attention policy did not keep (-inf: weight 0)."""
    return [x if math.isfinite(x) else None for x in scores.tolist()]
