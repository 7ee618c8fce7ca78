"""The fault vocabulary: every fault type teller knows, with the view it shows in.

The lab, the simulator, the root-cause model and the scoreboard all speak it: a model's fault head
has one output per name here, and a labelled case names one of them (DESIGN.md §4).
"""

from __future__ import annotations

from collections.abc import Iterable

#: Fault name → view: "V" (one rank's own stack), "H" (across ranks), "-" (no fault / control).
FAULTS: dict[str, str] = {
    # no fault and the negative control
    "none": "-",
    "workload_shift": "-",
    # real lab (DESIGN.md §4)
    "cpu_contention": "V",
    "straggler": "H",
    "net_throttle": "H",
    "slow_operator": "V",
    "scheduler_misconfig": "V",
    "host_stall": "V",
    "memory_pressure": "V",
    # simulator-only (GPU-cluster faults)
    "gpu_throttle": "V",
    "gpu_contention": "V",
    "kv_pressure": "V",
    "host_cpu_contention": "V",
    "net_delay": "H",
    "bandwidth_throttle": "H",
    "link_contention": "H",
    "kernel_regression": "V",
    "collective_hang": "H",
}


#: The names that are not faults: no fault, and the negative control (a burst of long prompts
#: that slows steps without anything being wrong). A method must not flag them.
FAULT_FREE = ("none", "workload_shift")


#: Faults that act on the whole engine (its batches, its load), where no rank or operator is to
#: blame: a finding of one names neither as its suspect.
ENGINE_WIDE_FAULTS = frozenset({*FAULT_FREE, "scheduler_misconfig"})


def engine_wide(fault_types: Iterable[str]) -> bool:
    """Whether every one of `fault_types` (at least one) acts on the whole engine."""
    kinds = set(fault_types)
    return bool(kinds) and kinds <= ENGINE_WIDE_FAULTS


#: Faults that slow one rank's host work and nothing else a trace records: a CPU quota (the
#: straggler), a co-tenant, a pause, page faults. Without host metrics in the trace they look
#: alike, and every explanation that states one of them says so.
HOST_SLOWDOWNS = frozenset({"straggler", "cpu_contention", "host_stall", "memory_pressure"})


def view_of(fault: str) -> str:
    """ "H" for faults seen across ranks, "V" for those in one rank's stack (the default for a
    name teller does not know, such as a verdict without a fault type)."""
    return "H" if FAULTS.get(fault) == "H" else "V"
