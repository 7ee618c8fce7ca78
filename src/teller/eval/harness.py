"""The evaluation harness: every method on the same cases, scored by the same metrics.

`evaluate(methods, cases, split)` fits each method on the training side's fault-free cases, runs it
on every test case (each case's traces are read once for all methods), and scores the outcome
per view (horizontal, vertical), overall and per fault type, with the false-alarm rate on the
fault-free cases (DESIGN.md §5). Each test case's facts are computed once for all methods: its
`RunFacts` go to every method whose `score` takes `facts`, and methods that read logs
(`uses_logs`) get its logs and spans aligned to its steps (`CaseLogs`). Faults whose label
names no operator (a configuration, a stall between operators) count as a joint hit when the step
is flagged (and, for horizontal faults, the rank is right).

Methods that explain their flagged steps (`Localization.explanations`, the root-cause model) are
also judged on their words, over the true-positive steps of fault cases: fault type right,
faithful (the text names exactly the operator and rank the method picked), grounded right (the
pick is the labelled operator and rank), ROUGE-L F against the label's reference sentence,
well-formed (the text parses under the sentence-plan grammar), agreement (its fault type, rank
and operator are the method's heads') and excess explained (the share of the step's excess its
named evidence accounts for, `teller.eval.metrics.agreement`).
Every other method's explanation figures stay None, so the scoreboard shows them as absent.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from tqdm import tqdm

from teller.callchain.facts import RunFacts
from teller.callchain.steps import StepTable
from teller.callchain.tree import CallTree
from teller.eval.cases import Case, CaseLogs, Split, iterate
from teller.eval.metrics import (
    Candidate,
    StepTruth,
    StepVerdict,
    accuracy_at_k,
    agreement,
    average_at_k,
    false_alarm_rate,
    joint_prf,
    names_exactly,
    rank_accuracy_at_1,
    rouge_l,
    step_prf,
)
from teller.faults import FAULT_FREE
from teller.labels import (
    CaseLabels,
    equivalent_operators,
    equivalent_ranks,
    rank_scored,
    scored_operator,
)
from teller.localize import Localization, StepExplanation

if TYPE_CHECKING:
    from teller.align.host import HostSteps


@dataclass
class ExplanationVerdict:
    """How one explanation of a true-positive step fares against its case's labels."""

    fault_right: bool  # predicted fault type == the labelled one
    faithful: bool  # names exactly the operator and rank the method picked, no other rank
    grounded_right: bool  # the pick is the labelled operator and rank (or the label names none)
    rouge_l: float  # F against the label's reference sentence
    well_formed: bool = False  # parses under the plan grammar (`teller.rca.plans`)
    agrees: bool = False  # well-formed, and its fault type, rank and operator are the method's
    excess_explained: float | None = None  # share of the step's excess its evidence accounts for


def judge_explanation(
    explanation: StepExplanation | None, labels: CaseLabels
) -> ExplanationVerdict:
    """A flagged step its method left unexplained counts as wrong on every figure: an explaining
    method that goes silent on a real fault must not score better than one that speaks."""
    if explanation is None:
        return ExplanationVerdict(False, False, False, 0.0)
    if scored_operator(labels) is None:
        grounded = not rank_scored(labels) or explanation.rank in equivalent_ranks(labels)
    else:
        grounded = explanation.operator in equivalent_operators(labels) and (
            labels.guilty_rank is None or explanation.rank in equivalent_ranks(labels)
        )
    said = agreement(explanation.text, explanation.fault, explanation.operator, explanation.rank)
    return ExplanationVerdict(
        fault_right=explanation.fault == labels.fault,
        faithful=names_exactly(explanation.text, explanation.operator, explanation.rank),
        grounded_right=grounded,
        rouge_l=rouge_l(explanation.text, labels.explanation),
        well_formed=said.well_formed,
        agrees=said.agrees,
        excess_explained=said.excess_explained,
    )


@dataclass
class CaseOutcome:
    """What one method said about one case, reduced to what the metrics need."""

    case_id: str
    fault: str
    view: str
    steps: list[int]
    flagged: list[int]
    top: dict[int, tuple[str | None, int | None]]  # iteration → (operator, rank) of its top-1
    ranked: list[
        tuple[str, int | None, float]
    ]  # case-level candidates over its true-positive steps
    truth_steps: list[int]
    guilty_operator: str | None
    guilty_rank: int | None
    guilty_ranks: frozenset[int] = frozenset()  # with the ranks its trace cannot tell from it
    guilty_operators: frozenset[str] = frozenset()  # with the names it goes by in other steps
    rank_scored: bool = False  # a finding must name the guilty rank (`teller.labels.rank_scored`)
    explains: bool = False  # the method explained its flagged steps in this case
    explained: list[ExplanationVerdict] = field(default_factory=list)  # its true-positive steps


@dataclass
class Row:
    """One line of the scoreboard."""

    method: str
    group: str
    cases: int
    step_precision: float | None  # None where the group has no anomalous step
    step_recall: float | None
    step_f1: float | None
    ac1: float | None  # None: no case of the group has an operator to find
    ac3: float | None
    avg5: float | None
    rank_ac1: float | None
    joint_precision: float | None
    joint_recall: float | None
    joint_f1: float | None
    false_alarm_rate: float | None
    # explanation figures: None for a method that does not explain (or with nothing to explain)
    explained_steps: int | None = None  # true-positive steps of fault cases judged
    fault_type_right: float | None = None
    faithful: float | None = None
    grounded_right: float | None = None
    rouge_l: float | None = None
    well_formed: float | None = None
    agreement: float | None = None  # text agrees with the heads: fault type, rank, operator
    excess_explained: float | None = None  # mean over the explanations that state a share


@dataclass
class EvalResult:
    split: Split
    rows: list[Row] = field(default_factory=list)
    outcomes: dict[str, list[CaseOutcome]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "split": self.split.to_json(),
            "rows": [asdict(r) for r in self.rows],
        }


def outcome(case: Case, localization: Localization, steps: StepTable) -> CaseOutcome:
    """How `localization` of `case` scores, its labels keyed to the tree's `steps`."""
    labels = case.labels.keyed_to(steps)
    operator = scored_operator(labels)  # the rank-wide lab faults score none
    flagged = [s.iteration for s in localization.steps if s.anomalous]
    truth = set(labels.steps) if labels.is_fault else set()
    top: dict[int, tuple[str | None, int | None]] = {}
    for iteration in flagged:
        candidates = localization.candidates.get(iteration, [])
        top[iteration] = (
            (candidates[0].operator, candidates[0].rank) if candidates else (None, None)
        )
    totals: dict[tuple[str, int | None], float] = {}
    for iteration in sorted(truth & set(flagged)):
        for candidate in localization.candidates.get(iteration, []):
            key = (candidate.operator, candidate.rank)
            totals[key] = totals.get(key, 0.0) + candidate.score
    ranked = sorted(
        ((op, rank, score) for (op, rank), score in totals.items()), key=lambda t: -t[2]
    )
    explains = bool(localization.explanations)
    explained = (
        [
            judge_explanation(localization.explanations.get(s), labels)
            for s in sorted(truth & set(flagged))
        ]
        if explains
        else []
    )
    return CaseOutcome(
        case_id=case.case_id,
        fault=labels.fault,
        view=labels.view,
        steps=[s.iteration for s in localization.steps],
        flagged=flagged,
        top=top,
        ranked=ranked,
        truth_steps=sorted(truth),
        guilty_operator=operator,
        guilty_rank=labels.guilty_rank,
        guilty_ranks=equivalent_ranks(labels),
        guilty_operators=equivalent_operators(labels) if operator else frozenset(),
        rank_scored=rank_scored(labels),
        explains=explains,
        explained=explained,
    )


def score_group(
    method: str, group: str, outcomes: list[CaseOutcome], explains: bool | None = None
) -> Row:
    """One scoreboard row. `explains` says whether the method explains its steps (by default:
    whether it did in any of these cases); the harness passes it per method, so a group where
    an explaining method found nothing shows 0 steps explained rather than no figures at all."""
    anomalous = {(o.case_id, s) for o in outcomes for s in o.truth_steps}
    flagged = {(o.case_id, s) for o in outcomes for s in o.flagged}
    steps = step_prf(anomalous, flagged)
    located = [o for o in outcomes if o.guilty_operator and set(o.truth_steps) & set(o.flagged)]
    ranked = [[Candidate(op, score, rank) for op, rank, score in o.ranked] for o in located]
    guilty = [o.guilty_operators or o.guilty_operator or "" for o in located]
    horizontal = [o for o in located if o.view == "H" and o.guilty_rank is not None]
    truths, verdicts = [], []
    for o in outcomes:
        truth_set = set(o.truth_steps)
        # a labelled step the method never reported (a hang's unfinished step) is still missed
        for s in sorted(set(o.steps) | truth_set):
            truths.append(
                StepTruth(
                    (o.case_id, s),
                    s in truth_set,
                    o.guilty_operator,
                    o.guilty_rank,
                    horizontal=o.view == "H",
                    rank_scored=o.rank_scored,
                    equivalent_ranks=o.guilty_ranks,
                    equivalent_operators=o.guilty_operators,
                )
            )
            operator, rank = o.top.get(s, (None, None))
            verdict_op = operator if o.guilty_operator else None  # op-less faults: the step counts
            verdicts.append(StepVerdict((o.case_id, s), s in set(o.flagged), verdict_op, rank))
    joint = joint_prf(truths, verdicts)
    fault_free = [o for o in outcomes if o.fault in FAULT_FREE]
    alarms = [StepVerdict((o.case_id, s), s in set(o.flagged)) for o in fault_free for s in o.steps]
    has_positives = (
        steps.positives > 0
    )  # fault-free groups: only the false-alarm rate means anything

    def shown(value: float) -> float | None:
        return round(value, 4) if has_positives else None

    return Row(
        method=method,
        group=group,
        cases=len(outcomes),
        step_precision=shown(steps.precision),
        step_recall=shown(steps.recall),
        step_f1=shown(steps.f1),
        ac1=round(accuracy_at_k(ranked, guilty, 1), 4) if located else None,
        ac3=round(accuracy_at_k(ranked, guilty, 3), 4) if located else None,
        avg5=round(average_at_k(ranked, guilty, 5), 4) if located else None,
        rank_ac1=round(
            rank_accuracy_at_1(
                [[Candidate(op, score, rank) for op, rank, score in o.ranked] for o in horizontal],
                [o.guilty_ranks or {o.guilty_rank} for o in horizontal],
            ),
            4,
        )
        if horizontal
        else None,
        joint_precision=shown(joint.precision),
        joint_recall=shown(joint.recall),
        joint_f1=shown(joint.f1),
        false_alarm_rate=round(false_alarm_rate(alarms), 4) if alarms else None,
        **_explanation_figures(outcomes, explains),
    )


def _explanation_figures(
    outcomes: list[CaseOutcome], explains: bool | None
) -> dict[str, float | int | None]:
    """The explanation fields of a Row: means over the group's judged explanations (none for a
    group without a labelled anomalous step, where there is nothing to explain)."""
    if explains is None:
        explains = any(o.explains for o in outcomes)
    if not explains or not any(o.truth_steps for o in outcomes):
        return {}
    verdicts = [v for o in outcomes for v in o.explained]

    def mean(values: Sequence[float]) -> float | None:
        return round(sum(values) / len(values), 4) if values else None

    return {
        "explained_steps": len(verdicts),
        "fault_type_right": mean([v.fault_right for v in verdicts]),
        "faithful": mean([v.faithful for v in verdicts]),
        "grounded_right": mean([v.grounded_right for v in verdicts]),
        "rouge_l": mean([v.rouge_l for v in verdicts]),
        "well_formed": mean([v.well_formed for v in verdicts]),
        "agreement": mean([v.agrees for v in verdicts]),
        "excess_explained": mean(
            [v.excess_explained for v in verdicts if v.excess_explained is not None]
        ),
    }


def uses_logs(method: object) -> bool:
    """Whether a method reads the cases' logs (class attribute `uses_logs = True`): it is then
    fitted with `fit(normal_trees, normal_logs=...)` and scored with `score(tree, logs=...)`."""
    return bool(getattr(method, "uses_logs", False))


def _fit(method: object, trees: list[CallTree], logs: list[CaseLogs]) -> object:
    if uses_logs(method):
        return method.fit(trees, normal_logs=logs)  # type: ignore[attr-defined]
    return method.fit(trees)  # type: ignore[attr-defined]


def _score_takes(method: object, parameter: str) -> bool:
    score = getattr(method, "score", None)
    return score is not None and parameter in inspect.signature(score).parameters


def takes_facts(method: object) -> bool:
    """Whether a method's `score` takes the run's shared `RunFacts` (a `facts` parameter)."""
    return _score_takes(method, "facts")


def takes_host(method: object) -> bool:
    """Whether a method's `score` takes the case's host counters (a `host` parameter): the
    explaining methods, whose verdict types a host slowdown by them as `teller analyze` does."""
    return _score_takes(method, "host")


def _score(
    method: object,
    tree: CallTree,
    logs: CaseLogs | None,
    facts: RunFacts,
    host: HostSteps | None = None,
) -> Localization:
    shared: dict[str, object] = {"facts": facts} if takes_facts(method) else {}
    if uses_logs(method):
        shared["logs"] = logs
    if takes_host(method):
        shared["host"] = host
    return method.score(tree, **shared)  # type: ignore[attr-defined]


def evaluate(
    methods: dict[str, Callable[[], object]],
    cases: list[Case],
    split: Split,
    progress: bool = True,
) -> EvalResult:
    """Fit every method on the training side's fault-free cases, score the test side.

    Each case's tree is read and its `RunFacts` computed once for all methods; its logs are
    aligned, and its host counters read, once and only when some method reads them.
    """
    estimators = {name: make() for name, make in methods.items()}
    with_logs = any(uses_logs(m) for m in estimators.values())
    with_host = any(takes_host(m) for m in estimators.values())
    normal_train = [c for c in iterate(cases, split.train) if c.labels.fault == "none"]
    trees, normal_logs = [], []
    for case in tqdm(
        normal_train, desc="fitting on normal cases", disable=not progress, leave=False
    ):
        trees.append(case.tree())
        if with_logs:
            normal_logs.append(case.logs(trees[-1]))
    fitted = {name: _fit(m, trees, normal_logs) for name, m in estimators.items()}
    del trees, normal_logs
    result = EvalResult(split=split, outcomes={name: [] for name in methods})
    test_cases = list(iterate(cases, split.test))
    for case in tqdm(test_cases, desc="scoring cases", disable=not progress, leave=False):
        tree = case.tree()
        facts = RunFacts(tree)
        logs = case.logs(tree) if with_logs else None
        host = case.host(tree) if with_host else None
        for name, method in fitted.items():
            result.outcomes[name].append(
                outcome(case, _score(method, tree, logs, facts, host), tree.steps)
            )
    for name, outcomes in result.outcomes.items():
        groups: list[tuple[str, list[CaseOutcome]]] = [("overall", outcomes)]
        for view, label in (("H", "horizontal"), ("V", "vertical")):
            members = [o for o in outcomes if o.view == view or o.fault in FAULT_FREE]
            if any(o.view == view for o in outcomes):
                groups.append((label, members))
        if split.held_out_fault:
            held = [o for o in outcomes if o.fault == split.held_out_fault]
            if held:
                groups.append((f"held out: {split.held_out_fault}", held))
        for fault in sorted({o.fault for o in outcomes}):
            groups.append((f"fault: {fault}", [o for o in outcomes if o.fault == fault]))
        explains = any(o.explains for o in outcomes)
        result.rows.extend(score_group(name, g, members, explains) for g, members in groups)
    return result
