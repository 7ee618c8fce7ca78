"""Comparisons inside one step on real captures with a planted fault (`teller.eval.planting`):
the peers at the same collective instance, on the 2-GPU Nsight Systems export."""

from __future__ import annotations

from pathlib import Path

from conftest import real_trace
from teller.analysis import Analysis
from teller.eval.planting_suite import SUITE, Planter, load, rank_of_pid
from teller.localize import NumericLocalizer
from teller.localize.collectives import IN_STEP_REFERENCE

FASTVIDEO = "nsys_ai/fastvideo_h100_sp2_1s.sqlite"


def _localized(path: Path):
    analysis = Analysis(path, progress=False)
    return analysis, NumericLocalizer().score(analysis.tree, analysis.facts)


def test_a_stalled_device_is_found_by_its_late_arrival(tmp_path: Path) -> None:
    spec = next(s for s in SUITE if s.path == FASTVIDEO)
    planter = Planter(spec, load(real_trace(FASTVIDEO)), seed=19)
    for size in ("0.02", "0.1"):
        variant = planter.plant(f"straggler:device1:{size}")
        analysis, found = _localized(variant.write(tmp_path / size))
        (step,) = found.anomalous_steps()
        stalled = rank_of_pid(analysis.event_table, variant.truth.pid)
        candidates = found.candidates[step.iteration]
        assert candidates[0].rank == stalled  # its late arrival, or the host op it stalled in
        (late,) = [c for c in candidates if c.kind == "arrival"]
        assert late.rank == stalled and late.reference == IN_STEP_REFERENCE
        assert late.observed_ns >= 0.9 * variant.truth.added_ns


def test_the_collective_without_a_stall_flags_nothing(tmp_path: Path) -> None:
    spec = next(s for s in SUITE if s.path == FASTVIDEO)
    planter = Planter(spec, load(real_trace(FASTVIDEO)), seed=19)
    _, found = _localized(planter.plant("control:control:0").write(tmp_path))
    assert found.anomalous_steps() == []
