"""How long each objective has been held or broken: what an alert rule's `for:` is judged on.

A capture needs the objective broken for `--for` seconds in a row, and a reference capture needs
every objective held as long: a burst of load that passes in a few seconds neither triggers an
incident nor passes for the service's normal.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from teller.watch.slo import Check


class StateDurations:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._since: dict[str, tuple[str, float]] = {}

    def update(self, checks: list[Check]) -> list[Check]:
        """Record this poll's states; the checks whose state changed."""
        now, changed = self.clock(), []
        for check in checks:
            previous = self._since.get(check.objective.text)
            if previous is None or previous[0] != check.state:
                self._since[check.objective.text] = (check.state, now)
                changed.append(check)
        return changed

    def lasted_s(self, check: Check) -> float:
        """Seconds the check's objective has been in the check's state (0 if it just changed)."""
        state, since = self._since.get(check.objective.text, (check.state, self.clock()))
        return self.clock() - since if state == check.state else 0.0
