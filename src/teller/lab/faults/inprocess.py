"""Drive the in-process faults from a rank's engine loop: one object, asked once per step."""

from __future__ import annotations

import time
from pathlib import Path

from transformers import LlamaForCausalLM

from teller.lab.faults import host_stall, scheduler_misconfig, slow_operator
from teller.lab.serve.config import InProcessFault

IN_PROCESS_FAULTS = ("host_stall", "slow_operator", "scheduler_misconfig")


class Faults:
    """The rank's view of its configured fault; a no-op when there is none or it is elsewhere."""

    def __init__(
        self,
        fault: InProcessFault | None,
        rank: int,
        model: LlamaForCausalLM,
        t0_ns: int,
        truth_dir: Path,
    ) -> None:
        mine = fault is not None and fault.kind in IN_PROCESS_FAULTS
        # the scheduler lives on rank 0 whatever rank the label names
        if mine and fault.kind == "scheduler_misconfig":
            mine = rank == 0
        elif mine:
            mine = fault.rank == rank
        self.fault = fault if mine else None
        self.model = model
        self.t0_ns = t0_ns
        self.rank = rank
        self.truth_dir = truth_dir
        self.storm: host_stall.GcStorm | None = None
        if self.fault is not None and self.fault.kind == "host_stall":
            self.storm = host_stall.GcStorm(self.active, self.fault.intensity)
            self.storm.start()

    def active(self) -> bool:
        if self.fault is None:
            return False
        return self.fault.active((time.time_ns() - self.t0_ns) / 1e9)

    def before_step(self) -> None:
        if self.fault is not None and self.fault.kind == "slow_operator":
            slow_operator.apply(self.active())

    def scheduler_limits(self, max_num_seqs: int, max_tokens: int) -> tuple[int, int]:
        """The limits this step schedules with: the configured ones, or the misconfigured ones."""
        if self.fault is not None and self.fault.kind == "scheduler_misconfig" and self.active():
            return scheduler_misconfig.limits(self.fault.intensity, max_num_seqs, max_tokens)
        return max_num_seqs, max_tokens

    def stop(self) -> None:
        """End the fault; a storm records its collections for the labels."""
        if self.storm is not None:
            self.storm.stop()
            self.storm.write(host_stall.collections_file(self.truth_dir, self.rank))


def start(
    fault: InProcessFault | None, rank: int, model: LlamaForCausalLM, t0_ns: int, truth_dir: Path
) -> Faults:
    return Faults(fault, rank, model, t0_ns, truth_dir)
