"""Hand `/start_profile` and `/stop_profile` from the HTTP thread to the engine loop, and back.

The engine loop alone publishes plans, so a request waits here until the loop takes it and puts
the toggle on the next plan every rank runs (or, with no work, on a plan that is only a toggle).
A stop answers once every rank's trace of the capture is on disk, as vLLM answers once its
workers' profilers have exported: whoever asked can read the files as soon as the answer comes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from teller.lab.serve.profiler import trace_name

#: How long a request may wait for the engine loop to take it.
TAKE_TIMEOUT_S = 30.0
#: How long a stop may wait for every rank's export (a throttled rank exports slowly).
EXPORT_TIMEOUT_S = 300.0
_POLL_S = 0.05


class ControlError(Exception):
    """A profiler request refused: the HTTP status to answer with, and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ProfileRequest:
    action: str  # "start" or "stop"
    capture_id: str
    taken: threading.Event = field(default_factory=threading.Event)


class ProfileControl:
    """The profiler state the endpoints see; the engine loop calls `take` and `applied`."""

    def __init__(self, profile_dir: str | Path, tp: int) -> None:
        self.profile_dir = Path(profile_dir)
        self.tp = tp
        self.profiling = False
        self.capture_id = ""
        self._pending: ProfileRequest | None = None
        self._lock = threading.Lock()

    # -- the HTTP thread -------------------------------------------------------------------------
    def request(self, action: str) -> list[Path]:
        """Start or stop a capture and wait until it is done; the traces a stop wrote."""
        with self._lock:
            if self._pending is not None:
                raise ControlError(409, f"a {self._pending.action} request is still in progress")
            if action == "start" and self.profiling:
                raise ControlError(409, f"already profiling (capture {self.capture_id})")
            if action == "stop" and not self.profiling:
                raise ControlError(409, "not profiling: call /start_profile first")
            capture_id = str(time.time_ns() // 1_000_000) if action == "start" else self.capture_id
            request = ProfileRequest(action, capture_id)
            self._pending = request
        if not request.taken.wait(TAKE_TIMEOUT_S):
            with self._lock:
                if self._pending is request:
                    self._pending = None
            raise ControlError(
                503, f"the engine loop did not take the request in {TAKE_TIMEOUT_S} s"
            )
        return self._wait_for_traces(capture_id) if action == "stop" else []

    def _wait_for_traces(self, capture_id: str) -> list[Path]:
        paths = [self.profile_dir / trace_name(rank, capture_id) for rank in range(self.tp)]
        deadline = time.monotonic() + EXPORT_TIMEOUT_S
        while not all(p.exists() for p in paths):
            if time.monotonic() > deadline:
                missing = ", ".join(p.name for p in paths if not p.exists())
                raise ControlError(503, f"ranks did not export in {EXPORT_TIMEOUT_S} s: {missing}")
            time.sleep(_POLL_S)
        return paths

    # -- the engine loop -------------------------------------------------------------------------
    def take(self) -> ProfileRequest | None:
        with self._lock:
            return self._pending

    def applied(self, request: ProfileRequest) -> None:
        """Rank 0 has toggled its profiler for `request` (the plan carrying it is published)."""
        with self._lock:
            self.profiling = request.action == "start"
            self.capture_id = request.capture_id
            self._pending = None
        request.taken.set()
