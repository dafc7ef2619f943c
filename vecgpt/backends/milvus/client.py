"""The MilvusClient a store talks through: Milvus Lite in this process for a file path, a server for a URL; its
errors as one line; collection names as Milvus allows them."""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
from contextlib import contextmanager
from pathlib import Path

from pymilvus import MilvusClient
from pymilvus.exceptions import MilvusException

from vecgpt.backends.base import first_line, record
from vecgpt.errors import VecgptError

ENV_TOKEN = "VECGPT_MILVUS_TOKEN"
LITE_LOCK = "LOCK"  # the file Milvus Lite holds an flock on while a process has its folder open

_lite_users: dict[str, int] = {}  # Lite folder -> stores of this process open on it
_lite_lock = threading.Lock()


def is_lite(uri: str) -> bool:
    return "://" not in uri


def open_client(uri: str, timeout: float) -> MilvusClient:
    """A client of the server at `uri` (token from VECGPT_MILVUS_TOKEN), or of Milvus Lite in the folder `uri`,
    started in this process if no store of this process has it open."""
    if not is_lite(uri):
        if not uri.startswith(("http://", "https://", "tcp://")):
            raise VecgptError(f"milvus uri {uri!r}: give http://host:19530 (a server) or a file path (Milvus Lite)")
        try:
            return MilvusClient(uri=uri, token=os.environ.get(ENV_TOKEN, ""), timeout=timeout)
        except MilvusException as e:
            raise VecgptError(
                f"cannot reach Milvus at {uri} ({reason(e)}); start it, or fix uri "
                f"(and {ENV_TOKEN} if it needs a token)"
            ) from None
    path = str(Path(uri).absolute())
    with _lite_lock:
        if not _lite_users.get(path):
            check_unlocked(path)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with quiet("milvus_lite.server_manager"):
            try:
                client = MilvusClient(uri=path, timeout=timeout)
            except MilvusException as e:
                raise VecgptError(f"Milvus Lite could not open {path} ({reason(e)})") from None
        _lite_users[path] = _lite_users.get(path, 0) + 1
    return client


def every_row(client: MilvusClient, stored: str, fields: list[str], batch: int):
    """A collection's rows, a list of dicts a batch, through pymilvus's query iterator (a request each, counted)."""
    # Milvus Lite serves no timestamps, and pymilvus's iterator says so on the way to doing without
    with quiet("pymilvus.client.iterator.query_iterator", "grpc._server"):
        record()
        batches = client.query_iterator(stored, batch_size=batch, output_fields=fields)
        try:
            while rows := batches.next():
                record()
                yield rows
        finally:
            batches.close()


def check_unlocked(path: str) -> None:
    """Milvus Lite lets one process at a time have a folder open: say so before it fails with a traceback."""
    import fcntl

    lock = Path(path) / LITE_LOCK
    if not lock.is_file():
        return
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise VecgptError(
                f"Milvus Lite at {path} is open in another process (Milvus Lite allows one process per file): "
                f"finish or stop that process, or give this one another path, or use a Milvus server (uri)"
            ) from None
        fcntl.flock(f, fcntl.LOCK_UN)


def release(uri: str) -> None:
    """A store of this process closed its Lite folder: stop Milvus Lite there when none has it open, so another
    process may open it."""
    if not is_lite(uri):
        return
    path = str(Path(uri).absolute())
    with _lite_lock:
        _lite_users[path] = _lite_users.get(path, 1) - 1
        if _lite_users[path] <= 0:
            from milvus_lite.server_manager import server_manager_instance

            del _lite_users[path]
            server_manager_instance.release_server(path)


_muted: dict[str, int] = {}  # logger -> blocks muting it now
_muted_lock = threading.Lock()


@contextmanager
def quiet(*names: str):
    """Mute library loggers for a block, from any thread (Milvus Lite logs a traceback when it cannot start, or
    when pymilvus's iterator asks it for what it lacks; we say one line or nothing)."""
    with _muted_lock:
        for name in names:
            _muted[name] = _muted.get(name, 0) + 1
            logging.getLogger(name).disabled = True
    try:
        yield
    finally:
        with _muted_lock:
            for name in names:
                _muted[name] -= 1
                logging.getLogger(name).disabled = _muted[name] > 0


class RpcErrors(logging.Filter):
    """pymilvus logs every failed request with its traceback before raising; vecgpt raises a line of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("RPC error")


logging.getLogger("pymilvus.decorators").addFilter(RpcErrors())


def reason(error: MilvusException) -> str:
    """What Milvus said, on one line, without pymilvus's wrapping."""
    return first_line(Exception(getattr(error, "message", None) or str(error)))[:300]


def milvus_errors(method):
    """Milvus's own errors as one-line VecgptErrors."""

    @functools.wraps(method)
    def wrapped(self, *args, **kw):
        try:
            return method(self, *args, **kw)
        except MilvusException as e:
            raise VecgptError(f"{self}: {method.__name__} failed ({reason(e)})") from None

    return wrapped


# Milvus names: letters, digits and _, not starting with a digit. vecgpt's (h.3.attn.c_attn, text-<id>) are kept
# as <prefix>_ followed by the name with every other character (and _) written _xx, its hex code.
def encode(prefix: str, name: str) -> str:
    return prefix + "_" + re.sub(r"[^A-Za-z0-9]", lambda m: f"_{ord(m.group()):02x}", name)


def decode(prefix: str, stored: str) -> str | None:
    """The vecgpt name of a Milvus collection, or None if it is not one of this store's."""
    if not stored.startswith(prefix + "_"):
        return None
    try:
        return re.sub(r"_([0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), stored[len(prefix) + 1 :])
    except ValueError:
        return None
