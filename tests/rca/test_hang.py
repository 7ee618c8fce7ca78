"""A collective hang: the step it leaves unfinished is reported, with the rank that never arrived.

The hung step never closes, so it has no step node: only the collective that some ranks entered
and sat in until the watchdog fired marks it (teller.localize.localizer.unfinished_step).
"""

from __future__ import annotations

import json

import pytest

from teller.callchain.tree import build_tree
from teller.cli import main
from teller.ingest import find_trace_files, read_run
from teller.labels import CaseLabels
from teller.localize import NumericLocalizer

from .conftest import small_case


def test_the_localizer_reports_the_unfinished_step_and_the_missing_rank():
    case = small_case("collective_hang", rank=1, seed=5)
    labels = CaseLabels.read(case)
    tree = build_tree(read_run(find_trace_files([case / "traces"])))
    assert labels.steps[0] not in tree.steps.index.tolist()  # no step node for it
    result = NumericLocalizer().score(tree)
    hung = [s for s in result.anomalous_steps() if s.kind == "unfinished"]
    assert [s.iteration for s in hung] == labels.steps
    top = result.candidates[labels.steps[0]][0]
    assert (top.operator, top.rank, top.kind) == (labels.guilty_operator, 1, "arrival")
    assert hung[0].dur_ns >= 10_000_000_000


@pytest.mark.parametrize("guilty", [2, 3])
def test_with_pipeline_stages_the_missing_rank_is_one_of_the_collectives_group(guilty):
    """The other stage's ranks were never in the hung tensor-parallel all-reduce: they are not
    missing from it, the guilty rank of its group is."""
    from lab.test_sim_cases import case

    out, _, tree = case(fault="collective_hang", rank=guilty, nodes=1, gpus=4, tp=2, pp=2)
    labels = CaseLabels.read(out)
    result = NumericLocalizer().score(tree)
    top = result.candidates[labels.steps[0]][0]
    assert (top.rank, top.kind) == (guilty, "arrival")
    assert f"rank(s) [{guilty}] never arrived" in top.reference


@pytest.mark.parametrize("method", ["localizer", "model"])
def test_analyze_headlines_the_hang(method, tmp_path):
    case = small_case("collective_hang", rank=1, seed=5)
    labels = CaseLabels.read(case)
    out = tmp_path / "verdict.json"
    assert (
        main(["-q", "analyze", str(case), "--method", method, "--format", "json", "-o", str(out)])
        == 0
    )
    finding = json.loads(out.read_text())["findings"][0]
    assert finding["step"] == labels.steps[0]
    assert (finding["operator"], finding["rank"]) == (labels.guilty_operator, labels.guilty_rank)
    assert finding["fault_type"] == "collective_hang"
    assert "never reached" in finding["explanation"]


def test_a_quiet_run_has_no_unfinished_step():
    tree = build_tree(read_run(find_trace_files([small_case("none", seed=5) / "traces"])))
    assert all(s.kind != "unfinished" for s in NumericLocalizer().score(tree).steps)
