"""Fault injection for the simulator: what each fault changes, and the labels it produces.

Every fault acts only inside its window of step ordinals [start, end) and only where it says (one
rank, one node's link, one rank pair). Intensity is the one knob; its meaning per fault is below.
The guilty operator is the call-chain node name teller's reader gives the node where the fault
shows, chosen per fault:

| fault               | view | effect (intensity x)                                 | guilty operator           |
|---------------------|------|------------------------------------------------------|---------------------------|
| gpu_throttle        | V    | every kernel on the rank runs (1 + x)× longer        | the dominant GEMM kernel  |
| gpu_contention      | V    | kernels on the rank run 1 + x·U(0, 2)× longer        | the dominant GEMM kernel  |
|                     |      | (a foreign process's kernels share the SMs)          |                           |
| kv_pressure         | V    | KV cache shrinks to 1/(1 + 4x): preemptions, re-     | the model module          |
|                     |      | computed prefills, preemption warnings in the log   |                           |
| host_cpu_contention | V    | the rank's host work runs (1 + x)× longer: launch    | cudaLaunchKernel          |
|                     |      | gaps, GPU idle bubbles                               |                           |
| net_delay           | H    | the guilty rank's node adds x·50 µs to every message | the NCCL kernel           |
|                     |      | that crosses its network link                        |                           |
| bandwidth_throttle  | H    | that node's network bandwidth drops to 1/(1 + x)     | the NCCL kernel           |
| straggler           | H    | the rank reaches every collective x·500 µs late      | the NCCL all-reduce kernel|
| link_contention     | H    | the link between the rank and its ring neighbour     | the NCCL all-reduce kernel|
|                     |      | gives 1/(1 + x) of its bandwidth                     |                           |
| kernel_regression   | V    | kernel_swap: one operator's GEMM kernel becomes the  | the new kernel's name     |
|                     |      | calibrated fallback GEMM, (1 + x)× slower; the rank's|                           |
|                     |      | worker prints vLLM's JIT warning naming it where it  |                           |
|                     |      | first launches it;                                   |                           |
|                     |      | graph_fallback: decode on the rank loses its CUDA    | cudaLaunchKernel          |
|                     |      | graphs and launches every kernel eagerly (no new     |                           |
|                     |      | kernel, so no JIT warning)                           |                           |
| scheduler_misconfig | V    | token budget and batch size shrink by 1/(1 + 3x);    | none (a config, no op)    |
|                     |      | labelled: only the window's steps whose limits held  |                           |
|                     |      | work back (StepPlan.held_back)                       |                           |
| collective_hang     | H    | at the window's first step the rank never reaches    | the NCCL all-reduce kernel|
|                     |      | its next all-reduce; peers time out (watchdog log)   |                           |
| workload_shift      | -    | prompts arriving in the window are (1 + 4x)× longer  | none (not a fault)        |

A window step is labelled anomalous only where the fault showed in it: a timed fault (the rows
from gpu_throttle to link_contention, less kv_pressure) where replaying the step without it shows
the fault added a visible amount of time (`visible.py`); kernel_regression and
scheduler_misconfig as their rows say; kv_pressure, collective_hang every window step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from teller.faults import FAULTS

SIM_FAULTS: tuple[str, ...] = (
    "none",
    "gpu_throttle",
    "gpu_contention",
    "kv_pressure",
    "host_cpu_contention",
    "net_delay",
    "bandwidth_throttle",
    "straggler",
    "link_contention",
    "kernel_regression",
    "scheduler_misconfig",
    "collective_hang",
    "workload_shift",
)
assert set(SIM_FAULTS) <= set(FAULTS)

NET_DELAY_UNIT_NS = 50_000
STRAGGLER_UNIT_NS = 500_000
WATCHDOG_TIMEOUT_NS = 600_000_000_000  # PyTorch's default NCCL timeout, 10 minutes


@dataclass(frozen=True)
class FaultSpec:
    fault: str = "none"
    rank: int = 0
    intensity: float = 1.0
    window: tuple[int, int] = (0, 1 << 62)
    peer: int = -1  # link_contention: the other end of the link (default: next rank in the ring)
    variant: str = ""  # kernel_regression: "kernel_swap" (default) or "graph_fallback"

    def __post_init__(self) -> None:
        if self.fault not in SIM_FAULTS:
            raise ValueError(
                f"unknown simulator fault {self.fault!r}; known: {', '.join(SIM_FAULTS)}"
            )
        if self.intensity < 0:
            raise ValueError("intensity must be non-negative")
        if self.variant not in ("", "kernel_swap", "graph_fallback"):
            raise ValueError(f"unknown variant {self.variant!r}: kernel_swap or graph_fallback")
        if self.window[0] >= self.window[1]:
            raise ValueError(f"empty window {self.window[0]}:{self.window[1]}")

    def active(self, step: int) -> bool:
        return self.window[0] <= step < self.window[1]

    def on(self, fault: str, step: int) -> bool:
        return self.fault == fault and self.active(step)


class FaultModel:
    """Answers the rank model's questions: how much slower is this, on which rank, at this step."""

    def __init__(self, spec: FaultSpec, gpus_per_node: int, tp: int) -> None:
        self.spec = spec
        self.gpus_per_node = gpus_per_node
        self.tp = tp

    def kernel_factor(self, rank: int, step: int, rng: np.random.Generator) -> float:
        s = self.spec
        if rank != s.rank or not s.active(step):
            return 1.0
        if s.fault == "gpu_throttle":
            return 1.0 + s.intensity
        if s.fault == "gpu_contention":
            return 1.0 + s.intensity * rng.uniform(0.0, 2.0)
        return 1.0

    def cpu_factor(self, rank: int, step: int) -> float:
        s = self.spec
        if s.fault == "host_cpu_contention" and rank == s.rank and s.active(step):
            return 1.0 + s.intensity
        return 1.0

    def arrival_delay_ns(self, rank: int, step: int) -> int:
        s = self.spec
        if s.fault == "straggler" and rank == s.rank and s.active(step):
            return int(s.intensity * STRAGGLER_UNIT_NS)
        return 0

    def link(
        self, a: int, b: int, step: int, bytes_per_ns: float, latency_ns: int
    ) -> tuple[float, int]:
        """Bandwidth and latency of the a–b path at this step, after any network fault."""
        s = self.spec
        if not s.active(step):
            return bytes_per_ns, latency_ns
        crosses = a // self.gpus_per_node != b // self.gpus_per_node
        node = s.rank // self.gpus_per_node
        touches_node = crosses and node in (a // self.gpus_per_node, b // self.gpus_per_node)
        if s.fault == "net_delay" and touches_node:
            return bytes_per_ns, latency_ns + int(s.intensity * NET_DELAY_UNIT_NS)
        if s.fault == "bandwidth_throttle" and touches_node:
            return bytes_per_ns / (1.0 + s.intensity), latency_ns
        if s.fault == "link_contention" and {a, b} == {s.rank, self.peer_of(s.rank)}:
            return bytes_per_ns / (1.0 + s.intensity), latency_ns
        return bytes_per_ns, latency_ns

    def peer_of(self, rank: int) -> int:
        """The rank's ring neighbour in its tensor-parallel group (or the configured peer)."""
        if self.spec.peer >= 0:
            return self.spec.peer
        first = rank - rank % self.tp
        return first + (rank - first + 1) % self.tp

    def regression(self, rank: int, step: int) -> bool:
        """The GEMM swap variant of kernel_regression is on for this rank and step."""
        s = self.spec
        swap = s.variant in ("", "kernel_swap")
        return s.fault == "kernel_regression" and swap and rank == s.rank and s.active(step)

    def graph_fallback(self, rank: int, step: int) -> bool:
        """The CUDA-graph fallback variant: decode steps on the rank launch every kernel eagerly."""
        s = self.spec
        return (
            s.fault == "kernel_regression"
            and s.variant == "graph_fallback"
            and rank == s.rank
            and s.active(step)
        )

    def changes_kernels(self, rank: int, step: int, graph: bool, can_swap: bool = True) -> bool:
        """kernel_regression altered this step on the rank: a swapped GEMM runs only where the
        step launches eagerly (a replayed CUDA graph keeps the kernel it captured; `can_swap` is
        whether the calibration has a fallback GEMM at all), and a lost graph matters only to a
        step that would have replayed one. The window's other steps run exactly as without the
        fault, so the labels leave them out."""
        if self.regression(rank, step):
            return can_swap and not graph
        return graph and self.graph_fallback(rank, step)

    def hangs(self, rank: int, step: int) -> bool:
        s = self.spec
        return s.fault == "collective_hang" and rank == s.rank and step == s.window[0]
