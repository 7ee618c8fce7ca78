"""At most one capture per interval: a capture costs the engine some speed while it runs.

The budget is spent when a capture starts, whether or not it succeeds, so an engine that keeps
failing mid-capture is not asked again and again.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class CaptureBudget:
    def __init__(self, min_interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.last_s: float | None = None

    def allows(self) -> bool:
        return self.last_s is None or self.clock() - self.last_s >= self.min_interval_s

    def seconds_left(self) -> float:
        if self.last_s is None:
            return 0.0
        return max(0.0, self.min_interval_s - (self.clock() - self.last_s))

    def spend(self) -> None:
        self.last_s = self.clock()
