"""memory_pressure: the guilty rank's cgroup memory held just above its anonymous memory.

Every rank's weights are file-mapped (`teller.lab.serve.model.map_weights_from_disk`), as
mmap-loaded checkpoints are. The limit leaves the rank's heap its current size but keeps
`EVICTED_AT_FULL` x intensity of its file pages out, so the kernel evicts weight pages and the
rank faults them back in from disk inside its matmuls: page-fault time lands in `aten::mm`. A
thread re-tightens the limit as the heap grows (the profiler's buffers grow all run), which is
what cgroup v2's `memory.high` does by itself; on v2 that file is used, on v1 the hard
`memory.limit_in_bytes` with the group's OOM killer off, so a burst over the limit stalls the
rank instead of killing it.

No fixed headroom is added above the heap: a shard's weights are a few MiB to tens of MiB (less the
more ranks share the model), and any fixed room as large as the file pages leaves the limit above
what the rank uses, so the fault does nothing. Heap growth between two re-tightenings evicts more
weight pages for that moment, which is memory pressure too.
"""

from __future__ import annotations

import errno
import threading

from teller.errors import TellerError
from teller.lab.faults.os_fault import RankTarget

#: The share of the rank's weight pages kept out at intensity 1. A pass over the weights faults
#: back in what was evicted, each fault a disk read, so a few percent already stretch a step
#: several times over.
EVICTED_AT_FULL = 0.1
RETIGHTEN_S = 0.1
_BACKOFF_TRIES = 6


class MemoryPressure:
    def __init__(self, target: RankTarget, intensity: float) -> None:
        if target.cgroup is None:
            raise TellerError("memory_pressure needs a per-rank cgroup (root)")
        self.cgroup = target.cgroup
        self.intensity = min(max(intensity, 0.0), 1.0)
        self.file_allowance_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def apply(self) -> None:
        stat = self.cgroup.memory_stat()
        files = stat.get("file", stat.get("cache", 0))
        self.file_allowance_bytes = int((1.0 - EVICTED_AT_FULL * self.intensity) * files)
        self.cgroup.set_oom_kill(False)  # a burst over the limit waits for the next re-tightening
        self._tighten()
        self._stop.clear()
        self._thread = threading.Thread(target=self._keep_tight, daemon=True)
        self._thread.start()

    def revert(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.cgroup.set_memory_limit(None)
        self.cgroup.set_oom_kill(True)

    def _tighten(self) -> None:
        """Move the limit towards heap + headroom + allowance; v1 refuses (EBUSY) a limit it
        cannot reclaim down to at once, so back off halfway towards current usage and retry
        on the next tick."""
        stat = self.cgroup.memory_stat()
        anon = stat.get("anon", stat.get("rss", 0))
        target = anon + self.file_allowance_bytes
        usage = self.cgroup.memory_usage_bytes()
        for _ in range(_BACKOFF_TRIES):
            try:
                self.cgroup.set_memory_limit(target)
                return
            except OSError as error:
                if error.errno != errno.EBUSY:
                    raise
                target = (target + usage) // 2

    def _keep_tight(self) -> None:
        while not self._stop.wait(RETIGHTEN_S):
            self._tighten()
