"""The memory the server may still take, and the 507 a write gets when it would pass it.

The room left is the least of the machine's available memory (MemAvailable) and, under an address-space limit
(`--memory-limit-mb`, `ulimit -v`), that limit less the process's size (VmSize); a container's limit is not read.
A write reserves WRITE_FACTOR times its body (the body, its parse, the vectors decoded and stored) and a chunk
(the most that growing a namespace allocates at once) before the body is read, and keeps it until it has been
applied; one that would leave less than MARGIN is refused with 507 and nothing is written. An allocation that
fails all the same (MemoryError) is answered with the same 507."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from vecgpt.backends.turbopuffer.server.limits import MAX_BODY, ApiError
from vecgpt.backends.turbopuffer.server.vectors import CHUNK_BYTES

WRITE_FACTOR = 4  # measured: parsing a body of B bytes peaks near 2B, its vectors take 0.75B decoded and stored
MARGIN = 64 * 2**20


def write_need(body_bytes: int) -> int:
    """The bytes a write of this body may take at its peak."""
    return WRITE_FACTOR * min(body_bytes, MAX_BODY) + CHUNK_BYTES


def _status(field: str, path: str) -> int | None:
    try:
        found = re.search(rf"^{field}:\s+(\d+) kB", Path(path).read_text(), re.M)
    except OSError:
        return None
    return None if found is None else int(found.group(1)) * 1024


def room() -> int | None:
    """Bytes the process can still allocate, or None where neither figure can be read."""
    left = []
    available = _status("MemAvailable", "/proc/meminfo")
    if available is not None:
        left.append(available)
    size = _status("VmSize", "/proc/self/status")
    if size is not None:  # Linux, where resource exists
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            left.append(soft - size)
    return min(left) if left else None


class Memory:
    """The bytes reserved by writes in flight (a reservation is a context manager)."""

    def __init__(self, held):
        self.held = held  # () -> (namespaces, bytes of vectors held): for the message
        self.reserved = 0
        self.lock = threading.Lock()

    def reserve(self, nbytes: int, what: str) -> Reservation:
        """A reservation of `nbytes` for `what`, or ApiError 507 when they would leave less than MARGIN."""
        with self.lock:
            left = room()
            if left is not None and left - self.reserved - nbytes < MARGIN:
                raise self.exhausted(what, nbytes, left - self.reserved)
            self.reserved += nbytes
        return Reservation(self, nbytes)

    def release(self, nbytes: int) -> None:
        with self.lock:
            self.reserved -= nbytes

    def exhausted(self, what: str, need: int | None = None, left: int | None = None) -> ApiError:
        """The 507 reply: what was refused, the room, what the server holds, what to do."""
        spaces, vectors = self.held()
        spare = 0 if left is None else max(left - MARGIN, 0)
        short = "" if need is None else f" (it needs about {need / 1e6:,.0f} MB, {spare / 1e6:,.0f} MB can be spared)"
        return ApiError(
            507,
            f"out of memory: the local server cannot take {what}{short}; nothing of it was written. It holds "
            f"{vectors / 1e9:.2f} GB of vectors in {spaces} namespaces: delete some, or give it more memory",
        )


class Reservation:
    def __init__(self, memory: Memory, nbytes: int):
        self.memory, self.nbytes = memory, nbytes

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.memory.release(self.nbytes)
