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

from teller.callchain.tree import CallTree
from teller.localize.localizer import (
    _GPU_WORK,
    _HOST_WORK,
    _WAITING_CALL,
    Localization,
    OperatorCandidate,
    StepScore,
    _iteration_rows,
)

TOP_OPS = 10


def top_self_time_candidates(
    tree: CallTree, iteration: int, count: int = TOP_OPS, rank: int | None = None
) -> list[OperatorCandidate]:
    """The operators with the most self time in the step on `rank`, or on the step's slowest rank
    when none is given (a profiler's top-ops table)."""
    steps = tree.steps
    rows = [
        k
        for k in range(len(steps))
        if steps.index[k] == iteration and (rank is None or steps.rank[k] == rank)
    ]
    if not rows:
        return []
    slowest = max(rows, key=lambda k: steps.dur_ns[k])
    waiting = [i for i, name in enumerate(tree.names) if _WAITING_CALL.search(name)]
    work = (tree.step == slowest) & np.isin(tree.layer, list(_GPU_WORK | _HOST_WORK))
    work &= ~np.isin(tree.name, waiting)
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
    tree: CallTree, flags: np.ndarray, scores: np.ndarray, expected: np.ndarray
) -> Localization:
    rows = _iteration_rows(tree, with_iteration=True)
    steps = [
        StepScore(
            iteration=row[4],
            kind=str(row[0]),
            dur_ns=int(row[1]),
            expected_ns=int(expected[i]),
            z=float(scores[i]),
            anomalous=bool(flags[i]),
            ranks=row[5],
        )
        for i, row in enumerate(rows)
    ]
    candidates = {
        s.iteration: top_self_time_candidates(tree, s.iteration) for s in steps if s.anomalous
    }
    return Localization(steps=steps, candidates=candidates)


class FixedThreshold:
    """Step time above `ratio` × the median step of its kind."""

    def __init__(self, ratio: float = 1.5) -> None:
        self.ratio = ratio

    def fit(self, normal_trees: list[CallTree]) -> FixedThreshold:
        return self

    def score(self, tree: CallTree) -> Localization:
        rows = _iteration_rows(tree, with_iteration=True)
        kinds = np.array([r[0] for r in rows], dtype=object)
        dur = np.array([r[1] for r in rows], dtype=float)
        median = np.zeros(len(rows))
        for kind in set(kinds.tolist()):
            median[kinds == kind] = np.median(dur[kinds == kind])
        ratio = dur / np.maximum(median, 1.0)
        return _localization(tree, ratio > self.ratio, ratio, median)


class StepZScore:
    """Robust z of step time within its kind (median/MAD), no composition model."""

    def __init__(self, threshold: float = 3.5) -> None:
        self.threshold = threshold

    def fit(self, normal_trees: list[CallTree]) -> StepZScore:
        return self

    def score(self, tree: CallTree) -> Localization:
        rows = _iteration_rows(tree, with_iteration=True)
        kinds = np.array([r[0] for r in rows], dtype=object)
        dur = np.array([r[1] for r in rows], dtype=float)
        z = np.zeros(len(rows))
        median = np.zeros(len(rows))
        for kind in set(kinds.tolist()):
            mask = kinds == kind
            centre = np.median(dur[mask])
            spread = 1.4826 * np.median(np.abs(dur[mask] - centre))
            z[mask] = (dur[mask] - centre) / max(spread, 0.01 * centre, 1.0)
            median[mask] = centre
        return _localization(tree, z > self.threshold, z, median)


def step_feature_matrix(tree: CallTree) -> np.ndarray:
    """Per iteration: log wall time, and the max over ranks of log GPU work, host work, comm time."""
    rows = _iteration_rows(tree, with_iteration=True)
    steps = tree.steps
    count = len(steps)
    in_step = tree.step >= 0
    comm_layer = _layer_code("comm")
    masks = [
        in_step & np.isin(tree.layer, list(_GPU_WORK)) & (tree.stream >= 0),
        in_step & np.isin(tree.layer, list(_HOST_WORK)) & (tree.stream < 0),
        in_step & (tree.layer == comm_layer),
    ]
    per_step = [
        np.bincount(
            tree.step[m], weights=(tree.dur if k != 1 else tree.self_ns)[m], minlength=count
        )
        for k, m in enumerate(masks)
    ]
    position = {row[4]: i for i, row in enumerate(rows)}
    features = np.zeros((len(rows), 1 + len(per_step)))
    for i, row in enumerate(rows):
        features[i, 0] = np.log1p(row[1])
    for k in range(count):
        i = position[int(steps.index[k])]
        for j, measure in enumerate(per_step):
            features[i, 1 + j] = max(features[i, 1 + j], np.log1p(measure[k]))
    return features


def _layer_code(name: str) -> int:
    from teller.ingest.schema import LAYER_CODE

    return LAYER_CODE[name]


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

    def score(self, tree: CallTree) -> Localization:
        from sklearn.mixture import GaussianMixture

        features = step_feature_matrix(tree)
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
        return _localization(tree, flags, cutoff - likelihood, expected)
