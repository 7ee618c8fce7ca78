"""The training labels of a case's step records, from its `labels.json`.

A record of a labelled step learns three things: that the step is anomalous, which of its
candidates is the guilty node (`target`, the pointer's answer), and the mechanism its
explanation states (`mechanism`, the explanation head's answer): the labelled fault type's first
mechanism that the step's measured facts, read for the guilty candidate, allow
(`teller.rca.explain.default_mechanism`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from teller.labels import (
    CaseLabels,
    equivalent_operators,
    equivalent_ranks,
    rank_scored,
    scored_operator,
)
from teller.localize import OperatorCandidate, StepScore
from teller.rca.context import RunContext
from teller.rca.explain import default_mechanism


@dataclass(frozen=True)
class StepLabels:
    """One step's training labels (a normal step's by default)."""

    anomalous: bool = False
    fault: str = "none"
    target: int = -1  # index into the step's candidates of the guilty one, -1 unknown/none
    mechanism: str | None = None  # `teller.rca.plans.MECHANISMS`, None on a normal step


def step_labels(
    score: StepScore,
    candidates: Sequence[OperatorCandidate],
    labels: CaseLabels,
    context: RunContext,
) -> StepLabels:
    """Anomalous where `labels` names the step (in a fault case), with the fault, the guilty
    candidate and the mechanism; normal otherwise."""
    if not labels.is_fault or score.iteration not in labels.steps:
        return StepLabels()
    target = guilty_candidate(candidates, labels)
    guilty = candidates[target] if target >= 0 else None
    step = context.context(score, guilty, candidates, rank=labels.guilty_rank)
    return StepLabels(True, labels.fault, target, default_mechanism(step, labels.fault))


def guilty_candidate(candidates: Sequence[OperatorCandidate], labels: CaseLabels) -> int:
    """The candidate the labels blame: same operator and rank, else same operator on a rank
    scoring takes for it (`equivalent_ranks`: a node's network fault shows alike on every rank
    of the rings it touches), else (where scoring does not ask for the rank) same operator,
    else (for faults whose operator is not scored) the first, i.e. highest-ranked, candidate on
    the guilty rank or one of its equivalents; -1 for none.

    The operator is the one scoring asks for (`scored_operator`): a CPU quota or a co-tenant on the
    lab's host slows whichever operator runs, so teaching the pointer the label's `aten::mm` taught
    it to lead with a matmul that barely slowed, or with the peer's matmul where the guilty rank's
    was not a candidate."""
    op, rank = scored_operator(labels), labels.guilty_rank
    names = equivalent_operators(labels) if op else frozenset()  # a busy host: either launch call
    ranks = equivalent_ranks(labels)
    rules = []
    if op is not None:
        rules += [
            lambda c: c.operator in names and c.rank == rank,
            lambda c: c.operator in names and c.rank in ranks,
        ]
        if not rank_scored(labels):  # a peer's candidate would teach a rank scoring calls wrong
            rules.append(lambda c: c.operator in names)
    elif rank is not None:
        rules += [lambda c: c.rank == rank, lambda c: c.rank in ranks]
    for rule in rules:
        for i, candidate in enumerate(candidates):
            if rule(candidate):
                return i
    return -1
