"""A step typed KV pressure whose engine line states a cache with room takes another type.

An engine preempts only when its KV cache has no free block; a scheduler capped too low leaves
requests waiting just as a full cache does. The fill the engine printed in the step tells them
apart (`teller.rca.infer.cache_refutes`): the step keeps its flag, not the type.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from teller.analysis import Analysis
from teller.rca.dataset import read_case_records
from teller.rca.infer import KV_FULL, LoadedModel, cache_refutes

from .conftest import small_case

LAB_CASE = Path(__file__).parents[1] / "align" / "data" / "lab_none_tp2"


def test_the_fill_a_steps_own_line_states_is_read_from_a_recorded_lab_run():
    """The lab's engine prints vLLM's iteration lines, each with the KV cache's usage: every
    stated fill is a fraction, on a step of the run, and its small model never fills the cache."""
    analysis = Analysis(LAB_CASE)
    fill = analysis.alignment.kv_fill
    steps = set(analysis.tree.steps.index.tolist())
    assert len(fill) > 10 and set(fill) <= steps
    assert all(0.0 <= v < KV_FULL for v in fill.values())
    records = read_case_records(LAB_CASE)
    stated = np.array([r.kv_cache_fill is not None for r in records])
    assert stated.sum() == len(fill)
    assert (cache_refutes(records) == stated).all()


def test_a_step_typed_kv_pressure_with_room_in_its_cache_takes_another_type():
    """On the simulator's KV-pressure case, without its preemption lines, the shipped model types
    the steps it flags kv_pressure, their lines stating a cache 95-100% full. The same steps with
    a line stating it a third full keep their flags under another type; the run's other steps
    are untouched."""
    model = LoadedModel.load()
    records = [
        dataclasses.replace(r, preempted=0) for r in read_case_records(small_case("kv_pressure"))
    ]
    before = {d.iteration: d.fault for d in model.diagnose_records(records) if d.anomalous}
    full = {i for i, fault in before.items() if fault == "kv_pressure"}
    assert full and not cache_refutes([r for r in records if r.iteration in full]).any()

    roomy = [
        dataclasses.replace(r, kv_cache_fill=0.35) if r.iteration in full else r for r in records
    ]
    after = {d.iteration: d.fault for d in model.diagnose_records(roomy) if d.anomalous}
    assert set(after) == set(before)
    assert all(after[i] != "kv_pressure" for i in full)
    assert {i: f for i, f in after.items() if i not in full} == {
        i: f for i, f in before.items() if i not in full
    }
