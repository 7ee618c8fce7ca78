"""GPU-cluster trace simulator: what a CPU-only lab cannot record, written as real tools write it.

`simulate(SimConfig(...), out)` writes a case: per-rank Kineto traces (kernels, CUDA graphs, NCCL
over NVLink and the network), vLLM-style logs, OTLP request spans, `labels.json` and a manifest.
Kernel names, stacks and timings come from calibration.json (scripts/calibrate_sim.py); faults are
in `faults.py`.
"""

from teller.lab.sim.engine import EngineConfig, WorkloadConfig
from teller.lab.sim.faults import SIM_FAULTS, FaultSpec
from teller.lab.sim.run import SimConfig, SimResult, simulate
from teller.lab.sim.topology import Topology

__all__ = [
    "SIM_FAULTS",
    "EngineConfig",
    "FaultSpec",
    "SimConfig",
    "SimResult",
    "Topology",
    "WorkloadConfig",
    "simulate",
]
