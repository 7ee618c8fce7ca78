"""Baselines, shaped like the localizer (`fit(normal_trees)`, `score(tree) -> Localization`).

They are what a person or a simpler system would do, run on the same cases so the scoreboard
compares methods, not data:

* `FixedThreshold`: a step slower than 1.5× the median step of its kind is anomalous.
* `StepZScore`: robust z-score of step time within its kind, no batch-composition model.
* `GaussianMixtureBaseline`: a Gaussian mixture over step features (wall time, per-rank GPU and
  host work, collective time), fitted on normal steps; low likelihood is anomalous — the numeric
  stage of the prior system (Truffld).

Without a localizer of their own, each names as suspect the operator with the most self time on
the slowest rank of the step, which is what one reads off a profiler's top-ops table.
"""

from __future__ import annotations

import numpy as np

from teller.callchain.facts import Iterations, RunFacts
from teller.callchain.tree import CallTree
from teller.ingest.schema import GPU_WORK_CODES, HOST_WORK_CODES
from teller.localize import Localization, OperatorCandidate, StepScore, robust_z

TOP_OPS = 10


def top_self_time_candidates(
    tree: CallTree,
    iteration: int,
    count: int = TOP_OPS,
    rank: int | None = None,
    facts: RunFacts | None = None,
) -> list[OperatorCandidate]:
    """The operators with the most self time in the step on `rank`, or on the step's slowest rank
    when none is given (a profiler's top-ops table); `facts`: the tree's, where the caller has
    them."""
    steps = tree.steps
    rows = [
        k
        for k in range(len(steps))
        if steps.index[k] == iteration and (rank is None or steps.rank[k] == rank)
    ]
    if not rows:
        return []
    slowest = max(rows, key=lambda k: steps.dur_ns[k])
    waiting = RunFacts.of(tree, facts).waiting
    work = (tree.step == slowest) & np.isin(tree.layer, list(GPU_WORK_CODES | HOST_WORK_CODES))
    work &= ~np.isin(tree.name, list(waiting))
    members = np.flatnonzero(work)
    totals = np.bincount(
        tree.name[members], weights=tree.self_ns[members], minlength=len(tree.names)
    )
    best = np.argsort(-totals)[:count]
    where = "slowest rank" if rank is None else "rank a log line names"
    rank = int(steps.rank[slowest])
    return [
        OperatorCandidate(
            iteration=iteration,
            rank=rank,
            operator=tree.names[name],
            score=float(totals[name]),
            observed_ns=int(totals[name]),
            normal_ns=0,
            z=0.0,
            node=int(members[tree.name[members] == name][0]),
            reference=f"largest self time on the {where}",
            kind="compute",
        )
        for name in best.tolist()
        if totals[name] > 0
    ]


def _localization(
    facts: RunFacts, flags: np.ndarray, scores: np.ndarray, expected: np.ndarray
) -> Localization:
    iterations = facts.iterations
    steps = [
        StepScore(
            iteration=int(iterations.iteration[i]),
            kind=str(iterations.kind[i]),
            dur_ns=int(iterations.dur_ns[i]),
            expected_ns=int(expected[i]),
            z=float(scores[i]),
            anomalous=bool(flags[i]),
            ranks=list(iterations.ranks[i]),
        )
        for i in range(len(iterations))
    ]
    candidates = {
        s.iteration: top_self_time_candidates(facts.tree, s.iteration, facts=facts)
        for s in steps
        if s.anomalous
    }
    return Localization(steps=steps, candidates=candidates)


def _kind_medians(iterations: Iterations) -> np.ndarray:
    """Per iteration, the median step time of its kind: what the step-time baselines expect."""
    median = np.zeros(len(iterations))
    for kind in set(iterations.kind.tolist()):
        same = iterations.kind == kind
        median[same] = np.median(iterations.dur_ns[same])
    return median


class FixedThreshold:
    """Step time above `ratio` × the median step of its kind."""

    def __init__(self, ratio: float = 1.5) -> None:
        self.ratio = ratio

    def fit(self, normal_trees: list[CallTree]) -> FixedThreshold:
        return self

    def score(self, tree: CallTree, facts: RunFacts | None = None) -> Localization:
        facts = RunFacts.of(tree, facts)
        median = _kind_medians(facts.iterations)
        ratio = facts.iterations.dur_ns / np.maximum(median, 1.0)
        return _localization(facts, ratio > self.ratio, ratio, median)


class StepZScore:
    """Robust z of step time within its kind (median/MAD), no composition model."""

    def __init__(self, threshold: float = 3.5) -> None:
        self.threshold = threshold

    def fit(self, normal_trees: list[CallTree]) -> StepZScore:
        return self

    def score(self, tree: CallTree, facts: RunFacts | None = None) -> Localization:
        facts = RunFacts.of(tree, facts)
        kinds, dur = facts.iterations.kind, facts.iterations.dur_ns
        z = np.zeros(len(dur))
        for kind in set(kinds.tolist()):
            same = kinds == kind
            # the spread floored at 1% of the median step and at 1 ns (identical steps)
            z[same] = robust_z(dur[same], dur[same], floor=1.0, share_of_median=0.01)
        return _localization(facts, z > self.threshold, z, _kind_medians(facts.iterations))


def step_feature_matrix(tree: CallTree, facts: RunFacts | None = None) -> np.ndarray:
    """Per iteration: log wall time, and the max over ranks of log GPU work, host work (the calls
    that mostly wait included), comm time."""
    facts = RunFacts.of(tree, facts)
    steps = tree.steps
    per_step = [facts.work.gpu_ns, facts.work.host_ns, facts.work.comm_ns]
    iterations = facts.iterations
    position = {int(it): i for i, it in enumerate(iterations.iteration.tolist())}
    features = np.zeros((len(iterations), 1 + len(per_step)))
    for i in range(len(iterations)):
        features[i, 0] = np.log1p(iterations.dur_ns[i])
    for k in range(len(steps)):
        i = position[int(steps.index[k])]
        for j, measure in enumerate(per_step):
            features[i, 1 + j] = max(features[i, 1 + j], np.log1p(measure[k]))
    return features


class GaussianMixtureBaseline:
    """Gaussian mixture over step features fitted on normal steps; low likelihood is anomalous."""

    def __init__(self, components: int = 3, quantile: float = 0.005, seed: int = 0) -> None:
        self.components = components
        self.quantile = quantile
        self.seed = seed

    def fit(self, normal_trees: list[CallTree]) -> GaussianMixtureBaseline:
        from sklearn.mixture import GaussianMixture

        features = [step_feature_matrix(tree) for tree in normal_trees]
        self.fitted_ = bool(features) and sum(len(f) for f in features) >= 4 * self.components
        if self.fitted_:
            data = np.vstack(features)
            self.model_ = GaussianMixture(
                n_components=self.components,
                covariance_type="full",
                random_state=self.seed,
                reg_covar=1e-3,
            ).fit(data)
            self.cutoff_ = float(np.quantile(self.model_.score_samples(data), self.quantile))
        return self

    def score(self, tree: CallTree, facts: RunFacts | None = None) -> Localization:
        from sklearn.mixture import GaussianMixture

        facts = RunFacts.of(tree, facts)
        features = step_feature_matrix(tree, facts)
        if getattr(self, "fitted_", False):
            model, cutoff = self.model_, self.cutoff_
        else:  # no normal data: the case's own steps are the reference
            components = max(1, min(self.components, len(features) // 4))
            model = GaussianMixture(
                n_components=components,
                covariance_type="full",
                random_state=self.seed,
                reg_covar=1e-3,
            ).fit(features)
            cutoff = float(np.quantile(model.score_samples(features), 0.1))
        likelihood = model.score_samples(features)
        flags = likelihood < cutoff
        expected = np.expm1(model.means_[model.predict(features), 0])
        return _localization(facts, flags, cutoff - likelihood, expected)
