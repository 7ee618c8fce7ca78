"""cpu_contention: busy processes pinned to the guilty rank's core, in the rank's own cgroup.

The scheduler shares the core between the rank and the hogs, so the rank's operators stretch (its
own compute time rises) and its peers wait for it at the next all-reduce. Ranks are pinned to
cores first (`ServeConfig.cores`), so the hogs hit exactly one rank (plus any rank sharing its
core when there are more ranks than cores). As root the hogs join the rank's cpu cgroup, so they
compete with it inside its group (as co-located processes in one container do) rather than as one
unrelated session the kernel's autogroup scheduling would weigh as a single task. Number of hogs = max(1, round(4 * intensity)).
"""

from __future__ import annotations

import os
import subprocess
import sys

from teller.errors import TellerError
from teller.lab.faults.os_fault import RankTarget

#: A hog dies with the run that started it (PR_SET_PDEATHSIG), even when the run is SIGKILLed;
#: if the run is already gone by the time the setting is made, the hog exits at once.
_BUSY_LOOP = """\
import ctypes, os, sys
ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    os._exit(0)
while True:
    pass
"""


class CpuContention:
    def __init__(self, target: RankTarget, intensity: float) -> None:
        if target.core is None:
            raise TellerError("cpu_contention needs ranks pinned to cores")
        self.core = target.core
        self.join_files = target.cgroup.procs_files() if target.cgroup is not None else []
        self.hogs = max(1, round(4 * intensity))
        self.processes: list[subprocess.Popen] = []

    @property
    def _pinned(self) -> list[str]:
        joins = "".join(f'echo $$ > "{procs}"; ' for procs in self.join_files)
        return ["sh", "-c", joins + 'exec "$@"', "sh", "taskset", "-c", str(self.core)]

    def apply(self) -> None:
        for _ in range(self.hogs):
            self.processes.append(
                subprocess.Popen(
                    [*self._pinned, sys.executable, "-S", "-c", _BUSY_LOOP, str(os.getpid())],
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
