"""`teller lab dataset` records planned cases, resumes, and records failures without stopping."""

from __future__ import annotations

import json
import os

import pytest

from teller.lab.dataset import build_dataset, plan_cases
from teller.lab.faults.catalog import LAB_FAULTS
from teller.labels import CaseLabels


def test_plan_mixes_faults_ranks_tp_and_is_fixed_by_its_seed():
    plan = plan_cases(36, seed=5, allow_root_faults=True)
    assert plan == plan_cases(36, seed=5, allow_root_faults=True)
    assert plan != plan_cases(36, seed=6, allow_root_faults=True)
    assert {case.spec.fault for case in plan} == set(LAB_FAULTS)
    assert {case.spec.tp for case in plan} == {2, 3, 4}
    assert all(0 <= case.spec.rank < case.spec.tp for case in plan)
    assert len({case.spec.seed for case in plan}) == 36
    no_root = plan_cases(36, seed=5, allow_root_faults=False)
    assert not {c.spec.fault for c in no_root} & {"net_throttle", "memory_pressure"}


@pytest.mark.lab
def test_dataset_records_skips_on_resume_and_records_a_failed_case(tmp_path):
    blocked = tmp_path / "case0001"
    blocked.mkdir()
    (blocked / "something").write_text("not a case")  # makes case0001 fail: folder not empty
    summary = build_dataset(2, tmp_path, seed=1, progress=False)
    assert (summary.recorded, summary.skipped, summary.failed) == (1, 0, 1)
    labels = CaseLabels.read(tmp_path / "case0000")
    assert labels.fault == "none" and labels.source == "lab"
    entries = [json.loads(line) for line in summary.index.read_text().splitlines()]
    assert [(e["case_id"], e["status"]) for e in entries] == [
        ("case0000", "ok"),
        ("case0001", "failed"),
    ]
    assert "not empty" in entries[1]["error"]
    assert entries[0]["view"] == "-" and entries[0]["labelled_steps"] == len(labels.steps)
    assert entries[0]["cores_shared"] == (entries[0]["tp"] > os.cpu_count())
    again = build_dataset(2, tmp_path, seed=1, progress=False)
    assert (again.recorded, again.skipped, again.failed) == (0, 1, 1)
    assert len(summary.index.read_text().splitlines()) == 3
