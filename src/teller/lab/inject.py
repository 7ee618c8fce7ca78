"""The thread that switches an OS-level fault on and off on the serve clock.

`teller lab run` and `teller lab serve` both use it: it waits for every rank's pid file and for
t0 (rank 0's end of warm-up, `run/t0_ns`), applies the fault to the guilty rank A seconds after
t0 and reverts it at B, or at once when stopped. While a rate limit is on it also samples how
often the limit held packets back (`teller.lab.faults.link_counters`), which no host counter of the
rank shows, for the labels to name the steps it delayed. In-process faults need no thread: the ranks
switch those themselves on the same clock (`teller.lab.faults.inprocess`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from teller.lab.cgroups import RankCgroup
from teller.lab.faults.catalog import LAB_FAULTS, os_fault
from teller.lab.faults.link_counters import COUNTER as LINK_COUNTER
from teller.lab.faults.link_counters import FILE_NAME as LINK_FILE
from teller.lab.faults.link_counters import LinkOverlimits
from teller.lab.faults.os_fault import RankTarget
from teller.lab.netns import LabNetwork
from teller.lab.serve.config import ServeConfig

#: How long to wait for the ranks to load the model and warm up before giving up on the fault.
STARTUP_TIMEOUT_S = 300.0
_POLL_S = 0.02


@dataclass(frozen=True)
class FaultPlan:
    """Which fault, on which rank, how hard, and when (seconds after t0)."""

    fault: str
    rank: int
    intensity: float
    window_s: tuple[float, float]


class FaultInjector:
    """Applies an OS fault to the guilty rank at t0 + A and reverts it at t0 + B (or on stop)."""

    def __init__(
        self,
        plan: FaultPlan,
        config: ServeConfig,
        network: LabNetwork | None,
        groups: list[RankCgroup] | None,
    ) -> None:
        self.plan = plan
        self.config = config
        self.run_dir = Path(config.run_dir)
        self.network = network
        self._groups = groups
        self.error: BaseException | None = None
        self.t0_ns: int | None = None
        self.applied_ns: int | None = None
        self.reverted_ns: int | None = None
        self._stop = threading.Event()
        self._fault = None
        self.link_counters: LinkOverlimits | None = None
        self._thread = threading.Thread(target=self._run, name="fault-injector", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        self._revert()

    def _run(self) -> None:
        try:
            pids = self._wait_for_ranks()
            if pids is None:
                return
            if LAB_FAULTS[self.plan.fault].mechanism != "os":
                return
            target = self._target(pids[self.plan.rank])
            self._fault = os_fault(self.plan.fault, target, self.plan.intensity)
            start_s, end_s = self.plan.window_s
            if self._stop.wait(self._seconds_until(start_s)):
                return
            self._fault.apply()
            self.applied_ns = time.time_ns()
            if LAB_FAULTS[self.plan.fault].shows_in == LINK_COUNTER:
                self.link_counters = LinkOverlimits(target, self.run_dir / LINK_FILE)
                self.link_counters.start()
            self._stop.wait(self._seconds_until(end_s))
            self._revert()
        except BaseException as error:  # reported by the caller after the run
            self.error = error
            self._revert()

    def _wait_for_ranks(self) -> list[int] | None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        pids: list[int | None] = [None] * self.config.tp
        while not self._stop.is_set() and time.monotonic() < deadline:
            for r in range(self.config.tp):
                path = self.run_dir / f"rank{r}.pid"
                if pids[r] is None and path.exists() and path.read_text().strip():
                    pids[r] = int(path.read_text())
            t0_path = self.run_dir / "t0_ns"
            if all(p is not None for p in pids) and t0_path.exists():
                self.t0_ns = int(t0_path.read_text())
                return [int(p) for p in pids]  # type: ignore[arg-type]
            self._stop.wait(_POLL_S)
        return None

    def _target(self, pid: int) -> RankTarget:
        rank = self.plan.rank
        network = self.network
        return RankTarget(
            rank=rank,
            pid=pid,
            core=self.config.cores[rank] if self.config.cores else None,
            cgroup=self._groups[rank] if self._groups is not None else None,
            namespace=network.namespaces[rank] if network else None,
            rank_link=network.rank_links[rank] if network else None,
            host_link=network.host_links[rank] if network else None,
        )

    def _seconds_until(self, serve_s: float) -> float:
        assert self.t0_ns is not None
        return max(0.0, (self.t0_ns + serve_s * 1e9 - time.time_ns()) / 1e9)

    def _revert(self) -> None:
        if self._fault is not None and self.applied_ns is not None and self.reverted_ns is None:
            self.reverted_ns = time.time_ns()
            if self.link_counters is not None:
                self.link_counters.stop()
                if self.link_counters.error is not None and self.error is None:
                    self.error = self.link_counters.error
            self._fault.revert()
