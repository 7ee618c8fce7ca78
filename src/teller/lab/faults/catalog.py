"""The real lab's faults: how each is made, whether it needs root, and what its label says.

`guilty_operator` is the call-chain node (as teller's Kineto reader names it) whose time the fault
inflates on the guilty rank, chosen from recorded cases (see tests/lab): memory_pressure slows the
tensor-parallel matmuls (`aten::mm`: the weight pages are faulted back in there); cpu_contention and
straggler take the rank's CPU, and the stall lands on whichever operator runs when it is taken,
likeliest `aten::mm` (most of a step's compute) but often another, so scoring asks for their rank,
not this operator (`teller.labels.scored_operator`); net_throttle slows the transfer inside the
gloo all-reduce (`gloo:all_reduce`); slow_operator's math-fallback attention keeps the node
`aten::scaled_dot_product_attention` and makes it slower. host_stall and scheduler_misconfig slow
no operator (gaps between ops; smaller batches) and workload_shift is the negative control, so
they name none.
"""

from __future__ import annotations

from dataclasses import dataclass

from teller.lab.faults.cpu_contention import CpuContention
from teller.lab.faults.host_stall import COUNTER as GC_COUNTER
from teller.lab.faults.link_counters import COUNTER as LINK_COUNTER
from teller.lab.faults.memory_pressure import MemoryPressure
from teller.lab.faults.net_throttle import NetThrottle, rate_mbit
from teller.lab.faults.straggler import Straggler


@dataclass(frozen=True)
class FaultKind:
    name: str
    mechanism: str  # "os" (applied from outside), "process" (in the rank), "workload", "none"
    needs_root: bool
    guilty_operator: str | None
    explanation: str  # a format string over rank, intensity and the fault's parameters
    #: The counter that rises on the guilty rank while the fault acts: a host counter
    #: (`teller.ingest.host.COUNTERS`), the rate limit's `link_overlimits`
    #: (`teller.lab.faults.link_counters`), or the GC storm's time collecting
    #: (`teller.lab.faults.host_stall`). A recording in which it does not rise inside the
    #: window is refused (`teller.lab.run`), since its labels would name a fault that never acted.
    shows_in: str | None = None
    #: Whether that counter stays flat on a healthy rank, so that the labels can name the window
    #: steps in which it rose (`teller.lab.acted`). Not so for run delay: on a machine with fewer
    #: cores than ranks every rank waits for a CPU in every step.
    marks_steps: bool = False


LAB_FAULTS: dict[str, FaultKind] = {
    kind.name: kind
    for kind in (
        FaultKind("none", "none", False, None, "No fault was injected; the service ran normally."),
        FaultKind(
            "cpu_contention",
            "os",
            False,
            "aten::mm",
            "Busy processes pinned to rank {rank}'s core took CPU time from it, so its matmuls "
            "stretched and the other ranks waited for it at the all-reduces.",
            shows_in="run_delay_ns",
        ),
        FaultKind(
            "straggler",
            "os",
            False,
            "aten::mm",
            "Rank {rank} was throttled to {cpu_percent:.0f}% of a CPU, so it reached every "
            "all-reduce late and its peers' all-reduce time was inflated while its own was short.",
            shows_in="throttled_ns",
            marks_steps=True,
        ),
        FaultKind(
            "net_throttle",
            "os",
            True,
            "gloo:all_reduce",
            "Rank {rank}'s network link was rate-limited to {rate_mbit:.0f} Mbit/s, so all-reduce "
            "transfer time rose with message size, most on prefill steps.",
            shows_in=LINK_COUNTER,
            marks_steps=True,
        ),
        FaultKind(
            "slow_operator",
            "process",
            False,
            "aten::scaled_dot_product_attention",
            "Rank {rank} ran with the flash attention kernel disabled, so its "
            "scaled_dot_product_attention fell back to the math implementation and took longer "
            "while its peers waited at the o_proj all-reduce.",
        ),
        FaultKind(
            "scheduler_misconfig",
            "process",
            False,
            None,
            "The engine ran with a tiny max batch size and token budget, so requests queued, "
            "batches shrank and time to first token rose although no operator slowed down.",
        ),
        FaultKind(
            "host_stall",
            "process",
            False,
            None,
            "Forced garbage-collection storms on rank {rank} held the Python interpreter, leaving "
            "gaps between its operators and making its peers wait at the all-reduces.",
            shows_in=GC_COUNTER,
            marks_steps=True,
        ),
        FaultKind(
            "memory_pressure",
            "os",
            True,
            "aten::mm",
            "Rank {rank}'s memory was capped just above its heap, so the kernel reclaimed its "
            "mapped files and page faults slowed its host operators.",
            shows_in="major_faults",
            marks_steps=True,
        ),
        FaultKind(
            "workload_shift",
            "workload",
            False,
            None,
            "A burst of long prompts arrived; prefill steps grew with their token counts while "
            "per-token time stayed normal, which is load, not a fault.",
        ),
    )
}


def os_fault(name: str, target, intensity: float):
    """The apply/revert object of an OS-level fault on one rank."""
    makers = {
        "cpu_contention": CpuContention,
        "straggler": Straggler,
        "net_throttle": NetThrottle,
        "memory_pressure": MemoryPressure,
    }
    return makers[name](target, intensity)


def explanation(name: str, rank: int, intensity: float) -> str:
    return LAB_FAULTS[name].explanation.format(
        rank=rank,
        intensity=intensity,
        cpu_percent=100 * max(0.05, 1.0 - intensity),
        rate_mbit=rate_mbit(intensity),
    )
