"""The `labels.json` of a case: what fault was injected, where and when, and the reference verdict.

The real lab and the simulator write the same schema, so training, evaluation and the reports
treat their cases alike (DESIGN.md §4). Steps are the rank-local step ordinals that
`teller.callchain.build_tree` finds; with tensor parallelism every rank runs every step, so one
ordinal names the same iteration on all ranks.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from teller.atomic import write_text_atomic
from teller.errors import TraceError

SCHEMA = "teller.labels/1"

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


@dataclass
class CaseLabels:
    """Ground truth of one case (one injection run)."""

    case_id: str
    source: str  # "lab" or "sim"
    fault: str
    view: str  # "V", "H" or "-"
    guilty_rank: int | None
    guilty_operator: str | None  # a call-chain node name, as the readers name it
    window_ns: tuple[int, int] | None  # unix ns, [start, end)
    steps: list[int]  # rank-local step ordinals the fault acted on (its window, or less)
    intensity: float
    seed: int
    explanation: str  # one-sentence reference explanation
    params: dict = field(default_factory=dict)  # fault- and workload-specific settings
    schema: str = SCHEMA

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; known: {', '.join(FAULTS)}")
        if self.view != FAULTS[self.fault]:
            raise ValueError(
                f"fault {self.fault!r} is view {FAULTS[self.fault]!r}, not {self.view!r}"
            )
        if self.window_ns is not None:
            self.window_ns = (int(self.window_ns[0]), int(self.window_ns[1]))

    @property
    def is_fault(self) -> bool:
        return self.view != "-"

    def write(self, case_dir: str | Path) -> Path:
        """Write `labels.json` atomically into the case directory."""
        return write_text_atomic(Path(case_dir) / "labels.json", json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, case_dir: str | Path) -> CaseLabels:
        path = Path(case_dir)
        path = path / "labels.json" if path.is_dir() else path
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise TraceError(path, "no labels.json: not a labelled case") from None
        except json.JSONDecodeError as error:
            raise TraceError(
                path, f"not valid JSON ({error.msg})", where=f"byte {error.pos}"
            ) from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise TraceError(path, f"expected a labels object with schema {SCHEMA!r}")
        try:
            return cls(**data)
        except (TypeError, ValueError) as error:
            raise TraceError(path, f"labels do not fit schema {SCHEMA}: {error}") from None
