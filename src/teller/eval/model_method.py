"""The shipped root-cause model as a scoreboard method, shaped like every other method.

`fit(normal_trees)` then `score(tree, logs=...) -> Localization`, so the harness scores the model
and the baselines alike (DESIGN.md §5).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from teller.callchain.tree import CallTree
from teller.eval.cases import CaseLogs
from teller.localize import (
    Localization,
    OperatorCandidate,
    StepExplanation,
    StepScore,
    hang_explanation,
    unfinished_step,
)
from teller.rca.dataset import StepRecord, case_records
from teller.rca.infer import LoadedModel


class _LastRecords:
    """The step records of the last tree (and log files) scored, shared by the model variants the
    harness runs on one tree after another (reading candidates is most of a variant's cost, and
    the records do not depend on the model). Held by weak reference: it never keeps a tree alive."""

    tree: ClassVar[weakref.ref | None] = None
    log_paths: ClassVar[tuple[Path, ...]] = ()
    records: ClassVar[list[StepRecord]] = []

    @classmethod
    def of(cls, tree: CallTree, log_paths: Sequence[Path] = ()) -> list[StepRecord]:
        if cls.tree is None or cls.tree() is not tree or cls.log_paths != tuple(log_paths):
            cls.records = case_records(tree, "", None, list(log_paths))
            cls.tree = weakref.ref(tree)
            cls.log_paths = tuple(log_paths)
        return cls.records


class RootCauseMethod:
    """The model as a scoreboard method: `fit(normal_trees)` then `score(tree) -> Localization`.

    The model is trained offline (`teller train`), so `fit` learns nothing. It reads logs
    (`uses_logs`): the harness passes each case's logs and the model aligns their files into its
    step records, as `teller diagnose` does (the no-logs variant masks them)."""

    uses_logs = True

    def __init__(self, model_dir: str | Path | None = None, pool_faults: bool = True) -> None:
        self.model_dir = model_dir
        self.pool_faults = pool_faults

    def fit(
        self, normal_trees: list[CallTree], normal_logs: Sequence[CaseLogs] = ()
    ) -> RootCauseMethod:
        self.model_ = LoadedModel.load(self.model_dir)
        return self

    def score(self, tree: CallTree, logs: CaseLogs | None = None) -> Localization:
        """Every step's probability and, for flagged steps, the pointer's ranked candidates and
        the explanation with the node it names (`Localization.explanations`)."""
        records = _LastRecords.of(tree, logs.paths if logs is not None else ())
        steps, candidates, explanations = [], {}, {}
        for d in self.model_.diagnose_records(records, pool_faults=self.pool_faults):
            steps.append(
                StepScore(d.iteration, "", d.dur_ns, d.expected_ns, d.probability, d.anomalous)
            )
            if d.anomalous:
                # the words and the node they were written from, so the scoreboard can check both
                explanations[d.iteration] = StepExplanation(
                    d.fault,
                    d.explanation,
                    d.facts.operator if d.facts else None,
                    d.facts.rank if d.facts else None,
                )
                candidates[d.iteration] = [
                    OperatorCandidate(
                        c.iteration,
                        c.rank,
                        c.operator,
                        p,
                        c.observed_ns,
                        c.normal_ns,
                        c.z,
                        c.node,
                        c.reference,
                        c.kind,
                    )
                    for c, p in d.candidates
                ]
        hang = unfinished_step(tree)  # a step no record holds: the localizer's finding stands
        if hang is not None:
            step, candidate = hang
            steps.append(step)
            candidates[step.iteration] = [candidate]
            explanations[step.iteration] = StepExplanation(
                fault="collective_hang",
                text=hang_explanation(step, candidate),
                operator=candidate.operator,
                rank=candidate.rank,
            )
        return Localization(steps=steps, candidates=candidates, explanations=explanations)
