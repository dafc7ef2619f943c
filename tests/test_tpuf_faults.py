"""Generation through turbopuffer when a fifth of the requests fail (`vecgpt tpuf-local --fail-rate 0.2`):
429s and 500s before a request is handled, and replies lost to a dropped connection after it was
handled (a committed write whose client does not know). The client retries each of them.

The chance of a lost request: each attempt fails independently with p = 0.2 (the seeded draws do not
depend on the request), so a request is lost only when its first attempt and all of its R retries fail:
p^(R+1). With R = 12 that is 0.2^13 = 8.2e-10 a request, and over the N requests of the run at most
N x 8.2e-10: the test counts N (about 100 attempts for a 2-token prompt and 2 new tokens on the tiny
model, so about 1e-7) and asserts the product is below 1e-6. (With the client's default of 4 retries it
would be 0.2^5 = 3.2e-4 a request, about 3% a run: not negligible.) Every write the
engine sends is an idempotent upsert or delete, so a retried one that had landed changes nothing; a
create that still met 409 would be taken as done (tests/test_turbopuffer.py)."""

import uuid

import pytest

pytest.importorskip("turbopuffer")
pytest.importorskip("starlette")

from vecgpt import tokenizer  # noqa: E402
from vecgpt.api import generate  # noqa: E402
from vecgpt.backends import turbopuffer as tpb  # noqa: E402
from vecgpt.backends.turbopuffer.server import Running  # noqa: E402
from vecgpt.backends.turbopuffer.server.faults import Faults  # noqa: E402
from vecgpt.engine import Engine  # noqa: E402
from vecgpt.loading import push  # noqa: E402

P, RETRIES = 0.2, 12


@pytest.mark.fault
def test_generation_under_a_fifth_of_requests_failing_gives_the_clean_tokens(tiny_model, monkeypatch):
    monkeypatch.setenv("TURBOPUFFER_API_KEY", "local")
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    running = Running(float32=True)
    prefix = f"f{uuid.uuid4().hex[:8]}-"
    try:
        clean = tpb.connect(base_url=running.url, prefix=prefix, max_retries=0)
        push(clean, tiny_model, "l2", progress=False)
        ids = tokenizer.encode("Hello there")
        text = Engine(clean).open()
        want = generate(text, ids, 2, stop=False).tokens
        text.close()
        clean.close()
        running.server.stats.clear()
        running.server.faults = Faults(P, seed=11)
        store = tpb.connect(base_url=running.url, prefix=prefix, max_retries=RETRIES)
        text = Engine(store).open()
        got = generate(text, ids, 2, stop=False).tokens
        text.close()
        store.close()
        stats = dict(running.server.stats)
    finally:
        running.stop()
    assert got == want
    assert min(stats.get(f"fault_{k}", 0) for k in ("429", "500", "drop")) > 0
    n = stats["requests"] + sum(stats.get(f"fault_{k}", 0) for k in ("429", "500"))  # attempts the server saw
    assert n * P ** (RETRIES + 1) < 1e-6  # the chance that any request of this run was lost
    assert not [n for n in running.server.namespaces if n.startswith(prefix + "text-")]  # closed, nothing leaked
