"""`teller lab dataset`: many labelled cases, mixing faults, ranks, intensities, TP sizes and seeds.

The plan is drawn from one seed, so `--n N --seed S` always names the same cases (`case0000`,
`case0001`, …), and a rerun resumes: a case that already has labels.json is skipped, a failed case
is recorded in index.jsonl and the batch goes on. Each index line holds the spec, the outcome, and
for a recorded case its view, guilty operator and labelled step count, plus whether the ranks
outnumber the cores (then a CPU fault's guilty rank shares its core with a peer). Faults that need root are left out of the plan
when not running as root.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from teller.errors import TellerError
from teller.lab import netns
from teller.lab.faults.catalog import LAB_FAULTS
from teller.lab.run import CaseSpec, run_case
from teller.labels import CaseLabels

#: Intensity range drawn per fault: strong enough to show, mild enough to be realistic.
INTENSITY_RANGE: dict[str, tuple[float, float]] = {
    "none": (0.0, 0.0),
    "cpu_contention": (0.5, 1.0),
    "straggler": (0.5, 0.85),
    "net_throttle": (0.75, 0.95),
    "slow_operator": (1.0, 1.0),
    "scheduler_misconfig": (0.7, 1.0),
    "host_stall": (0.3, 0.9),
    "memory_pressure": (0.5, 1.0),
    "workload_shift": (0.3, 1.0),
}
TP_SIZES = (2, 3, 4)
DURATION_S = 8.0


@dataclass
class PlannedCase:
    case_id: str
    spec: CaseSpec


@dataclass
class DatasetSummary:
    recorded: int
    skipped: int
    failed: int
    index: Path


def plan_cases(n: int, seed: int, allow_root_faults: bool) -> list[PlannedCase]:
    """N cases cycling through the faults (balanced), the rest drawn from the seed."""
    rng = np.random.default_rng(seed)
    faults = [f for f, kind in LAB_FAULTS.items() if allow_root_faults or not kind.needs_root]
    planned = []
    for k in range(n):
        fault = faults[k % len(faults)]
        tp = int(rng.choice(TP_SIZES))
        low, high = INTENSITY_RANGE[fault]
        start_s = float(rng.uniform(1.0, 3.0))
        spec = CaseSpec(
            fault=fault,
            rank=int(rng.integers(0, tp)),
            intensity=round(float(rng.uniform(low, high)), 2),
            window_s=(round(start_s, 2), round(start_s + float(rng.uniform(2.0, 4.0)), 2)),
            tp=tp,
            seed=int(rng.integers(0, 2**31)),
            duration_s=DURATION_S,
        )
        planned.append(PlannedCase(f"case{k:04d}", spec))
    return planned


def build_dataset(n: int, out: str | Path, seed: int = 0, progress: bool = True) -> DatasetSummary:
    """Record the planned cases that `out` does not hold yet; append each outcome to index.jsonl."""
    if n < 1:
        raise TellerError(f"--n {n}: need at least one case")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    index = out / "index.jsonl"
    planned = plan_cases(n, seed, allow_root_faults=netns.is_root())
    recorded = skipped = failed = 0
    iterator = planned
    if progress:
        from tqdm import tqdm

        iterator = tqdm(planned, desc="lab dataset", unit="case")
    for case in iterator:
        case_dir = out / case.case_id
        if (case_dir / "labels.json").exists():
            skipped += 1
            continue
        began = time.monotonic()
        entry = {"case_id": case.case_id, **asdict(case.spec)}
        try:
            run_case(case.spec, case_dir)
        except TellerError as error:
            failed += 1
            entry.update(status="failed", error=str(error))
        else:
            recorded += 1
            labels = CaseLabels.read(case_dir)
            entry.update(
                status="ok",
                view=labels.view,
                guilty_operator=labels.guilty_operator,
                labelled_steps=len(labels.steps),
            )
        # more ranks than cores: a CPU fault on one rank also slows the rank sharing its core
        entry["cores_shared"] = case.spec.tp > (os.cpu_count() or 1)
        entry["seconds"] = round(time.monotonic() - began, 1)
        _append_line(index, entry)
    return DatasetSummary(recorded, skipped, failed, index)


def _append_line(path: Path, entry: dict) -> None:
    """One write per line, so an interrupted batch leaves whole lines only."""
    line = (json.dumps(entry) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
