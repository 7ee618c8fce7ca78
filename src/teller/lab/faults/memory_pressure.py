"""memory_pressure: the guilty rank's cgroup memory limited to just above its anonymous memory.

The limit leaves the rank's heap alone (no OOM kill) but only (1 - intensity) of its page cache and
mapped files (torch's and the model code's shared libraries), so the kernel reclaims them and the
rank faults them back in while it runs: page-fault and reclaim time lands inside its host ops. On
cgroup v2 this is `memory.high` (throttling); on v1 the hard `memory.limit_in_bytes`.
"""

from __future__ import annotations

from teller.errors import TellerError
from teller.lab.faults.os_fault import RankTarget

#: Headroom above the anonymous memory measured when the window opens, for the heap's growth.
HEADROOM_BYTES = 24 << 20


class MemoryPressure:
    def __init__(self, target: RankTarget, intensity: float) -> None:
        if target.cgroup is None:
            raise TellerError("memory_pressure needs a per-rank cgroup (root)")
        self.cgroup = target.cgroup
        self.intensity = min(max(intensity, 0.0), 1.0)
        self.limit_bytes: int | None = None

    def apply(self) -> None:
        stat = self.cgroup.memory_stat()
        anon = stat.get("anon", stat.get("rss", 0))
        files = stat.get("file", stat.get("cache", 0))
        self.limit_bytes = anon + HEADROOM_BYTES + int((1.0 - self.intensity) * files)
        self.cgroup.set_memory_limit(self.limit_bytes)

    def revert(self) -> None:
        self.cgroup.set_memory_limit(None)
