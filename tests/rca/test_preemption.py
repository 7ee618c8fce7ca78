"""A step in which the engine logged a preemption is flagged, whatever its time.

vLLM logs every request it preempts for want of KV cache ("Sequence group … is preempted by
PreemptionMode.RECOMPUTE mode because there is not enough KV cache space"). The request pays
for it (its prefill runs again), the step that evicts it need not: the floor
(`teller.rca.infer.logged_preemption`) flags the steps those lines align to. On the simulator's
KV-pressure case (vLLM's log lines, preemptions in steps 10..19), and on a fault-free one whose
calm step is given a preemption: the shipped model flags it only through the floor.
"""

from __future__ import annotations

import dataclasses

import pytest

from teller.analysis import Analysis
from teller.rca.dataset import read_case_records
from teller.rca.infer import LoadedModel, logged_preemption

from .conftest import small_case


def test_the_steps_a_preemption_was_logged_in_are_counted_and_flagged():
    case = small_case("kv_pressure")
    analysis = Analysis(case)
    preempted = analysis.alignment.preempted
    assert preempted and set(preempted) <= set(range(10, 20))
    lines = (case / "logs").glob("*.log")
    logged = sum(text.count("is preempted by") for text in (p.read_text() for p in lines))
    assert sum(preempted.values()) <= logged  # a line that matches no step counts nowhere

    records = read_case_records(case)
    floored = {r.iteration for r, f in zip(records, logged_preemption(records), strict=True) if f}
    assert floored == set(preempted)
    flagged = {f.step for f in analysis.diagnose().findings}
    assert floored <= flagged


def test_a_run_without_preemptions_gets_nothing_from_the_floor():
    records = read_case_records(small_case("none"))
    assert all(r.preempted == 0 for r in records)
    assert not logged_preemption(records).any()
    assert all(r.preempted is None for r in read_case_records(small_case("none"), use_logs=False))


@pytest.mark.parametrize("fault", ["none", "gpu_throttle"])
def test_a_step_that_ran_as_expected_is_flagged_where_a_preemption_was_logged(fault):
    """The shipped model leaves a calm step unflagged; the same step with one preemption
    aligned to it is flagged as KV pressure, and the run's other findings keep their flags and
    types (a preemption beside a throttled GPU is a second incident, not the throttle's)."""
    model = LoadedModel.load()
    records = read_case_records(small_case(fault))
    before = {d.iteration: d.fault for d in model.diagnose_records(records) if d.anomalous}
    calm = next(r.iteration for r in records if r.iteration not in before and r.iteration > 2)
    marked = [dataclasses.replace(r, preempted=1) if r.iteration == calm else r for r in records]
    after = {d.iteration: d.fault for d in model.diagnose_records(marked) if d.anomalous}
    assert after == {**before, calm: "kv_pressure"}
