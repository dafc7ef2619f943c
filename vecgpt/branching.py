"""A branch of a text: a new text holding the parent's tokens before a position and then a token of the caller's.

It shares the positions before the branch: a store that can copy inside itself (`clone`) copies the parent's rows,
keys and candidates, so no row passes through the client and only positions from the branch on are ever read for
the child. A store without `clone` gets a child that reads its shared positions itself.
"""

from __future__ import annotations

import time
import uuid

from vecgpt.candidates import CANDIDATES, new_session
from vecgpt.meter import SESSION_PREFIX, later


def child_of(parent, p: int, token: int):
    """The child of text `parent` (a vecgpt.text.Text, the class it is made of): tokens[:p], then `token`. Its
    record is written at once; the candidates rows it lacks wait for its next operation's end."""
    session, cloned = parent.session, hasattr(parent.store, "clone")
    landed = parent.rows.landed()
    now = time.time()
    record = {
        **parent.record,
        "tokens": parent.tokens[:p] + [int(token)],
        "settings": dict(parent.settings),
        "spent": {},
        "written": min(session.written, p) if cloned else 0,
        "scored": min(landed, p + 1) if cloned else parent.prompt_len,
        "created": now,
        "updated": now,
    }
    record.pop("version")
    child_id = uuid.uuid4().hex[:12]
    name = SESSION_PREFIX + child_id
    (version,) = session.store.together(later.write_text(child_id, record, None))
    if cloned:
        own = session.name
        session.store.together(later.clone(own, name), later.clone(own + CANDIDATES, name + CANDIDATES))
        child_session = parent.engine.session(name, create=False)
        child_session.adopt(session, record["written"])
    else:
        child_session = new_session(parent.engine, name, parent.settings["top_k"])
    child = type(parent)(parent.engine, child_id, {**record, "version": version}, child_session)
    for q in range(parent.prompt_len, p + 1):
        if q < child.rows.scored:
            child.rows.known[q] = parent.rows.known[q]
        else:
            child.rows.add(q, parent.rows.known[q])
    return child
