"""Which host slowdown the counters name: a CPU quota, a co-tenant, memory, or the rank's own work.

A trace alone cannot tell a throttled rank from one sharing its core with another process, a
pause inside the process or page faults (`teller.faults.HOST_SLOWDOWNS`): each stretches the
same operators. The counters `teller collect` samples beside the trace can. A finding whose
fault is one of these is re-typed by the counter that rose most over the step against the
rank's normal steps, when that rise is a real share of the step; with no such rise the fault
stays as the method named it.
"""

from __future__ import annotations

from teller.faults import HOST_SLOWDOWNS
from teller.rca.context import Measured, StepContext

#: Time-based measures and the fault each names: time the CPU quota throttled the rank or it
#: was stopped (both hold it off a CPU it could use: the straggler), time it waited runnable for
#: a CPU (another process on its core), time it stalled on memory.
TIME_CAUSES = {
    "throttled_ns": "straggler",
    "stopped_ns": "straggler",
    "run_delay_ns": "cpu_contention",
    "memory_stall_ns": "memory_pressure",
}
#: A measure names the cause when it rose by this share of the rank's step.
HOST_SHARE = 0.1
#: Major page faults more than the rank's normal steps take, for memory pressure where the host
#: has no memory stall counter (cgroup v1).
MAJOR_FAULTS = 50


def host_cause(c: StepContext) -> tuple[str, str, Measured] | None:
    """(fault, measure, its reading) the counters name for the step's rank, or None."""
    counters = c.host_counters
    if not counters:
        return None
    floor = HOST_SHARE * c.rank_dur_ns
    held = [n for n in ("throttled_ns", "stopped_ns") if n in counters]
    timed = [(n, counters[n]) for n in ("run_delay_ns", "memory_stall_ns") if n in counters]
    if held:  # a quota and a stop both hold the rank off a CPU: one cause, named by the larger
        larger = max(held, key=lambda n: counters[n].excess_ns)
        timed.append((larger, _summed(counters, tuple(held))))
    if timed:
        name, reading = max(timed, key=lambda pair: pair[1].excess_ns)
        if reading.excess_ns >= floor:
            return TIME_CAUSES[name], name, reading
    faults = counters.get("major_faults")
    if faults is not None and faults.excess_ns >= MAJOR_FAULTS:
        return "memory_pressure", "major_faults", faults
    busy = counters.get("cpu_ns")
    if busy is not None and busy.excess_ns >= floor:
        return "host_stall", "cpu_ns", busy
    return None


def refined_fault(c: StepContext, fault: str | None) -> str | None:
    """The fault a host slowdown's counters name in place of `fault`; others unchanged."""
    if fault not in HOST_SLOWDOWNS:
        return fault
    found = host_cause(c)
    return found[0] if found is not None else fault


def _summed(counters: dict[str, Measured], names: tuple[str, ...]) -> Measured:
    present = [counters[n] for n in names]
    return Measured(sum(m.observed_ns for m in present), sum(m.normal_ns for m in present))
