"""The dollars a server process may spend on stores that charge (turbopuffer), over a sliding hour.

The stores' usage tallies only grow, so what was spent in the last hour is the total now less the total an
hour ago. The total is sampled at each check (at most once a second); the oldest sample kept is the last one
taken at least an hour ago, so the figure is never less than what the last hour cost.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 3600.0


class Budget:
    """`limit` dollars an hour over the sum of `totals` (each a store's dollars so far)."""

    def __init__(
        self, limit: float, totals: list[Callable[[], float]], window_s: float = WINDOW_S, clock=time.monotonic
    ):
        self.limit, self.totals, self.window_s, self.clock = limit, totals, window_s, clock
        self.lock = threading.Lock()
        self.samples: deque[tuple[float, float]] = deque([(clock(), self.total())])

    @property
    def charging(self) -> bool:
        return bool(self.totals)

    def total(self) -> float:
        return sum(f() for f in self.totals)

    def spent(self) -> float:
        """Dollars spent in the last hour (the window)."""
        with self.lock:
            now, total = self.clock(), self.total()
            if now - self.samples[-1][0] >= 1.0:
                self.samples.append((now, total))
            while len(self.samples) > 1 and self.samples[1][0] <= now - self.window_s:
                self.samples.popleft()
            return total - self.samples[0][1]

    def wait_s(self) -> float:
        """Seconds until enough of the last hour's spending leaves the window to go under the limit."""
        with self.lock:
            now, total = self.clock(), self.total()
            later = next((t for t, v in self.samples if total - v < self.limit), now)
            return min(self.window_s, max(1.0, (later - now) + self.window_s))  # never past the window by a rounding

    def over(self) -> str | None:
        """None while under the limit; else the one line refusing."""
        if not self.charging:
            return None
        spent = self.spent()
        if spent < self.limit:
            return None
        return (
            f"this server's spending limit is reached: ${spent:.4f} of ${self.limit:.2f} in the last hour; "
            f"try again in {math.ceil(self.wait_s() / 60)} min"
        )

    def view(self) -> dict:
        return {
            "charging": self.charging,
            "spent": self.spent() if self.charging else 0.0,
            "limit": self.limit,
            "window_s": self.window_s,
        }
