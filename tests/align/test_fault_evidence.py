"""A fault's own log evidence lands on the labelled steps.

Recorded with the GPU-cluster simulator, whose kv_pressure fault prints vLLM's real
preemption warning when the shrunken KV cache forces a recompute, and whose kernel_regression
prints vLLM's JIT-compilation warning when the guilty rank first launches its new kernel.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from teller.align.align import align_run
from teller.cli import main
from teller.labels import CaseLabels


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


def test_jit_warning_lands_on_the_regressions_first_step_on_the_guilty_rank(tmp_path: Path) -> None:
    """kernel_regression's new kernel is compiled where the guilty rank first launches it: vLLM's
    JIT warning, printed by that rank's worker, names it and joins that step on that rank."""
    case = tmp_path / "regression"
    argv = ["-q", "lab", "sim", "--out", str(case), "--nodes", "1", "--gpus-per-node", "2"]
    argv += ["--tp", "2", "--steps", "30", "--layers", "2", "--fault", "kernel_regression"]
    argv += ["--rank", "1", "--window", "10:25", "--seed", "3"]
    assert main(argv) == 0
    labels = CaseLabels.read(case)
    result = align_run([case / "traces"], sorted((case / "logs").glob("*.log")))

    rows = result.alignment.to_arrow(result.logs).to_pylist()
    (jit,) = [row for row in rows if row["event"] == "jit_compile"]
    assert (jit["process"], jit["rank"], jit["level"]) == ("Worker_TP1", 1, "WARNING")
    assert json.loads(jit["fields"])["kernel"] in labels.guilty_operator
    assert jit["step"] in labels.steps and jit["step_rank"] == labels.guilty_rank == 1
    tree = result.tree
    swapped = np.isin(
        tree.name, [i for i, n in enumerate(tree.names) if n == labels.guilty_operator]
    )
    first = tree.steps.index[tree.step[swapped & (tree.step >= 0)]].min()
    assert set(tree.rank[swapped].tolist()) == {1} and jit["step"] == first
