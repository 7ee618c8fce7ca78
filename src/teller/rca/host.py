"""Which host slowdown the counters name: a CPU quota, a co-tenant, memory, or the rank's own work.

A trace alone cannot tell a throttled rank from one sharing its core with another process, a
pause inside the process or page faults (`teller.faults.HOST_SLOWDOWNS`): each stretches the
same operators. The counters `teller collect` samples beside the trace can. The findings of one
fault type on one rank are re-typed together by the counter that rose most over their steps
against the rank's normal steps, when that rise is a real share of those steps (a slow window
has one cause, and it shows unevenly step by step); a type other than a host slowdown is
re-typed only by time the rank was held off a CPU. With no such rise the fault stays as the
method named it. Each step's explanation then states the counter where it rose in that step.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from teller.align.host import HostSteps
from teller.callchain.tree import CallTree
from teller.faults import HOST_SLOWDOWNS
from teller.rca.context import Measured, StepContext

#: The fault each reading names: time the CPU quota throttled the rank or it was stopped (both
#: hold it off a CPU it could use: the straggler), time it waited runnable for a CPU beyond its
#: throttling (another process on its core), time it stalled on memory, major page faults, and
#: its own CPU time (a pause inside the process) when none of the others rose.
CAUSE_OF = {
    "throttled_ns": "straggler",
    "stopped_ns": "straggler",
    "run_delay_ns": "cpu_contention",
    "memory_stall_ns": "memory_pressure",
    "major_faults": "memory_pressure",
    "cpu_ns": "host_stall",
}
#: The readings that count a rank held off a CPU it could have used: a CPU quota's throttling and
#: the time the process was seen stopped. Neither runs in a healthy step, unlike the run delay
#: of a busy host or the rank's own CPU time.
HELD_OFF = ("throttled_ns", "stopped_ns")
#: A rank held off a CPU for this share of its step time beyond its usual has a measured cause
#: in that step: the verdict flags the step where it is also slow (`teller.rca.infer.held_off_cpu`)
#: and names that rank (`teller.rca.diagnose.point_at_held_off_rank`).
HELD_SHARE = 0.1
#: The faults of a slow link, which a host slowdown mimics where collectives run on the host.
LINK_FAULTS = frozenset({"net_delay", "bandwidth_throttle", "net_throttle", "link_contention"})
#: A time reading names the cause when it rose by this share of the rank's step time.
HOST_SHARE = 0.1
#: Major page faults per step beyond the rank's normal steps for memory pressure, where the host
#: has no memory stall counter (cgroup v1).
MAJOR_FAULTS = 50


def readings(c: StepContext) -> dict[str, Measured]:
    """The step's host readings on its rank. A throttled task stays queued, so the scheduler
    counts its throttled time as run delay too: the wait for a CPU is the run delay beyond it."""
    counters = dict(c.host_counters or {})
    delay, throttled = counters.get("run_delay_ns"), counters.get("throttled_ns")
    if delay is not None and throttled is not None:
        counters["run_delay_ns"] = Measured(
            max(delay.observed_ns - throttled.observed_ns, 0.0),
            max(delay.normal_ns - throttled.normal_ns, 0.0),
        )
    return counters


def cause_of(counters: dict[str, Measured], step_ns: float) -> tuple[str, str, Measured] | None:
    """(fault, reading name, reading) the readings name over `step_ns` of the rank's time; a
    caller leaves out the readings that may not name its finding's cause (`retyping_readings`)."""
    if not counters:
        return None
    floor = HOST_SHARE * step_ns
    timed = [
        (name, counters[name])
        for name in ("throttled_ns", "stopped_ns", "run_delay_ns", "memory_stall_ns")
        if name in counters
    ]
    if timed:
        name, reading = max(timed, key=lambda pair: pair[1].excess_ns)
        if reading.excess_ns >= floor:
            return CAUSE_OF[name], name, reading
    faults = counters.get("major_faults")
    if faults is not None and faults.excess_ns >= MAJOR_FAULTS:
        return "memory_pressure", "major_faults", faults
    busy = counters.get("cpu_ns")
    if busy is not None and busy.excess_ns >= floor:
        return "host_stall", "cpu_ns", busy
    return None


def retyping_readings(fault: str | None, host_run_collectives: bool) -> frozenset[str]:
    """The readings that may re-type a finding of `fault`. A host slowdown: every one. A link
    fault where the collectives run on the host (gloo): all but the rank's own CPU time, since a
    throttled rank's transfer threads are throttled with it, so its collectives look slow rather
    than late, while a slow transfer keeps a thread busy too. Any other type: only the time the
    rank was held off a CPU (`HELD_OFF`), which no healthy step has: a rank a quota throttled or
    that was stopped through its slow steps has a measured cause, whatever type a learned head
    made of the steps' shape (an engine-wide type such as scheduler_misconfig included)."""
    if fault in HOST_SLOWDOWNS:
        return frozenset(CAUSE_OF)
    if host_run_collectives and fault in LINK_FAULTS:
        return frozenset(CAUSE_OF) - {"cpu_ns"}
    return frozenset(HELD_OFF)


def pooled_fault(steps: Iterable[StepContext], names: Iterable[str] = CAUSE_OF) -> str | None:
    """The host slowdown the readings `names` of one rank's steps name together, or None."""
    names = frozenset(names)
    summed: dict[str, Measured] = {}
    total_ns = 0.0
    for c in steps:
        total_ns += c.rank_dur_ns
        for name, reading in readings(c).items():
            if name not in names:
                continue
            was = summed.get(name, Measured(0.0, 0.0))
            summed[name] = Measured(
                was.observed_ns + reading.observed_ns, was.normal_ns + reading.normal_ns
            )
    found = cause_of(summed, total_ns)
    return found[0] if found is not None else None


def stated_reading(c: StepContext, fault: str | None) -> tuple[str, Measured] | None:
    """The reading that shows `fault` in this step, where it rose enough to state."""
    if fault not in HOST_SLOWDOWNS or not c.host_counters:
        return None
    found = cause_of({n: m for n, m in readings(c).items() if CAUSE_OF[n] == fault}, c.rank_dur_ns)
    if found is None:
        return None
    return found[1], found[2]


def held_off_by_step(tree: CallTree, host: HostSteps) -> dict[int, dict[int, float]]:
    """Step iteration → rank → the share of the rank's step time that the counters show it held
    off a CPU beyond what that rank usually is (its median over its steps, so a rank throttled
    in every step counts only what a step adds); only the ranks with counters."""
    steps = tree.steps
    held = np.zeros(len(steps))
    known = np.zeros(len(steps), dtype=bool)
    for name in HELD_OFF:
        values = host.added.get(name)
        if values is None:
            continue
        known |= ~np.isnan(values)
        held += np.nan_to_num(values)
    share = np.where(known, held / np.maximum(steps.dur_ns, 1), 0.0)
    for rank in np.unique(steps.rank[known]):
        rows = np.flatnonzero((steps.rank == rank) & known)
        share[rows] = share[rows] - np.median(share[rows])
    rows = np.flatnonzero(known)
    out: dict[int, dict[int, float]] = {}
    for rank, iteration, value in zip(
        steps.rank[rows].tolist(), steps.index[rows].tolist(), share[rows].tolist(), strict=True
    ):
        out.setdefault(iteration, {})[rank] = value
    return out


def held_off_share(tree: CallTree, host: HostSteps) -> dict[int, float]:
    """Per step iteration, the largest share of a rank's step time that the counters show it held
    off a CPU beyond that rank's usual (`held_off_by_step`). The verdict's floor reads it
    (`teller.rca.infer.held_off_cpu`): a slow step whose rank was held off a CPU for a real share
    of it has a measured cause, whatever a learned score makes of its shape."""
    return {
        iteration: max(0.0, *ranks.values())
        for iteration, ranks in held_off_by_step(tree, host).items()
    }
