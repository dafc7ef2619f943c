"""Concurrency slots per namespace (16 by default). A query that finds too few free slots waits up to
800 ms and then gets 429; one that needs more than there are gets 429 at once, `x-should-retry: false`.
Counts 429s and the peak slots in use into the server's stats."""

from __future__ import annotations

import asyncio
from collections import Counter

from vecgpt.backends.turbopuffer.server.limits import SLOT_WAIT_S, ApiError


class Slots:
    def __init__(self, slots: int, stats: Counter):
        self.slots, self.stats = slots, stats
        self.in_use: Counter = Counter()
        self.conditions: dict[str, asyncio.Condition] = {}

    async def acquire(self, name: str, need: int) -> None:
        if need > self.slots:
            self.stats["429"] += 1
            raise ApiError(
                429,
                f"this query needs {need} concurrency slots; a namespace has {self.slots} (a kNN subquery takes 2)",
                {"x-should-retry": "false"},
            )
        cond = self.conditions.setdefault(name, asyncio.Condition())
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(lambda: self.in_use[name] + need <= self.slots), SLOT_WAIT_S)
            except asyncio.TimeoutError:
                self.stats["429"] += 1
                raise ApiError(429, f"too many concurrent queries on namespace '{name}'") from None
            self.in_use[name] += need
            self.stats["peak_slots"] = max(self.stats["peak_slots"], self.in_use[name])

    async def release(self, name: str, need: int) -> None:
        cond = self.conditions[name]
        async with cond:
            self.in_use[name] -= need
            cond.notify_all()
