"""Which of a fault's window steps the fault visibly changed: each replayed without it.

A fault that acts on time (slower kernels, a busier host, a slower link, a late arrival) can add
almost nothing to a step. A throttled network link between pipeline stages carries a decode step's
activations, a few kB, in microseconds, beside a step of milliseconds: on the held-out shapes of
sim-shapes-v2, replaying such cases without the fault showed window steps lengthened by 0.0–2.5%
and their send/receive kernels by about 2 µs, several by exactly nothing. Such a step looks like
its neighbours in every number a trace holds, so labelling it anomalous asks every method to find
what is not there, and teaches a model trained on it to flag noise.

So, for these faults, each window step is also run on a copy of the replica's model whose fault has
intensity zero: every random draw is the same (the fault models draw alike at any intensity), so
the differences are the fault's alone. The fault's added time is the larger of what it added to
the step's end and what it added to one rank's GPU time (kernels, copies: a slower kernel the GPU
absorbed in host slack still shows in its own duration, which teller's operator comparisons read).
The step is labelled only where that reaches `VISIBLE_SHARE` of the fault-free step and at least
`VISIBLE_FLOOR_NS`. Faults that change what runs rather than how long it takes (a swapped kernel,
a capped scheduler, a hang, KV preemption) keep their own rules in `run.py`.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from teller.lab.sim.engine import StepPlan
from teller.lab.sim.faults import FaultModel
from teller.lab.sim.replica import ReplicaModel

#: Faults whose only effect is time, and whose intensity zero is exactly no fault.
TIMED_FAULTS = frozenset(
    {
        "gpu_throttle",
        "gpu_contention",
        "host_cpu_contention",
        "net_delay",
        "bandwidth_throttle",
        "straggler",
        "link_contention",
    }
)
#: The fault's added time must reach this share of the fault-free step's duration...
VISIBLE_SHARE = 0.01
#: ...and this much: a few microseconds more on a kernel is what kernels vary by between steps.
VISIBLE_FLOOR_NS = 20_000


@dataclass(frozen=True)
class FaultFreeStep:
    """One step as it would have run without the fault, beside the model's state before it."""

    start_ns: int
    end_ns: int
    #: each rank's GPU time in the replayed step
    gpu_ns: dict[int, int]
    #: each rank's GPU time so far, before the step ran with the fault
    gpu_before_ns: dict[int, int]

    @classmethod
    def replay(cls, model: ReplicaModel, plan: StepPlan) -> FaultFreeStep:
        """The step of `plan` on a copy of `model` with the fault's intensity at zero, taken
        before the step runs (the model itself is left as it was)."""
        faults = model.faults
        quiet = FaultModel(
            dataclasses.replace(faults.spec, intensity=0.0), faults.gpus_per_node, faults.tp
        )
        shared = {
            id(faults): quiet,
            id(model.template): model.template,
            id(model.cal): model.cal,
            id(model.topology): model.topology,
        }
        for state in model.ranks.values():
            shared[id(state.encoder)] = state.encoder  # encoders hold no state of their own
        before = {rank: state.gpu_busy_ns for rank, state in model.ranks.items()}
        copy_ = copy.deepcopy(model, shared)
        end, _ = copy_.run_step(copy.deepcopy(plan))
        gpu = {rank: state.gpu_busy_ns - before[rank] for rank, state in copy_.ranks.items()}
        return cls(plan.start_ns, end, gpu, before)

    def added_ns(self, model: ReplicaModel, end_ns: int) -> int:
        """What the fault added: to the step's end, or to one rank's GPU time, whichever is more;
        `model` after it ran the step with the fault, which ended at `end_ns`."""
        gpu = max(
            state.gpu_busy_ns - self.gpu_before_ns[rank] - self.gpu_ns[rank]
            for rank, state in model.ranks.items()
        )
        return max(end_ns - self.end_ns, gpu)

    def visible(self, model: ReplicaModel, end_ns: int) -> bool:
        """Whether the fault's added time reaches `VISIBLE_SHARE` and `VISIBLE_FLOOR_NS`."""
        fault_free = max(self.end_ns - self.start_ns, 1)
        bar = max(VISIBLE_SHARE * fault_free, VISIBLE_FLOOR_NS)
        return self.added_ns(model, end_ns) >= bar
