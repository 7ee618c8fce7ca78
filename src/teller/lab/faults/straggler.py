"""straggler: the guilty rank throttled by a cgroup CPU quota (v2 cpu.max, v1 cfs_quota_us).

The rank may use only (1 - intensity) of one CPU per 100 ms period (at least 5 %), so it reaches
every collective late: its peers' all-reduce time inflates while its own stays short. Without
cgroups the rank is stopped and continued (SIGSTOP/SIGCONT) on the same duty cycle instead.
"""

from __future__ import annotations

import os
import signal
import threading

from teller.lab.faults.os_fault import RankTarget

MIN_CPU_SHARE = 0.05
DUTY_PERIOD_S = 0.1


class Straggler:
    def __init__(self, target: RankTarget, intensity: float) -> None:
        self.target = target
        self.share = max(MIN_CPU_SHARE, 1.0 - intensity)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def apply(self) -> None:
        if self.target.cgroup is not None:
            self.target.cgroup.set_cpu_share(self.share)
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._duty_cycle, daemon=True)
        self._thread.start()

    def revert(self) -> None:
        if self.target.cgroup is not None:
            self.target.cgroup.set_cpu_share(1.0)
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._signal(signal.SIGCONT)

    def _duty_cycle(self) -> None:
        while not self._stop.is_set():
            self._signal(signal.SIGSTOP)
            self._stop.wait(DUTY_PERIOD_S * (1.0 - self.share))
            self._signal(signal.SIGCONT)
            self._stop.wait(DUTY_PERIOD_S * self.share)

    def _signal(self, number: int) -> None:
        try:
            os.kill(self.target.pid, number)
        except ProcessLookupError:
            self._stop.set()
