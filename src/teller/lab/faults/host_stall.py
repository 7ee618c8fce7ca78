"""host_stall: forced garbage-collection storms in one rank's process.

A daemon thread in the rank calls `gc.collect()` back to back while the window is open. A full
collection walks every tracked Python object holding the GIL, so the rank's main thread stalls
between operators exactly as it does in a service whose allocation pattern triggers GC storms.
`intensity` is the share of wall time the thread spends collecting (it sleeps the rest).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

#: Keep the storm thread responsive to the window's end.
_POLL_S = 0.01


class GcStorm:
    def __init__(self, active: Callable[[], bool], intensity: float) -> None:
        self._active = active
        self._intensity = min(max(intensity, 0.05), 1.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gc-storm", daemon=True)
        self.collections = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._active():
                self._stop.wait(_POLL_S)
                continue
            began = time.perf_counter()
            gc.collect()
            self.collections += 1
            spent_s = time.perf_counter() - began
            self._stop.wait(spent_s * (1.0 / self._intensity - 1.0))
