"""The training labels of a case's step records, from its `labels.json`.

A record of a labelled step learns three things: that the step is anomalous, which of its
candidates is the guilty node (`target`, the pointer's answer), and the reference explanation
with its operator, rank and times as slots (`words`, the decoder's answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from teller.labels import CaseLabels, equivalent_operators
from teller.localize import OperatorCandidate
from teller.rca.words import target_words


@dataclass(frozen=True)
class StepLabels:
    """One step's training labels (a normal step's by default)."""

    anomalous: bool = False
    fault: str = "none"
    target: int = -1  # index into the step's candidates of the guilty one, -1 unknown/none
    words: list[str] = field(default_factory=list)  # the reference explanation, slotted


def step_labels(
    iteration: int, candidates: Sequence[OperatorCandidate], labels: CaseLabels
) -> StepLabels:
    """Anomalous where `labels` names the step (in a fault case), with the fault, the guilty
    candidate and the slotted explanation; normal otherwise."""
    if not labels.is_fault or iteration not in labels.steps:
        return StepLabels()
    target = guilty_candidate(candidates, labels)
    words = target_words(
        labels.explanation, labels.guilty_operator, labels.guilty_rank, has_node=target >= 0
    )
    return StepLabels(True, labels.fault, target, words)


def guilty_candidate(candidates: Sequence[OperatorCandidate], labels: CaseLabels) -> int:
    """The candidate the labels blame: same operator and rank, else same operator, else (for
    faults without an operator) the first candidate on the guilty rank; -1 for none."""
    op, rank = labels.guilty_operator, labels.guilty_rank
    names = equivalent_operators(labels)  # a launch delayed by a busy host: either launch call
    rules = []
    if op is not None:
        rules += [lambda c: c.operator in names and c.rank == rank, lambda c: c.operator in names]
    elif rank is not None:
        rules.append(lambda c: c.rank == rank)
    for rule in rules:
        for i, candidate in enumerate(candidates):
            if rule(candidate):
                return i
    return -1
