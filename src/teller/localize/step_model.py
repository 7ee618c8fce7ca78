"""Which steps are slow: a step's time against what its batch composition predicts.

Per step kind, a robust linear model ``dur ≈ a + b·context_tokens + c·generation_tokens`` is
fitted on the normal runs of the same setup, or on the case's own quieter steps when there are
none, so a longer prefill for a longer prompt is not an anomaly; a batch composition that recurs
through the run at a cost of its own, off that line, is expected at that cost (`compositions`).
A step's score is the robust z of ``log(dur / expected)``. A slowdown on one rank can hide in a
step's slack (the others wait less at the collective), so each rank's own work is scored too
(`component_scores`), against its peers and against its own nearest steps.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from teller.callchain.facts import Iterations, RunFacts, Setup
from teller.localize.compositions import composition_costs
from teller.localize.features import median_mad
from teller.localize.results import StepScore

#: Smallest log-ratio scale for step scores: 3% run-to-run noise is normal even on a quiet machine.
MIN_LOG_SCALE = 0.03
#: Log-ratio scale floor for per-rank components (they are noisier than whole steps).
MIN_COMPONENT_SCALE = 0.05
#: A case whose steps run this much slower or faster than the normal runs predict was recorded on
#: another setup (model, engine, hardware): its own quieter steps are the reference instead.
SAME_SETUP_SPEED = (0.67, 1.5)
#: Share of operator and kernel names a normal run must have in common with a case to count as
#: the same setup (Jaccard), besides the same number of ranks.
SAME_SETUP_NAMES = 0.7
#: Share of the normal runs' steps a step model keeps (the trimmed fit drops the rest).
NORMAL_FIT_KEEP = 0.95

#: A normal run as the step models need it: its setup fingerprint and its iterations.
NormalRun = tuple[Setup, Iterations]


@dataclass
class StepModel:
    coef: np.ndarray  # a, b (per context token), c (per generation token)
    log_scale: float


def design(ctx_tokens: np.ndarray, gen_tokens: np.ndarray) -> np.ndarray:
    """The model's design matrix: a constant, then the context and generation tokens (≥ 0)."""
    return np.column_stack(
        [np.ones(len(ctx_tokens)), np.maximum(ctx_tokens, 0), np.maximum(gen_tokens, 0)]
    ).astype(float)


def fit_step_model(
    dur_ns: np.ndarray, ctx_tokens: np.ndarray, gen_tokens: np.ndarray, keep: float
) -> StepModel:
    """Least squares, then refit on the `keep` fraction with the smallest residuals (trimmed).

    A token count that does not vary among the kept steps is left out of the fit rather than
    the fit given up: a decode-only kind has no context tokens and a prefill-only kind no
    generation tokens, and their time still grows with the one count that does vary."""
    x = design(ctx_tokens, gen_tokens)
    y = dur_ns.astype(float)
    usable = np.ones(len(y), dtype=bool)
    coef = np.array([np.median(y), 0.0, 0.0])
    for _ in range(3):
        kept = x[usable]
        # the constant, and each token count that varies among the kept steps
        varying = np.ones(x.shape[1], dtype=bool)
        if len(kept):
            varying[1:] = np.ptp(kept[:, 1:], axis=0) > 0
        if (
            len(kept) >= 4
            and varying.sum() > 1
            and np.linalg.matrix_rank(kept[:, varying]) == varying.sum()
        ):
            # non-negative: more tokens never make a step faster, and a negative coefficient
            # fitted on a narrow range predicts nonsense (or ≤ 0) outside it
            coef = np.zeros(x.shape[1])
            coef[varying], _ = nnls(kept[:, varying], y[usable])
        else:
            coef = np.array([np.median(y[usable]), 0.0, 0.0])
        predicted = np.maximum(x @ coef, 1.0)
        residual = np.log(np.maximum(y, 1.0) / predicted)
        cut = np.quantile(residual, keep)
        usable = residual <= cut
    return StepModel(coef=coef, log_scale=residual_scale(y, np.maximum(x @ coef, 1.0), keep))


def residual_scale(dur_ns: np.ndarray, expected_ns: np.ndarray, keep: float) -> float:
    """The robust spread of log(dur / expected) over the `keep` fraction of steps closest
    below the rest (as `fit_step_model` measures it), floored at `MIN_LOG_SCALE`."""
    residual = np.log(np.maximum(dur_ns, 1.0) / np.maximum(expected_ns, 1.0))
    kept = residual[residual <= np.quantile(residual, keep)]
    spread = median_mad(kept)[1] if len(kept) else 0.0
    return max(float(spread), MIN_LOG_SCALE)


def ratio_z(observed: float, normal: float) -> float:
    """A log-ratio score on the step scale, for display next to the step's own z."""
    return float(np.log(max(observed, 1.0) / max(normal, 1.0)) / MIN_LOG_SCALE)


def same_setup_models(normal_runs: list[NormalRun], setup: Setup) -> dict[str, StepModel]:
    """Per-kind step models from the normal runs whose setup matches `setup`: a step time means
    nothing next to another model's, engine's or cluster's."""
    parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for their_setup, iterations in normal_runs:
        union = len(setup.names | their_setup.names)
        shared = len(setup.names & their_setup.names) / max(union, 1)
        if their_setup.ranks != setup.ranks or shared < SAME_SETUP_NAMES:
            continue
        for kind in dict.fromkeys(iterations.kind.tolist()):
            mask = iterations.kind == kind
            parts.setdefault(kind, []).append(
                (
                    iterations.dur_ns[mask],
                    iterations.context_tokens[mask],
                    iterations.generation_tokens[mask],
                )
            )
    columns = {
        kind: [np.concatenate(c) for c in zip(*runs, strict=True)] for kind, runs in parts.items()
    }
    return {
        kind: fit_step_model(dur, ctx, gen, keep=NORMAL_FIT_KEEP)
        for kind, (dur, ctx, gen) in columns.items()
        if len(dur) >= 3
    }


def score_steps(
    facts: RunFacts,
    fitted: dict[str, StepModel],
    self_fit_keep: float,
    step_z: float,
    min_ratio: float,
) -> list[StepScore]:
    """Every iteration's score against its kind's model (`fitted`, scaled to this run's machine
    speed, or the run's own quieter steps), and its per-rank components'. Where the tree is one
    engine of a run (`RunFacts.run_iterations`), the models and spreads are the whole run's and
    the scores this engine's."""
    scored = facts.iterations
    if not len(scored):
        return []
    iterations = scored if facts.run_iterations is None else facts.run_iterations
    rows = np.searchsorted(iterations.iteration, scored.iteration)
    kinds = iterations.kind
    dur, ctx, gen = iterations.dur_ns, iterations.context_tokens, iterations.generation_tokens
    expected = np.zeros(len(iterations))
    scale = np.zeros(len(iterations))
    for kind in set(kinds.tolist()):
        mask = kinds == kind
        model = fitted.get(kind)
        own = fit_step_model(dur[mask], ctx[mask], gen[mask], keep=self_fit_keep)
        if model is not None:  # this run's machine speed, from its own steps
            predicted = np.maximum(design(ctx[mask], gen[mask]) @ model.coef, 1.0)
            speed = float(np.exp(np.median(np.log(dur[mask] / predicted))))
            if SAME_SETUP_SPEED[0] <= speed <= SAME_SETUP_SPEED[1]:
                model = StepModel(model.coef * speed, max(model.log_scale, own.log_scale))
            else:  # the normal runs came from another model, engine or machine
                model = None
        if model is None:
            model = own
        expected[mask] = np.maximum(design(ctx[mask], gen[mask]) @ model.coef, 1.0)
        scale[mask] = model.log_scale
    costs = composition_costs(iterations, expected, min_ratio)
    expected = expected * costs
    for kind in set(kinds[costs != 1.0].tolist()):
        # the kind's spread was measured about a line that left a composition's cost in it
        mask = kinds == kind
        spread = residual_scale(dur[mask], expected[mask], self_fit_keep)
        scale[mask] = np.minimum(scale[mask], spread)
    z = np.log(np.maximum(dur, 1.0) / expected) / scale
    ratio = dur / expected
    kinds, dur, expected, z, ratio = kinds[rows], dur[rows], expected[rows], z[rows], ratio[rows]
    component_z, component_ratio = component_scores(facts)
    z_all = np.maximum(z, component_z)
    anomalous = ((z >= step_z) & (ratio >= min_ratio)) | (
        (component_z >= step_z) & (component_ratio >= min_ratio)
    )
    return [
        StepScore(
            iteration=int(scored.iteration[i]),
            kind=str(kinds[i]),
            dur_ns=int(dur[i]),
            expected_ns=int(expected[i]),
            z=float(z_all[i]),
            anomalous=bool(anomalous[i]),
            ranks=list(scored.ranks[i]),
        )
        for i in range(len(scored))
    ]


def component_scores(facts: RunFacts) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration: the largest robust z (and its ratio) of any rank's GPU or host work, against
    the same rank's work in nearest-composition steps (temporal) and against its peers
    (imbalance); then of its lateness at collectives and of the transfer time of its collectives."""
    tree = facts.tree
    steps = tree.steps
    count = len(steps)
    iterations = facts.iterations.iteration.tolist()
    kinds = facts.iterations.kind
    tokens = facts.iterations.context_tokens + facts.iterations.generation_tokens
    measures = [  # (per step row, compare across ranks too?)
        (facts.work.gpu_ns, True),
        (facts.work.host_without_waits_ns, True),
    ]
    arrivals = facts.arrivals
    if arrivals is not None:
        # lateness: how long after its peers each rank reached the step's collectives (a
        # straggler's own signature, invisible in its compute when something else delayed it)
        rows = tree.step[arrivals.node]
        lateness = np.bincount(rows, weights=arrivals.late_ns, minlength=count) + 1000.0
        measures.append((lateness, True))
        # transfer: the last arriver's own collective time has no waiting in it
        last = arrivals.is_last
        rows = tree.step[arrivals.node[last]]
        measures.append((np.bincount(rows, weights=arrivals.own_ns[last], minlength=count), False))
    position = {it: i for i, it in enumerate(iterations)}
    # a rank's own steps are compared within its engine (`callchain.engines`): the others' are NaN
    engine = facts.iterations.engine
    ranks = np.unique(steps.rank)
    rank_pos = {int(r): j for j, r in enumerate(ranks.tolist())}
    best_z = np.zeros(len(iterations))
    best_ratio = np.ones(len(iterations))
    for measure, across_ranks in measures:
        grid = np.full((len(iterations), len(ranks)), np.nan)
        for k in range(count):
            grid[position[int(steps.index[k])], rank_pos[int(steps.rank[k])]] = measure[k]
        if not across_ranks:  # a per-iteration measure: all ranks' share added up
            grid = np.nansum(grid, axis=1, keepdims=True)
        if np.nanmax(grid, initial=0.0) <= 0:
            continue
        logs = np.log(np.maximum(grid, 1.0))
        scores = []
        if across_ranks and len(ranks) > 1:  # imbalance: against the median rank, same step
            scores.append(logs - np.nanmedian(logs, axis=1, keepdims=True))
        scores.append(_temporal(logs, kinds, tokens, engine))
        for score in scores:
            z, above = _column_z(score)
            worst = z.max(axis=1)
            better = worst > best_z
            best_z = np.where(better, worst, best_z)
            best_ratio = np.where(better, np.exp(above.max(axis=1)), best_ratio)
    return best_z, best_ratio


def _column_z(score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Robust z of each entry against its column (a rank's iterations), and its excess over the
    column's median; over the entries the rank has (NaN: an iteration of another engine, or one
    it did not run), which score 0."""
    with warnings.catch_warnings():  # a column with no entry at all
        warnings.simplefilter("ignore", RuntimeWarning)
        centre, spread = median_mad(score, axis=0, skip_nan=True)
    above = np.where(np.isfinite(score), score - centre, 0.0)
    return above / np.maximum(np.nan_to_num(spread), MIN_COMPONENT_SCALE), above


def _temporal(
    logs: np.ndarray, kinds: np.ndarray, tokens: np.ndarray, engine: np.ndarray
) -> np.ndarray:
    """Each rank's log measure against its own median in the steps of its engine and kind and
    the nearest sizes (four on either side by tokens)."""
    temporal = np.where(np.isnan(logs), np.nan, 0.0)  # a step alone of its kind: 0
    with warnings.catch_warnings():  # a rank that ran none of the window's steps: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        for group in set(zip(engine.tolist(), kinds.tolist(), strict=True)):
            rows = np.flatnonzero((engine == group[0]) & (kinds == group[1]))
            order = rows[np.argsort(tokens[rows])]
            for pos, row in enumerate(order.tolist()):
                window = order[max(0, pos - 4) : pos + 5]
                window = window[window != row]
                if len(window):
                    temporal[row] = logs[row] - np.nanmedian(logs[window], axis=0)
    return temporal
