"""A step that held back requests it had room for, its cache not full, is a capped scheduler.

A scheduler capped too low makes steps smaller, not slower, so the step head can leave them under
its threshold; the floor (`teller.rca.infer.held_back_with_room`) flags them and names the type.
A full cache holds requests back too, so the fill the step's own engine line states must be
under `KV_FULL`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from teller.rca.dataset import read_case_records
from teller.rca.infer import KV_FULL, LoadedModel, held_back_with_room

from .conftest import small_case

LAB_CASE = Path(__file__).parents[1] / "align" / "data" / "lab_none_tp2"


def test_a_recorded_fault_free_lab_run_holds_nothing_back():
    records = read_case_records(LAB_CASE)
    assert any(r.kv_cache_fill is not None for r in records)
    assert all((r.held_back or 0) == 0 for r in records)
    assert not held_back_with_room(records).any()


def test_the_simulators_capped_scheduler_is_flagged_by_the_floor_in_its_window():
    records = read_case_records(small_case("scheduler_misconfig"))
    floored = {r.iteration for r, f in zip(records, held_back_with_room(records), strict=True) if f}
    assert floored and floored <= set(range(10, 20))
    findings = LoadedModel.load().diagnose_records(records)
    typed = {d.iteration: d.fault for d in findings if d.anomalous}
    assert all(typed.get(i) == "scheduler_misconfig" for i in floored)


def test_a_calm_step_that_held_requests_back_is_flagged_only_with_room_in_its_cache():
    """The shipped model leaves a calm step of a fault-free run unflagged; with two requests held
    back and a line stating the cache a third full it is a capped scheduler, and the run's other
    steps keep their flags and types. With the cache full, the floor leaves it alone."""
    model = LoadedModel.load()
    records = read_case_records(small_case("none"))
    before = {d.iteration: d.fault for d in model.diagnose_records(records) if d.anomalous}
    calm = next(r.iteration for r in records if r.iteration not in before and r.iteration > 2)

    def held(fill: float) -> list:
        return [
            dataclasses.replace(r, held_back=2, kv_cache_fill=fill) if r.iteration == calm else r
            for r in records
        ]

    after = {d.iteration: d.fault for d in model.diagnose_records(held(0.3)) if d.anomalous}
    assert after == {**before, calm: "scheduler_misconfig"}
    full = held(KV_FULL + 0.1)
    assert not held_back_with_room(full).any()


def test_a_capped_schedulers_findings_blame_no_rank_or_operator():
    """Its findings' measurements come from whichever rank the pointer named; the verdict groups
    them as one incident of the engine, and its summary and terminal report suspect the engine's
    scheduling, not that rank or operator."""
    from teller.analysis import Analysis
    from teller.rca.diagnose import incidents
    from teller.report import render

    analysis = Analysis(small_case("scheduler_misconfig"))
    verdict = analysis.diagnose()
    capped = [f for f in verdict.findings if f.fault_type == "scheduler_misconfig"]
    assert len({f.rank for f in capped}) > 1
    assert next(g for g in incidents(verdict.findings) if capped[0] in g) == capped
    assert "Suspect the engine's scheduling" in verdict.summary
    text = render(verdict, analysis.tree, "terminal")
    assert "suspect: no single operator on all ranks — scheduler_misconfig" in text
