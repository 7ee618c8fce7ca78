"""cpu_contention: busy processes pinned to the guilty rank's core.

The scheduler shares the core between the rank and the hogs, so the rank's operators stretch (its
own compute time rises) and its peers wait for it at the next all-reduce. Ranks are pinned to
cores first (`ServeConfig.cores`), so the hogs hit exactly one rank (plus any rank sharing its
core when there are more ranks than cores). The hogs run at the rank's own priority. Number of hogs = max(1, round(4 * intensity)).
"""

from __future__ import annotations

import subprocess
import sys

from teller.errors import TellerError
from teller.lab.faults.os_fault import RankTarget

_BUSY_LOOP = "while True:\n    pass\n"


class CpuContention:
    def __init__(self, target: RankTarget, intensity: float) -> None:
        if target.core is None:
            raise TellerError("cpu_contention needs ranks pinned to cores")
        self.core = target.core
        self.nice = target.nice
        self.hogs = max(1, round(4 * intensity))
        self.processes: list[subprocess.Popen] = []

    @property
    def _pinned(self) -> list[str]:
        return ["nice", "-n", str(self.nice), "taskset", "-c", str(self.core)]

    def apply(self) -> None:
        for _ in range(self.hogs):
            self.processes.append(
                subprocess.Popen(
                    [*self._pinned, sys.executable, "-S", "-c", _BUSY_LOOP],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def revert(self) -> None:
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait()
        self.processes.clear()
