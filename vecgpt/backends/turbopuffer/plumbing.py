"""One request to turbopuffer: the service's limits, the per-namespace concurrency gate, errors as one line,
billing and the request tally (see docs/turbopuffer.md)."""

from __future__ import annotations

import functools
import json
import threading
from collections import Counter
from collections.abc import Sequence

from vecgpt.backends.base import record
from vecgpt.backends.turbopuffer.cost import PRICES
from vecgpt.errors import VecgptError

try:
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover
    _loads = json.loads

MAX_TOP_K = 10_000
MAX_SUBQUERIES = 16
SLOTS = 16
KNN_SLOTS = 2


class Gate:
    """Concurrency slots in flight per namespace, shared by every store of this process."""

    def __init__(self, slots: int):
        self.slots, self.used, self.cond = slots, Counter(), threading.Condition()

    def acquire(self, namespaces: Sequence[str], need: int) -> str:
        """The least busy of these namespaces (copies of one another), once `need` slots are free there."""
        need = min(need, self.slots)
        with self.cond:
            while True:
                best = min(namespaces, key=lambda n: self.used[n])
                if self.used[best] + need <= self.slots:
                    self.used[best] += need
                    return best
                self.cond.wait()

    def release(self, namespace: str, need: int) -> None:
        with self.cond:
            self.used[namespace] -= min(need, self.slots)
            self.cond.notify_all()


_gates: dict[tuple[str, int], Gate] = {}
_gates_lock = threading.Lock()


def gate_for(url: str, slots: int) -> Gate:
    with _gates_lock:
        return _gates.setdefault((url, slots), Gate(slots))


class Plumbing:
    """The plumbing a store sends its requests through (needs client, url, usage, _lock, _handles)."""

    def _ns(self, name: str):
        handle = self._handles.get(name)
        if handle is None:
            handle = self._handles[name] = self.client.namespace(name)
        return handle

    def _call(self, what: str, namespace: str, fn, missing=VecgptError, conflict_ok=False):
        """Run one request; turbopuffer's errors become one-line VecgptErrors (the key is never shown)."""
        import turbopuffer as tp

        try:
            return fn()
        except tp.ConflictError:
            if conflict_ok:  # a retried idempotent create: an earlier attempt landed
                return None
            raise VecgptError(f"turbopuffer answered 409 (conflict) on {what} ({namespace!r}) after retries") from None
        except tp.AuthenticationError:
            raise VecgptError(
                f"turbopuffer at {self.url} rejected the API key (401); check TURBOPUFFER_API_KEY"
            ) from None
        except tp.PermissionDeniedError:
            raise VecgptError(
                f"turbopuffer at {self.url} refused access to namespace {namespace!r} (403); "
                f"the API key lacks permission"
            ) from None
        except tp.NotFoundError:
            if missing is None:
                return None
            raise VecgptError(
                f"turbopuffer has no namespace {namespace!r} ({what}); is the model loaded (`vecgpt load`)?"
            ) from None
        except tp.RateLimitError as e:
            raise VecgptError(
                f"turbopuffer kept refusing {what} on {namespace!r} with 429 (rate or concurrency "
                f"limit) after retries: {_detail(e)}"
            ) from None
        except tp.APIStatusError as e:
            raise VecgptError(f"turbopuffer error {e.status_code} on {what} ({namespace!r}): {_detail(e)}") from None
        except tp.APIConnectionError as e:
            raise VecgptError(
                f"cannot reach turbopuffer at {self.url} ({type(e).__name__}); check base_url/region and the network"
            ) from None

    def _raw(self, what: str, namespace: str, method: str, missing=VecgptError, conflict_ok=False, **kw):
        resp = self._call(
            what, namespace, lambda: getattr(self._ns(namespace).with_raw_response, method)(**kw), missing, conflict_ok
        )
        return None if resp is None else _loads(resp.read())

    def _write(self, namespace: str, what: str = "write", conflict_ok=False, **body) -> dict:
        record()
        out = self._raw(what, namespace, "write", conflict_ok=conflict_ok, **body)
        self._bill(written=(out or {}).get("billing", {}).get("billable_logical_bytes_written", 0), write=True)
        return out

    def _bill(self, written=0, queried=0, returned=0, subqueries=0, write=False) -> None:
        with self._lock:
            if write:
                self.usage["write_requests"] += 1
                self.usage["billed_written"] += max(written, PRICES["min_write_bytes"])
            else:
                self.usage["query_requests"] += 1
                self.usage["subqueries"] += subqueries
                self.usage["billed_queried"] += max(queried, PRICES["min_query_bytes"] * subqueries)
                self.usage["billed_returned"] += returned

    def _json_rows(self, namespace: str, attribute: str, what: str) -> dict[str, dict]:
        """Every row of a small bookkeeping namespace (catalog, models), its JSON attribute parsed, by id."""
        body = {"rank_by": ["id", "asc"], "top_k": self.max_top_k, "include_attributes": [attribute]}
        out = self._query(namespace, body, what, missing=None)
        return {row["id"]: json.loads(row[attribute]) for row in ([] if out is None else out.get("rows", []))}

    def _query(self, namespace: str, body: dict, what="query", missing=VecgptError, subqueries=1) -> dict | None:
        record(1, subqueries)
        out = self._raw(what, namespace, "multi_query" if "queries" in body else "query", missing=missing, **body)
        if out is not None:
            billing = out.get("billing", {})
            self._bill(
                queried=billing.get("billable_logical_bytes_queried", 0),
                returned=billing.get("billable_logical_bytes_returned", 0),
                subqueries=subqueries,
            )
        return out

    def _delete_namespace(self, ns: str) -> None:
        record()
        self._call("delete", ns, lambda: self._ns(ns).delete_all(), missing=None)


def _detail(e) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        msg = body.get("error") or body.get("message") or body
    else:
        msg = body or str(e)
    return str(msg).splitlines()[0][:300] if str(msg) else type(e).__name__


@functools.lru_cache(maxsize=1)
def bounded_client_class():
    import turbopuffer

    class BoundedClient(turbopuffer.Turbopuffer):
        """Retries wait by the backoff schedule only, never a server's Retry-After (the client honours up to 30
        minutes), so a failing request gives up within base.worst_case_s(timeout, max_retries)."""

        def _parse_retry_after_header(self, response_headers=None):
            return None

    return BoundedClient
