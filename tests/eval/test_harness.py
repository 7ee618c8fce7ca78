"""The harness end to end on tiny labelled runs: splits by case, scores per view, scoreboard."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders import write_run
from teller.cli import main
from teller.eval.cases import find_cases, split_cases
from teller.eval.harness import evaluate
from teller.eval.methods import METHODS
from teller.lab.labels import CaseLabels


def make_case(root: Path, name: str, fault: str, **faults) -> Path:
    case = root / name
    (case / "traces").mkdir(parents=True)
    write_run(case / "traces", **faults)
    steps = sorted({step for _, step in {**faults.get("slow_mm", {}), **faults.get("late", {})}})
    view = {"none": "-", "cpu_contention": "V", "straggler": "H"}[fault]
    guilty = {"none": None, "cpu_contention": "aten::mm", "straggler": "gloo:all_reduce"}[fault]
    rank = next(iter({**faults.get("slow_mm", {}), **faults.get("late", {})}), (None,))[0]
    CaseLabels(
        case_id=name,
        source="lab",
        fault=fault,
        view=view,
        guilty_rank=rank,
        guilty_operator=guilty,
        window_ns=None,
        steps=steps,
        intensity=1.0,
        seed=0,
        explanation="test case",
    ).write(case)
    return case


@pytest.fixture
def cases(tmp_path: Path) -> Path:
    for seed in range(3):
        make_case(tmp_path, f"none{seed}", "none")
        make_case(
            tmp_path,
            f"cpu{seed}",
            "cpu_contention",
            slow_mm={(1, 6 + seed): 4.0, (1, 7 + seed): 4.0},
        )
        make_case(tmp_path, f"late{seed}", "straggler", late={(0, 4 + seed): 400})
    return tmp_path


def test_split_is_by_case_and_holds_a_fault_out(cases: Path) -> None:
    found = find_cases([cases])
    split = split_cases(found, test_share=0.34, seed=1, held_out_fault="straggler")
    assert not set(split.train) & set(split.test)
    assert {c for c in split.test if c.startswith("late")} == {"late0", "late1", "late2"}
    assert all(not c.startswith("late") for c in split.train)


def test_localizer_scores_perfectly_on_cases_built_to_be_clear(cases: Path) -> None:
    found = find_cases([cases])
    split = split_cases(found, test_share=0.67, seed=0)
    result = evaluate({"localizer": METHODS["localizer"]}, found, split, progress=False)
    rows = {r.group: r for r in result.rows}
    assert rows["vertical"].joint_f1 == 1.0 and rows["vertical"].ac1 == 1.0
    assert rows["horizontal"].joint_f1 == 1.0 and rows["horizontal"].rank_ac1 == 1.0
    assert rows["overall"].false_alarm_rate == 0.0


def test_eval_all_writes_a_scoreboard(
    cases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "board"
    assert main(["-q", "eval", "--cases", str(cases), "--all", "-o", str(out)]) == 0
    board = (out / "scoreboard.md").read_text()
    for method in METHODS:
        assert f"| {method} |" in board
    assert (out / "scoreboard.json").is_file()


def test_a_labelled_step_missing_from_the_methods_steps_is_a_miss() -> None:
    """A hang's unfinished step has no step node, so no method reports it; it still counts."""
    from teller.eval.harness import CaseOutcome, score_group

    hang = CaseOutcome(
        case_id="hang",
        fault="collective_hang",
        view="H",
        steps=[0, 1, 2],
        flagged=[],
        top={},
        ranked=[],
        truth_steps=[3],
        guilty_operator="nccl:all_reduce",
        guilty_rank=1,
    )
    row = score_group("m", "fault: collective_hang", [hang])
    assert row.step_recall == 0.0
    assert row.joint_recall == 0.0 and row.joint_f1 == 0.0
