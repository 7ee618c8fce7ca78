"""host_stall: forced garbage-collection storms in one rank's process.

A daemon thread in the rank calls `gc.collect()` back to back while the window is open. A full
collection walks every tracked Python object holding the GIL, so the rank's main thread stalls
between operators exactly as it does in a service whose allocation pattern triggers GC storms.
`intensity` is the share of wall time the thread spends collecting (it sleeps the rest).

A full collection of the lab's worker takes several decode steps' time, and the thread then
sleeps as long again or longer, so many window steps fall in its sleep and run untouched. The storm therefore records when each
collection ran, and the lab labels the window steps a collection overlapped (`teller.lab.acted`),
as it does the steps a quota throttled. The record is one JSON line per collection,
`{"start_ns": ..., "end_ns": ...}` (wall clock), in the case's `ground_truth/`, which no analysis
reads.
"""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from teller.atomic import write_text_atomic

#: Keep the storm thread responsive to the window's end.
_POLL_S = 0.01
#: The counter's name, as `FaultKind.shows_in` names it: wall time spent collecting, cumulative.
COUNTER = "gc_collect_ns"


def collections_file(truth_dir: Path, rank: int) -> Path:
    """Where the storm on `rank` records its collections, under the case's `ground_truth/`."""
    return truth_dir / f"gc_collections_rank{rank}.jsonl"


class GcStorm:
    def __init__(self, active: Callable[[], bool], intensity: float) -> None:
        self._active = active
        self._intensity = min(max(intensity, 0.05), 1.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gc-storm", daemon=True)
        #: (start_ns, end_ns) of every collection the storm ran, wall clock
        self.collections: list[tuple[int, int]] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def write(self, path: Path) -> Path:
        """Record the collections (after `stop`); an empty file where none ran."""
        lines = "".join(
            json.dumps({"start_ns": start, "end_ns": end}) + "\n" for start, end in self.collections
        )
        return write_text_atomic(path, lines)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._active():
                self._stop.wait(_POLL_S)
                continue
            began_ns = time.time_ns()
            began = time.perf_counter()
            gc.collect()
            spent_s = time.perf_counter() - began
            self.collections.append((began_ns, time.time_ns()))
            self._stop.wait(spent_s * (1.0 / self._intensity - 1.0))


def read_collections(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The recorded collections as a cumulative counter of time spent collecting: samples at
    each collection's start and end (int64 wall ns, float64 ns), so that reading it between
    samples linearly is exact. None where the file is missing or unreadable."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        bounds = np.asarray([(row["start_ns"], row["end_ns"]) for row in rows], dtype=np.int64)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    bounds = bounds.reshape(-1, 2)
    bounds = bounds[np.argsort(bounds[:, 0], kind="stable")]
    spent = np.maximum(bounds[:, 1] - bounds[:, 0], 0).astype(np.float64)
    before = np.concatenate([[0.0], np.cumsum(spent)[:-1]])
    t_ns = bounds.reshape(-1)
    values = np.column_stack([before, before + spent]).reshape(-1)
    return t_ns, values
