"""A fault's own log evidence lands on the labelled steps (issue: log↔trace alignment).

Recorded now with the GPU-cluster simulator, whose kv_pressure fault prints vLLM's real
preemption warning when the shrunken KV cache forces a recompute.
"""

from __future__ import annotations

from pathlib import Path

from teller.align.align import align_run
from teller.cli import main
from teller.lab.labels import CaseLabels


def test_preemption_warnings_land_on_the_labelled_steps(tmp_path: Path) -> None:
    case = tmp_path / "kv"
    argv = ["-q", "lab", "sim", "--out", str(case), "--nodes", "1", "--gpus-per-node", "2"]
    argv += ["--tp", "2", "--steps", "40", "--fault", "kv_pressure", "--intensity", "2"]
    argv += ["--window", "15:30", "--seed", "5"]
    assert main(argv) == 0
    labels = CaseLabels.read(case)
    result = align_run([case / "traces"], sorted((case / "logs").glob("*.log")))

    events = result.logs.table.column("event").to_pylist()
    preempted = [i for i, event in enumerate(events) if event == "request_preempted"]
    assert len(preempted) >= 5
    placed = {int(result.alignment.step[i]) for i in preempted}
    assert placed and placed <= set(labels.steps)
