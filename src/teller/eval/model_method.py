"""The shipped root-cause model as a scoreboard method, shaped like every other method.

`fit(normal_trees)` then `score(tree, logs=...) -> Localization`, so the harness scores the model
and the baselines alike (DESIGN.md §5).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from teller.callchain.facts import RunFacts
from teller.callchain.tree import CallTree
from teller.eval.cases import CaseLogs
from teller.localize import (
    Localization,
    NumericLocalizer,
    OperatorCandidate,
    StepExplanation,
    StepScore,
    unfinished_step,
)
from teller.rca.context import RunContext
from teller.rca.dataset import StepRecord, case_records
from teller.rca.diagnose import model_explanations
from teller.rca.explain import compose
from teller.rca.host import held_off_share
from teller.rca.infer import LoadedModel, ModelOutputs

if TYPE_CHECKING:
    from teller.align.align import AlignResult
    from teller.align.host import HostSteps


class RootCauseMethod:
    """The model as a scoreboard method: `fit(normal_trees)` then `score(tree) -> Localization`.

    The model is trained offline (`teller train`), so `fit` learns nothing. It reads logs
    (`uses_logs`): the harness passes each case's logs and spans as it aligned them once, and
    the model builds its step records from that alignment, as `teller analyze` does (the no-logs
    variant masks them). With the case's `RunFacts` shared by the harness, the records' trace
    side is computed once per case for every model variant."""

    uses_logs = True

    def __init__(
        self,
        model_dir: str | Path | None = None,
        pool_faults: bool = True,
        threshold: float | None = None,
        shared: SharedForward | None = None,
    ) -> None:
        self.model_dir = model_dir
        self.pool_faults = pool_faults
        self.threshold = threshold  # None: the checkpoint's step threshold
        self.shared = shared

    def fit(
        self, normal_trees: list[CallTree], normal_logs: Sequence[CaseLogs] = ()
    ) -> RootCauseMethod:
        if self.shared is not None:
            self.model_ = self.shared.model(self.model_dir)
        else:
            self.model_ = LoadedModel.load(self.model_dir)
        return self

    def score(
        self,
        tree: CallTree,
        logs: CaseLogs | None = None,
        facts: RunFacts | None = None,
        host: HostSteps | None = None,
    ) -> Localization:
        """Every step's probability and, for flagged steps, the pointer's ranked candidates and
        the explanation with the node it names (`Localization.explanations`); `facts`: the
        tree's `RunFacts` where the caller has them; `host`: the case's host counters, which
        flag the slow steps they show a rank held off a CPU in and type a host slowdown, as in
        `teller analyze`."""
        alignment = logs.aligned if logs is not None else None
        facts = RunFacts.of(tree, facts)
        if self.shared is not None:
            records, outputs, localization = self.shared.of(tree, alignment, facts, self.model_)
        else:
            records = case_records(tree, "", None, alignment, facts)
            outputs, localization = None, NumericLocalizer().score(tree, facts)
        diagnoses = self.model_.diagnose_records(
            records,
            pool_faults=self.pool_faults,
            threshold=self.threshold,
            outputs=outputs,
            held_share=held_off_share(tree, host) if host is not None else None,
        )
        named = model_explanations(
            tree,
            localization,
            diagnoses,
            facts,
            alignment is not None,
            host,
            alignment.held_back if alignment is not None else None,
            alignment.preempted if alignment is not None else None,
        )
        steps, candidates, explanations = [], {}, {}
        for d in diagnoses:
            steps.append(
                StepScore(d.iteration, "", d.dur_ns, d.expected_ns, d.probability, d.anomalous)
            )
            if d.anomalous:
                # the node the verdict names leads, with the words it was written from, so the
                # scoreboard checks both
                ranked, explanations[d.iteration] = named[d.iteration]
                candidates[d.iteration] = [
                    OperatorCandidate(
                        c.iteration,
                        c.rank,
                        c.operator,
                        0.0 if p is None else p,
                        c.observed_ns,
                        c.normal_ns,
                        c.z,
                        c.node,
                        c.reference,
                        c.kind,
                    )
                    for c, p in ranked
                ]
        hang = unfinished_step(
            tree, facts
        )  # a step no record holds: the localizer's finding stands
        if hang is not None:
            step, candidate = hang
            steps.append(step)
            candidates[step.iteration] = [candidate]
            hung = RunContext(tree, facts, (), alignment is not None).context(step, candidate)
            explanations[step.iteration] = StepExplanation(
                fault="collective_hang",
                text=compose(hung, "collective_hang").text,
                operator=candidate.operator,
                rank=candidate.rank,
            )
        return Localization(steps=steps, candidates=candidates, explanations=explanations)


class SharedForward:
    """One model's forward pass and the localizer's candidates over the case being scored,
    shared by several `RootCauseMethod`s that differ only in their thresholds (a calibration's
    grid): the harness scores every method on a case before the next, so the last case's is all
    that is kept."""

    def __init__(self) -> None:
        self._models: dict[str, LoadedModel] = {}
        self._tree: CallTree | None = None
        self._model: LoadedModel | None = None
        self._kept: tuple[list[StepRecord], ModelOutputs | None, Localization] | None = None

    def model(self, model_dir: str | Path | None) -> LoadedModel:
        key = str(model_dir)
        if key not in self._models:
            self._models[key] = LoadedModel.load(model_dir)
        return self._models[key]

    def of(
        self, tree: CallTree, alignment: AlignResult | None, facts: RunFacts, model: LoadedModel
    ) -> tuple[list[StepRecord], ModelOutputs | None, Localization]:
        """The case's step records, the model's outputs on them and the localizer's candidates,
        computed on the first call for `tree` and `model`."""
        if self._tree is not tree or self._model is not model or self._kept is None:
            records = case_records(tree, "", None, alignment, facts)
            outputs = model.forward(records) if records else None
            self._tree, self._model = tree, model
            self._kept = (records, outputs, NumericLocalizer().score(tree, facts))
        return self._kept
