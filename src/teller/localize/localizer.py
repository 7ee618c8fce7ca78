"""Numeric candidate localization: which steps are slow, and which (rank, operator) explains it.

The method narrows the search for the root-cause model and is a complete diagnosis on its own:

1. **Steps.** A step's duration is compared with what its batch composition predicts: per step kind,
   a robust linear model ``dur ≈ a + b·context_tokens + c·generation_tokens`` fitted on normal
   cases (`fit`), or on the case's own quieter steps when no normal data was given. A longer prefill
   for a longer prompt is therefore not an anomaly. The step's score is the robust z of
   ``log(dur / expected)``; a step is anomalous when the score passes `step_z` and the step is at
   least `min_ratio` slower than expected.
2. **Operators.** In an anomalous step, every node's self time is compared with the same operator
   instance (same name and occurrence ordinal) (a) in the nearest-composition normal steps of the
   same rank and (b) on the peer ranks in the same step. Excess self time is summed per
   (rank, operator name); repeated layers add up, and self time (not inclusive time) credits the
   deepest operator that actually slowed.
3. **Collectives** are scored by arrival, never duration: a rank that reaches a collective after
   its peers is the suspect, and the peers' inflated waits are symptoms, not candidates. A
   collective slower on every rank without a late arrival is a transfer problem and is scored by
   its excess duration.

Hyper-parameters live in `__init__`; learned state in attributes ending in `_` (scikit-learn
shape), so the baselines and the scoreboard treat every method alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from teller.callchain.tree import CallTree
from teller.localize.features import COMPUTE_LAYERS, step_nodes

#: Smallest log-ratio scale for step scores: 3% run-to-run noise is normal even on a quiet machine.
MIN_LOG_SCALE = 0.03
#: Temporal reference size: this many nearest-composition normal steps.
NEAREST_STEPS = 8


@dataclass
class OperatorCandidate:
    iteration: int
    rank: int
    operator: str
    score: float  # excess ns attributed to this (rank, operator) in the step
    observed_ns: int
    normal_ns: int
    z: float
    node: int  # the largest contributing node
    reference: str
    kind: str  # "compute", "arrival" or "transfer"


@dataclass
class StepScore:
    iteration: int
    kind: str
    dur_ns: int  # slowest rank's duration
    expected_ns: int
    z: float
    anomalous: bool
    ranks: list[int] = field(default_factory=list)


@dataclass
class Localization:
    steps: list[StepScore]
    candidates: dict[int, list[OperatorCandidate]]  # iteration → ranked candidates

    def anomalous_steps(self) -> list[StepScore]:
        return [s for s in self.steps if s.anomalous]


@dataclass
class _StepModel:
    coef: np.ndarray  # a, b (per context token), c (per generation token)
    log_scale: float


def _design(ctx_tokens: np.ndarray, gen_tokens: np.ndarray) -> np.ndarray:
    return np.column_stack(
        [np.ones(len(ctx_tokens)), np.maximum(ctx_tokens, 0), np.maximum(gen_tokens, 0)]
    ).astype(float)


def _fit_step_model(
    dur_ns: np.ndarray, ctx_tokens: np.ndarray, gen_tokens: np.ndarray, keep: float
) -> _StepModel:
    """Least squares, then refit on the `keep` fraction with the smallest residuals (trimmed)."""
    x = _design(ctx_tokens, gen_tokens)
    y = dur_ns.astype(float)
    usable = np.ones(len(y), dtype=bool)
    coef = np.array([np.median(y), 0.0, 0.0])
    for _ in range(3):
        if usable.sum() >= 4 and np.linalg.matrix_rank(x[usable]) == 3:
            coef, *_ = np.linalg.lstsq(x[usable], y[usable], rcond=None)
        else:
            coef = np.array([np.median(y[usable]), 0.0, 0.0])
        predicted = np.maximum(x @ coef, 1.0)
        residual = np.log(np.maximum(y, 1.0) / predicted)
        cut = np.quantile(residual, keep)
        usable = residual <= cut
    predicted = np.maximum(x @ coef, 1.0)
    residual = np.log(np.maximum(y, 1.0) / predicted)[usable]
    mad = 1.4826 * np.median(np.abs(residual - np.median(residual))) if len(residual) else 0.0
    return _StepModel(coef=coef, log_scale=max(float(mad), MIN_LOG_SCALE))


class NumericLocalizer:
    """Robust-z localizer: `fit(normal_trees)` then `score(tree)`."""

    def __init__(
        self,
        step_z: float = 5.0,
        min_ratio: float = 1.15,
        self_fit_keep: float = 0.6,
        top_k: int = 10,
        noise_floor_ns: float = 2_000.0,
    ) -> None:
        self.step_z = step_z
        self.min_ratio = min_ratio
        self.self_fit_keep = self_fit_keep
        self.top_k = top_k
        self.noise_floor_ns = noise_floor_ns

    # -- fit -------------------------------------------------------------------------------------
    def fit(self, normal_trees: list[CallTree]) -> NumericLocalizer:
        """Learn per-kind step models from fault-free runs."""
        kinds: dict[str, list[tuple[float, float, float]]] = {}
        for tree in normal_trees:
            for kind, dur, ctx, gen in _iteration_rows(tree):
                kinds.setdefault(kind, []).append((dur, ctx, gen))
        self.step_models_ = {
            kind: _fit_step_model(
                np.array([r[0] for r in rows]),
                np.array([r[1] for r in rows]),
                np.array([r[2] for r in rows]),
                keep=0.95,
            )
            for kind, rows in kinds.items()
            if len(rows) >= 3
        }
        return self

    # -- score -----------------------------------------------------------------------------------
    def score(self, tree: CallTree) -> Localization:
        steps = self._score_steps(tree)
        anomalous = {s.iteration for s in steps if s.anomalous}
        candidates = self._candidates(tree, anomalous, steps) if anomalous else {}
        return Localization(steps=steps, candidates=candidates)

    def _score_steps(self, tree: CallTree) -> list[StepScore]:
        rows = _iteration_rows(tree, with_iteration=True)
        if not rows:
            return []
        kinds = np.array([r[0] for r in rows], dtype=object)
        dur = np.array([r[1] for r in rows], dtype=float)
        ctx = np.array([r[2] for r in rows], dtype=float)
        gen = np.array([r[3] for r in rows], dtype=float)
        iterations = [r[4] for r in rows]
        ranks = [r[5] for r in rows]
        expected = np.zeros(len(rows))
        scale = np.zeros(len(rows))
        fitted = getattr(self, "step_models_", {})
        for kind in set(kinds.tolist()):
            mask = kinds == kind
            model = fitted.get(kind)
            own = _fit_step_model(dur[mask], ctx[mask], gen[mask], keep=self.self_fit_keep)
            if model is None:
                model = own
            else:  # this run's machine speed, from its own quieter steps, within reason
                speed = np.exp(
                    np.median(
                        np.log(
                            dur[mask] / np.maximum(_design(ctx[mask], gen[mask]) @ model.coef, 1.0)
                        )
                    )
                )
                model = _StepModel(model.coef * float(np.clip(speed, 0.8, 1.25)), model.log_scale)
            expected[mask] = np.maximum(_design(ctx[mask], gen[mask]) @ model.coef, 1.0)
            scale[mask] = model.log_scale
        z = np.log(np.maximum(dur, 1.0) / expected) / scale
        return [
            StepScore(
                iteration=iterations[i],
                kind=str(kinds[i]),
                dur_ns=int(dur[i]),
                expected_ns=int(expected[i]),
                z=float(z[i]),
                anomalous=bool(z[i] >= self.step_z and dur[i] >= self.min_ratio * expected[i]),
                ranks=ranks[i],
            )
            for i in range(len(rows))
        ]

    def _candidates(
        self, tree: CallTree, anomalous: set[int], steps: list[StepScore]
    ) -> dict[int, list[OperatorCandidate]]:
        nodes = step_nodes(tree)
        kind_of = {s.iteration: s.kind for s in steps}
        tokens_of = {
            int(tree.steps.index[k]): float(
                max(tree.steps.context_tokens[k], 0) + max(tree.steps.generation_tokens[k], 0)
            )
            for k in range(len(tree.steps))
        }
        normal_iterations = [s.iteration for s in steps if not s.anomalous]
        # self time of every keyed node: (rank, name, ordinal, on_gpu) → {iteration: self_ns}
        key_rows: dict[tuple, dict[int, int]] = {}
        for i in range(len(nodes.node)):
            key = (
                int(nodes.rank[i]),
                int(nodes.name[i]),
                int(nodes.ordinal[i]),
                bool(nodes.on_gpu[i]),
            )
            key_rows.setdefault(key, {})[int(nodes.iteration[i])] = i
        out: dict[int, list[OperatorCandidate]] = {}
        for iteration in sorted(anomalous):
            reference = _nearest(iteration, normal_iterations, kind_of, tokens_of, NEAREST_STEPS)
            out[iteration] = self._step_candidates(tree, nodes, key_rows, iteration, reference)
        return out

    def _step_candidates(
        self,
        tree: CallTree,
        nodes,
        key_rows: dict[tuple, dict[int, int]],
        iteration: int,
        reference: list[int],
    ) -> list[OperatorCandidate]:
        in_step = np.flatnonzero(nodes.iteration == iteration)
        totals: dict[tuple[int, int], list] = {}  # (rank, name) → [excess, observed, normal, best]
        for i in in_step.tolist():
            layer = int(nodes.layer[i])
            if layer not in COMPUTE_LAYERS:
                continue
            rank, name = int(nodes.rank[i]), int(nodes.name[i])
            key = (rank, name, int(nodes.ordinal[i]), bool(nodes.on_gpu[i]))
            history = key_rows.get(key, {})
            ref = [int(nodes.self_ns[history[r]]) for r in reference if r in history]
            where = "nearest-composition normal steps, same rank"
            if len(ref) < 2:  # no temporal reference: compare with the peers in this step
                ref = [
                    int(nodes.self_ns[key_rows[(peer, name, key[2], key[3])][iteration]])
                    for peer in _peers(tree, rank)
                    if iteration in key_rows.get((peer, name, key[2], key[3]), {})
                ]
                where = "same operator on peer ranks, same step"
            if not ref:
                continue
            normal = float(np.median(ref))
            excess = float(nodes.self_ns[i]) - normal
            if excess <= self.noise_floor_ns:
                continue
            entry = totals.setdefault((rank, name), [0.0, 0, 0, i, 0.0, where])
            entry[0] += excess
            entry[1] += int(nodes.self_ns[i])
            entry[2] += int(normal)
            if excess > entry[4]:
                entry[3], entry[4] = i, excess
        candidates = [
            OperatorCandidate(
                iteration=iteration,
                rank=rank,
                operator=tree.names[name],
                score=excess,
                observed_ns=observed,
                normal_ns=normal,
                z=_ratio_z(observed, normal),
                node=int(nodes.node[best]),
                reference=where,
                kind="compute",
            )
            for (rank, name), (excess, observed, normal, best, _, where) in totals.items()
        ]
        candidates.extend(self._collective_candidates(tree, iteration, nodes, key_rows, reference))
        candidates.sort(key=lambda c: -c.score)
        return candidates[: self.top_k]

    def _collective_candidates(
        self,
        tree: CallTree,
        iteration: int,
        nodes,
        key_rows: dict[tuple, dict[int, int]],
        reference: list[int],
    ) -> list[OperatorCandidate]:
        comm = tree.comm
        if not len(comm):
            return []
        in_step = np.isin(comm.node, nodes.node[nodes.iteration == iteration])
        lateness: dict[tuple[int, int], list] = {}
        transfer: dict[tuple[int, int], list] = {}
        for instance in np.unique(comm.instance[in_step]).tolist():
            rows = np.flatnonzero(comm.instance == instance)
            if len(rows) < 2:
                continue
            arrival = comm.start_ns[rows]
            order = np.argsort(arrival)
            last, runner_up = rows[order[-1]], rows[order[-2]]
            late_ns = int(comm.start_ns[last] - comm.start_ns[runner_up])
            if late_ns > self.noise_floor_ns:
                key = (int(comm.rank[last]), int(tree.name[comm.node[last]]))
                entry = lateness.setdefault(key, [0, int(comm.node[last])])
                entry[0] += late_ns
            # transfer: the last arriver's own time is pure transfer (nobody to wait for)
            node = int(comm.node[last])
            own = int(comm.end_ns[last] - comm.start_ns[last])
            normal = _reference_dur(tree, nodes, key_rows, node, reference)
            if normal is not None and own - normal > self.noise_floor_ns:
                key = (int(comm.rank[last]), int(tree.name[node]))
                entry = transfer.setdefault(key, [0, 0, 0, node])
                entry[0] += own - normal
                entry[1] += own
                entry[2] += normal
        out = [
            OperatorCandidate(
                iteration=iteration,
                rank=rank,
                operator=tree.names[name],
                score=float(late),
                observed_ns=int(late),
                normal_ns=0,
                z=float("inf") if late else 0.0,
                node=node,
                reference="arrival after the other ranks at the same collective",
                kind="arrival",
            )
            for (rank, name), (late, node) in lateness.items()
        ]
        out.extend(
            OperatorCandidate(
                iteration=iteration,
                rank=rank,
                operator=tree.names[name],
                score=float(excess),
                observed_ns=observed,
                normal_ns=normal,
                z=_ratio_z(observed, normal),
                node=node,
                reference="last arriver's transfer time vs nearest normal steps",
                kind="transfer",
            )
            for (rank, name), (excess, observed, normal, node) in transfer.items()
        )
        return out


def _iteration_rows(tree: CallTree, with_iteration: bool = False) -> list[tuple]:
    """One row per iteration: (kind, slowest rank's dur, ctx tokens, gen tokens[, iteration, ranks])."""
    steps = tree.steps
    by_iteration: dict[int, list[int]] = {}
    for k in range(len(steps)):
        by_iteration.setdefault(int(steps.index[k]), []).append(k)
    rows = []
    for iteration, members in sorted(by_iteration.items()):
        first = members[0]
        dur = max(int(steps.dur_ns[k]) for k in members)
        row = (
            steps.kind[first],
            float(dur),
            float(max(steps.context_tokens[first], 0)),
            float(max(steps.generation_tokens[first], 0)),
        )
        if with_iteration:
            row = (*row, iteration, sorted(int(steps.rank[k]) for k in members))
        rows.append(row)
    return rows


def _nearest(
    iteration: int,
    normal: list[int],
    kind_of: dict[int, str],
    tokens_of: dict[int, float],
    count: int,
) -> list[int]:
    same_kind = [n for n in normal if kind_of.get(n) == kind_of.get(iteration)] or normal
    target = tokens_of.get(iteration, 0.0)
    return sorted(
        same_kind, key=lambda n: (abs(tokens_of.get(n, 0.0) - target), abs(n - iteration))
    )[:count]


def _peers(tree: CallTree, rank: int) -> list[int]:
    return [r for r in np.unique(tree.steps.rank).tolist() if r != rank]


def _reference_dur(tree: CallTree, nodes, key_rows, node: int, reference: list[int]) -> int | None:
    position = np.flatnonzero(nodes.node == node)
    if not len(position):
        return None
    i = int(position[0])
    key = (int(nodes.rank[i]), int(nodes.name[i]), int(nodes.ordinal[i]), bool(nodes.on_gpu[i]))
    history = key_rows.get(key, {})
    durations = [int(nodes.dur_ns[history[r]]) for r in reference if r in history]
    return int(np.median(durations)) if len(durations) >= 2 else None


def _ratio_z(observed: float, normal: float) -> float:
    """A log-ratio score on the step scale, for display next to the step's own z."""
    return float(np.log(max(observed, 1.0) / max(normal, 1.0)) / MIN_LOG_SCALE)
