"""The harness end to end on tiny labelled runs: splits by case, scores per view, scoreboard."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders import write_run
from teller.callchain.tree import CallTree
from teller.cli import main
from teller.eval.cases import Split, find_cases, split_cases
from teller.eval.harness import ExplanationVerdict, evaluate, judge_explanation
from teller.eval.methods import METHODS
from teller.eval.model_method import RootCauseMethod
from teller.eval.scoreboard import render_markdown
from teller.faults import FAULT_FREE
from teller.labels import CaseLabels
from teller.localize import Localization, NumericLocalizer, StepExplanation


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
        source="sim",
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


def test_cases_are_found_through_links_and_each_once(cases: Path, tmp_path_factory) -> None:
    """A board is often a folder of links to cases recorded elsewhere; a link back up the tree
    does not make the walk go round."""
    board = tmp_path_factory.mktemp("board")
    for case in sorted(cases.iterdir())[:3]:
        (board / case.name).symlink_to(case, target_is_directory=True)
    (board / "loop").symlink_to(board, target_is_directory=True)
    found = find_cases([board])
    assert [c.case_id for c in found] == [c.name for c in sorted(cases.iterdir())[:3]]


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


class ExplainingLocalizer:
    """A fake explaining method: the localizer's verdict, with a sentence for each flagged step
    written from its top candidate and always blaming CPU contention."""

    def fit(self, normal_trees: list[CallTree]) -> ExplainingLocalizer:
        self.localizer_ = NumericLocalizer().fit(normal_trees)
        return self

    def score(self, tree: CallTree) -> Localization:
        localization = self.localizer_.score(tree)
        for step in localization.anomalous_steps():
            top = localization.candidates[step.iteration][0]
            localization.explanations[step.iteration] = StepExplanation(
                fault="cpu_contention",
                text=f"Test case: rank {top.rank} in {top.operator}.",
                operator=top.operator,
                rank=top.rank,
            )
        return localization


def test_explanation_figures_only_for_the_method_that_explains(cases: Path) -> None:
    found = find_cases([cases])
    split = split_cases(found, test_share=0.67, seed=0)
    methods = {"threshold": METHODS["threshold"], "explaining": ExplainingLocalizer}
    result = evaluate(methods, found, split, progress=False)
    rows = {(r.method, r.group): r for r in result.rows}
    for r in result.rows:
        if r.method == "threshold":
            assert r.explained_steps is None and r.rouge_l is None and r.faithful is None
    vertical, horizontal = rows["explaining", "vertical"], rows["explaining", "horizontal"]
    # cpu cases: two flagged steps each; straggler cases: one. The localizer is right on every one.
    test_cpu = sum(c.startswith("cpu") for c in split.test)
    test_late = sum(c.startswith("late") for c in split.test)
    assert (vertical.explained_steps, horizontal.explained_steps) == (2 * test_cpu, test_late)
    assert (vertical.fault_type_right, horizontal.fault_type_right) == (1.0, 0.0)
    assert vertical.faithful == horizontal.faithful == 1.0
    assert vertical.grounded_right == horizontal.grounded_right == 1.0
    # reference "test case" (2 words), matched in full (LCS 2, R = 1):
    # "test case rank 1 in aten mm": P = 2/7, F = 2·(2/7)/(9/7) = 4/9;
    # "test case rank 0 in gloo all reduce": P = 2/8, F = 2·(1/4)/(5/4) = 2/5
    assert vertical.rouge_l == pytest.approx(4 / 9, abs=1e-4)
    assert horizontal.rouge_l == pytest.approx(2 / 5, abs=1e-4)
    assert rows["explaining", "fault: none"].explained_steps is None  # nothing to explain

    board = render_markdown(result, "teller eval", "test cases")
    tables = board.split("Explanations:")[1:]
    assert tables and all("| explaining |" in t.split("##")[0] for t in tables)
    assert all("| threshold |" not in t.split("##")[0] for t in tables)
    assert result.to_json()["rows"][0]["rouge_l"] is None  # threshold rows come first


def labels(operator: str | None = "aten::mm", rank: int | None = 1) -> CaseLabels:
    return CaseLabels(
        case_id="c",
        source="sim",
        fault="cpu_contention",
        view="V",
        guilty_rank=rank,
        guilty_operator=operator,
        window_ns=None,
        steps=[3],
        intensity=1.0,
        seed=0,
        explanation="Rank 1's CPU is contended: aten::mm stretches.",
    )


def test_judge_explanation() -> None:
    right = StepExplanation(
        "cpu_contention", "Rank 1's CPU is contended: aten::mm stretches.", "aten::mm", 1
    )
    assert judge_explanation(right, labels()) == ExplanationVerdict(True, True, True, 1.0)
    # free text is no plan's sentence: not well-formed, and so not in agreement with the heads
    assert not judge_explanation(right, labels()).well_formed
    # words that name a rank the pointer did not pick are unfaithful, whatever the pick
    stray = StepExplanation("straggler", "Rank 2 waits for rank 1 in aten::mm.", "aten::mm", 1)
    verdict = judge_explanation(stray, labels())
    assert (verdict.fault_right, verdict.faithful, verdict.grounded_right) == (False, False, True)
    # a faithful sentence about the wrong rank is not grounded right, unless no operator is labelled
    wrong_rank = StepExplanation("cpu_contention", "Rank 0: aten::mm.", "aten::mm", 0)
    assert not judge_explanation(wrong_rank, labels()).grounded_right
    assert judge_explanation(wrong_rank, labels(operator=None, rank=None)).grounded_right
    assert judge_explanation(None, labels()) == ExplanationVerdict(False, False, False, 0.0)


def test_root_cause_method_explains_every_flagged_step(
    cases: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's explanation reaches the Localization with the node its words came from."""
    import teller.rca.infer as infer

    monkeypatch.setattr(infer, "threshold", lambda config: 0.0)  # flag every step
    case = next(c for c in find_cases([cases]) if c.case_id == "cpu0")
    tree = case.tree()
    method = RootCauseMethod().fit([])
    localization = method.score(tree, logs=case.logs(tree))
    flagged = {s.iteration for s in localization.anomalous_steps()}
    assert flagged and set(localization.explanations) == flagged
    for iteration, explanation in localization.explanations.items():
        candidates = localization.candidates[iteration]
        top = (candidates[0].operator, candidates[0].rank) if candidates else (None, None)
        assert (explanation.operator, explanation.rank) == top
        assert explanation.text and explanation.fault not in FAULT_FREE


def test_model_variants_share_one_cases_step_records_through_its_facts(
    cases: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness computes a case's `RunFacts` once and hands them to every method that takes
    them; the model variants read the trace side of their step records from them, computed once
    (no cache outside the case's own facts)."""
    import teller.rca.dataset.records as records

    computed = []
    step_traces = records.step_traces

    def counted(tree, facts):
        computed.append(tree)
        return step_traces(tree, facts)

    monkeypatch.setattr(records, "step_traces", counted)
    found = find_cases([cases])
    split = Split(train=[c.case_id for c in found if c.case_id != "cpu0"], test=["cpu0"])
    methods = {name: METHODS[name] for name in ("model", "model-no-logs", "model-step-faults")}
    evaluate(methods, found, split, progress=False)
    assert len(computed) == 1
    # without shared facts each scoring computes its own
    case = next(c for c in found if c.case_id == "cpu0")
    tree = case.tree()
    for _ in range(2):
        RootCauseMethod().fit([]).score(tree, logs=case.logs(tree))
    assert len(computed) == 3


def test_the_localizer_is_scored_on_its_verdicts_explanations(cases: Path) -> None:
    """The localizer row judges the words its verdict writes: sentence plans that agree with its
    fault type, operator and rank."""
    found = find_cases([cases])
    split = split_cases(found, test_share=0.67, seed=0)
    result = evaluate({"localizer": METHODS["localizer"]}, found, split, progress=False)
    overall = next(r for r in result.rows if r.group == "overall")
    assert overall.explained_steps and overall.explained_steps > 0
    assert overall.well_formed == 1.0 and overall.agreement == 1.0 and overall.faithful == 1.0


def _straggler_case() -> Path:
    from tests.rca.conftest import small_case

    return small_case("straggler", rank=1, seed=11, gpus=4)


def _scored_and_verdict(case_dir: Path) -> tuple[Localization, list]:
    """The scoreboard's model method on a case, and the verdict `teller analyze` gives on it."""
    from teller.analysis import Analysis

    case = next(iter(find_cases([case_dir])))
    tree = case.tree()
    scored = RootCauseMethod().fit([]).score(tree, logs=case.logs(tree))
    return scored, Analysis(case_dir, method="model").diagnose().findings


def test_the_model_is_scored_on_the_operator_and_rank_its_verdict_names() -> None:
    """Every step the verdict flags is scored with the finding's operator and rank first and the
    finding's fault type and sentence plans, so the scoreboard measures what a user reads. (The
    numbers may differ in the last digit: `teller analyze` puts the ranks on one clock first.)"""
    from teller.rca.plans import parse

    scored, findings = _scored_and_verdict(_straggler_case())
    assert findings and {f.step for f in findings} == {
        s.iteration for s in scored.anomalous_steps()
    }
    for f in findings:
        top = scored.candidates[f.step][0]
        assert (top.operator, top.rank) == (f.operator, f.rank)
        words = scored.explanations[f.step]
        assert words.fault == f.fault_type
        assert [s.plan for s in parse(words.text)] == [s.plan for s in parse(f.explanation)]


def test_the_one_incident_rule_reaches_the_scoreboard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the verdict's one-incident rule re-points a finding at another candidate, the
    scoreboard scores that candidate, not the pointer's first pick."""
    import teller.rca.diagnose as diagnose

    def second_candidate(drafts, context) -> None:
        for draft in drafts:
            if len(draft.ranked) > 1:
                draft.chosen = 1

    monkeypatch.setattr(diagnose, "one_incident_per_cause", second_candidate)
    scored, findings = _scored_and_verdict(_straggler_case())
    repointed = [f for f in findings if len(f.candidates) > 1]
    assert repointed
    for f in repointed:
        top = scored.candidates[f.step][0]
        assert (top.operator, top.rank) == (f.operator, f.rank)
        assert (top.operator, top.rank) == (f.candidates[0]["operator"], f.candidates[0]["rank"])


def test_eval_scores_a_checkpoint_of_ones_own(
    cases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from teller.rca.infer import variant_dir

    args = ["-q", "eval", "--cases", str(cases), "--method", "model", "--test-share", "0.34"]
    assert main([*args, "--model", str(variant_dir("no-logs"))]) == 0
    assert "| model |" in capsys.readouterr().out
    assert main([*args, "--model", str(tmp_path)]) != 0
    assert f"{tmp_path}: not a model checkpoint" in capsys.readouterr().err
