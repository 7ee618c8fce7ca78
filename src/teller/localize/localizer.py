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
   same rank, else (b) on the peer ranks in the same step, else (c) with the same operator in the
   step's other repeated layers on the same rank (a single-rank run without normal steps). Excess self time is summed per
   (rank, operator name); repeated layers add up, and self time (not inclusive time) credits the
   deepest operator that actually slowed.
3. **Collectives** are scored by arrival, never duration: a rank that reaches a collective after
   its peers is the suspect, and the peers' inflated waits are symptoms, not candidates. A
   collective slower on every rank without a late arrival is a transfer problem and is scored by
   its excess duration.
4. **Persistent operator shifts** (`teller.localize.shifts`): one operator on one rank slower than
   on its peers for several steps in a row flags those steps even when the step time hides it, and
   is their first candidate.
5. **GPU idle gaps** (`teller.localize.idle`): when a rank's GPU waited for a launch that came
   late, the host work running on the launching thread meanwhile is a candidate, scored by the
   idle time it caused beyond the nearest normal steps.

Candidates are ranked by excess nanoseconds weighted by significance: an excess counts in full
once its robust z (against the same rank's totals in the reference steps, or any rank's spread
for arrivals) reaches `FULL_CREDIT_Z`, so large but usual noise does not outrank a consistent
slowdown. Step models are fitted from the normal runs of the same setup only (rank count and
operator names); a case from another setup is judged against its own quieter steps.

Hyper-parameters live in `__init__`; learned state in attributes ending in `_` (scikit-learn
shape), so the baselines and the scoreboard treat every method alike.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from teller.callchain.render import format_ns
from teller.callchain.tree import CallTree
from teller.ingest.schema import LAYER_CODE
from teller.localize.features import COMPUTE_LAYERS, kernel_sequences, step_nodes
from teller.localize.idle import idle_gaps
from teller.localize.shifts import OperatorShift, operator_shifts

#: Smallest log-ratio scale for step scores: 3% run-to-run noise is normal even on a quiet machine.
MIN_LOG_SCALE = 0.03
#: Share of a rank's late arrival that its own compute excess must cover to explain it.
EXPLAINED_LATENESS = 0.5
#: A case whose steps run this much slower or faster than the normal runs predict was recorded on
#: another setup (model, engine, hardware): its own quieter steps are the reference instead.
SAME_SETUP_SPEED = (0.67, 1.5)
#: Share of operator and kernel names a normal run must have in common with a case to count as
#: the same setup (Jaccard), besides the same number of ranks.
SAME_SETUP_NAMES = 0.7
#: A candidate's excess counts in full from this robust z on; below it, in proportion (noise that
#: happens to be large in nanoseconds does not outrank a consistent slowdown).
FULL_CREDIT_Z = 5.0
#: Temporal reference size: this many nearest-composition normal steps.
NEAREST_STEPS = 8

#: The reference of a candidate whose operator the step's usual work does not run at all.
NEW_OPERATOR = "absent from most of the nearest normal steps, on every rank"
#: The reference of a kernel one rank runs where its tensor-parallel peers all run another.
SUBSTITUTED = "launched where the peer ranks launch another kernel, same step and position"


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
    kind: str  # "compute", "idle", "shift", "arrival" or "transfer" ("forward": rca/dataset.py)


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
class StepExplanation:
    """A method's words about one flagged step, with the node they are grounded on, so the
    scoreboard can check the words against the pick (faithfulness) and the pick against the labels.
    """

    fault: str  # predicted fault type
    text: str
    operator: str | None  # the operator the method picked (None: no single node)
    rank: int | None


@dataclass
class Localization:
    steps: list[StepScore]
    candidates: dict[int, list[OperatorCandidate]]  # iteration → ranked candidates
    # iteration → explanation, for methods that explain their flagged steps (the root-cause model)
    explanations: dict[int, StepExplanation] = field(default_factory=dict)
    # iteration → excess ns of its largest persistent operator shift (`teller.localize.shifts`)
    shifted: dict[int, float] = field(default_factory=dict)

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
            # non-negative: more tokens never make a step faster, and a negative coefficient
            # fitted on a narrow range predicts nonsense (or ≤ 0) outside it
            coef, _ = nnls(x[usable], y[usable])
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
        operator_shifts: bool = True,
        candidate_z: float | None = None,
    ) -> None:
        self.step_z = step_z
        # which steps get operator candidates: the anomalous ones (None), or every step whose z
        # reaches this (the root-cause model ranks the candidates of borderline steps too); the
        # reference steps that candidates are measured against stay the non-anomalous ones
        self.candidate_z = candidate_z
        self.min_ratio = min_ratio
        self.self_fit_keep = self_fit_keep
        self.top_k = top_k
        self.noise_floor_ns = noise_floor_ns
        self.operator_shifts = operator_shifts

    # -- fit -------------------------------------------------------------------------------------
    def fit(self, normal_trees: list[CallTree]) -> NumericLocalizer:
        """Remember the fault-free runs' steps, each run with its setup's fingerprint.

        Step models are fitted at `score` time from the normal runs of the same setup only
        (`_setup_of`): a step time means nothing next to another model's, engine's or cluster's."""
        self.normal_runs_ = [(_setup_of(tree), _iteration_rows(tree)) for tree in normal_trees]
        return self

    def _step_models(self, tree: CallTree) -> dict[str, _StepModel]:
        """Per-kind step models from the normal runs whose setup matches this tree's."""
        ranks, names = _setup_of(tree)
        kinds: dict[str, list[tuple[float, float, float]]] = {}
        for (their_ranks, their_names), rows in getattr(self, "normal_runs_", []):
            shared = len(names & their_names) / max(len(names | their_names), 1)
            if their_ranks != ranks or shared < SAME_SETUP_NAMES:
                continue
            for kind, dur, ctx, gen in rows:
                kinds.setdefault(kind, []).append((dur, ctx, gen))
        return {
            kind: _fit_step_model(
                np.array([r[0] for r in rows]),
                np.array([r[1] for r in rows]),
                np.array([r[2] for r in rows]),
                keep=0.95,
            )
            for kind, rows in kinds.items()
            if len(rows) >= 3
        }

    # -- score -----------------------------------------------------------------------------------
    def score(self, tree: CallTree) -> Localization:
        steps = self._score_steps(tree)
        shifts = self._operator_shifts(tree)
        only_shifted = set()
        for step in steps:
            if step.iteration in shifts and not step.anomalous:
                step.anomalous = True
                only_shifted.add(step.iteration)
        if self.candidate_z is None:
            propose = {s.iteration for s in steps if s.anomalous}
        else:
            propose = {s.iteration for s in steps if s.anomalous or s.z >= self.candidate_z}
        candidates = self._candidates(tree, propose, steps) if propose else {}
        for iteration, found_shifts in shifts.items():
            found = [self._shift_candidate(tree, s) for s in found_shifts]
            named = {(c.rank, c.operator) for c in found}
            rest = [c for c in candidates.get(iteration, []) if (c.rank, c.operator) not in named]
            if iteration in only_shifted:  # the step hid it: the persistent shift is the finding
                candidates[iteration] = (found + rest)[: self.top_k]
            else:  # a slow step: the shift is one more explanation, ranked by its excess
                candidates[iteration] = sorted(found + rest, key=lambda c: -c.score)[: self.top_k]
        hang = unfinished_step(tree)
        if hang is not None:
            step, candidate = hang
            steps.append(step)
            candidates[step.iteration] = [candidate]
        return Localization(
            steps=steps,
            candidates=candidates,
            shifted={it: max(s.excess_ns for s in found) for it, found in shifts.items() if found},
        )

    def _operator_shifts(self, tree: CallTree) -> dict[int, list[OperatorShift]]:
        if not self.operator_shifts:
            return {}
        return operator_shifts(tree, waiting=_waiting_names(tree))

    @staticmethod
    def _shift_candidate(tree: CallTree, shift: OperatorShift) -> OperatorCandidate:
        return OperatorCandidate(
            iteration=shift.iteration,
            rank=shift.rank,
            operator=tree.names[shift.name],
            score=shift.excess_ns,
            observed_ns=shift.observed_ns,
            normal_ns=int(shift.usual_ratio * shift.peers_ns),
            z=_ratio_z(shift.observed_ns, max(shift.usual_ratio * shift.peers_ns, 1.0)),
            node=shift.node,
            reference=f"same operator on peer ranks, same step; shifted for {shift.steps} steps",
            kind="shift",
        )

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
        fitted = self._step_models(tree)
        for kind in set(kinds.tolist()):
            mask = kinds == kind
            model = fitted.get(kind)
            own = _fit_step_model(dur[mask], ctx[mask], gen[mask], keep=self.self_fit_keep)
            if model is not None:  # this run's machine speed, from its own steps
                speed = float(
                    np.exp(
                        np.median(
                            np.log(
                                dur[mask]
                                / np.maximum(_design(ctx[mask], gen[mask]) @ model.coef, 1.0)
                            )
                        )
                    )
                )
                if SAME_SETUP_SPEED[0] <= speed <= SAME_SETUP_SPEED[1]:
                    model = _StepModel(model.coef * speed, max(model.log_scale, own.log_scale))
                else:  # the normal runs came from another model, engine or machine
                    model = None
            if model is None:
                model = own
            expected[mask] = np.maximum(_design(ctx[mask], gen[mask]) @ model.coef, 1.0)
            scale[mask] = model.log_scale
        z = np.log(np.maximum(dur, 1.0) / expected) / scale
        ratio = dur / expected
        # a slowdown on one rank can hide in a step's slack (others wait less at the collective):
        # score each rank's own work too, against its peers and against its own normal steps
        component_z, component_ratio = _component_scores(tree, iterations, kinds, ctx + gen)
        z_all = np.maximum(z, component_z)
        anomalous = ((z >= self.step_z) & (ratio >= self.min_ratio)) | (
            (component_z >= self.step_z) & (component_ratio >= self.min_ratio)
        )
        return [
            StepScore(
                iteration=iterations[i],
                kind=str(kinds[i]),
                dur_ns=int(dur[i]),
                expected_ns=int(expected[i]),
                z=float(z_all[i]),
                anomalous=bool(anomalous[i]),
                ranks=ranks[i],
            )
            for i in range(len(rows))
        ]

    def _candidates(
        self, tree: CallTree, propose: set[int], steps: list[StepScore]
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
        step_totals = _totals_by_step(nodes)
        gaps = idle_gaps(tree)
        arrivals = _arrivals(tree)  # once per run: every proposed step reads the same table
        substituted = _substituted_kernels(tree)
        out: dict[int, list[OperatorCandidate]] = {}
        for iteration in sorted(propose):
            reference = _nearest(iteration, normal_iterations, kind_of, tokens_of, NEAREST_STEPS)
            out[iteration] = self._step_candidates(
                tree,
                nodes,
                key_rows,
                step_totals,
                gaps,
                arrivals,
                substituted.get(iteration, set()),
                iteration,
                reference,
            )
        return out

    def _step_candidates(
        self,
        tree: CallTree,
        nodes,
        key_rows: dict[tuple, dict[int, int]],
        step_totals: dict[tuple[int, int, int], float],
        gaps: dict[tuple[int, int], dict[int, float]],
        arrivals: tuple[np.ndarray, ...] | None,
        substituted: set[tuple[int, int]],
        iteration: int,
        reference: list[int],
    ) -> list[OperatorCandidate]:
        in_step = np.flatnonzero(nodes.iteration == iteration)
        totals: dict[tuple[int, int], list] = {}  # (rank, name) → [excess, observed, normal, best]
        waiting = _waiting_names(tree)
        layers = None  # built on first need (single-rank runs without normal steps)
        for i in in_step.tolist():
            layer = int(nodes.layer[i])
            if layer not in COMPUTE_LAYERS or int(nodes.name[i]) in waiting:
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
            if not ref:  # one rank, no normal steps: the operator's other layers in this step
                if layers is None:
                    layers = _layers_index(key_rows)
                ref = [
                    int(nodes.self_ns[j])
                    for ordinal, steps_of in layers.get((rank, name, key[3]), {}).items()
                    if ordinal != key[2] and (j := steps_of.get(iteration)) is not None
                ]
                where = "same operator in the step's other layers, same rank"
            if not ref:
                continue
            normal = _small_median(ref)
            excess = float(nodes.self_ns[i]) - normal  # small and negative ones too: they add up
            entry = totals.setdefault((rank, name), [0.0, 0, 0, i, 0.0, where])
            entry[0] += excess
            entry[1] += int(nodes.self_ns[i])
            entry[2] += int(normal)
            if excess > entry[4]:
                entry[3], entry[4] = i, excess
        candidates = []
        for (rank, name), (excess, observed, normal, best, _, where) in totals.items():
            if excess <= self.noise_floor_ns:
                continue
            usual = [step_totals.get((rank, name, r), 0.0) for r in reference]
            z = self._significance(float(observed), usual)
            candidates.append(
                OperatorCandidate(
                    iteration=iteration,
                    rank=rank,
                    operator=tree.names[name],
                    score=excess * _credit(z),
                    observed_ns=observed,
                    normal_ns=normal,
                    z=z,
                    node=int(nodes.node[best]),
                    reference=where,
                    kind="compute",
                )
            )
        new = self._new_operators(step_totals, iteration, reference, waiting) if reference else []
        seen = {key for key, _ in new}
        new = [(key, observed, NEW_OPERATOR) for key, observed in new]
        for rank, name in sorted(substituted - seen):
            observed = step_totals.get((rank, name, iteration), 0.0)
            if observed > self.noise_floor_ns and name not in waiting:
                new.append(((rank, name), observed, SUBSTITUTED))
        # an operator the usual work does not run was measured above against the few steps that
        # did (the fault's own unflagged steps, or all of them once it persists): its whole time
        # is the excess instead
        fresh = {(rank, tree.names[name]) for (rank, name), _, _ in new}
        candidates = [c for c in candidates if (c.rank, c.operator) not in fresh]
        for (rank, name), observed, why in new:
            candidates.append(
                OperatorCandidate(
                    iteration=iteration,
                    rank=rank,
                    operator=tree.names[name],
                    score=observed,
                    observed_ns=int(observed),
                    normal_ns=0,
                    z=self._significance(observed, []),
                    node=int(nodes.node[_largest_node(nodes, iteration, rank, name)]),
                    reference=why,
                    kind="compute",
                )
            )
        candidates.extend(self._idle_candidates(tree, nodes, gaps, iteration, reference))
        compute_excess: dict[int, float] = {}
        for candidate in candidates:
            compute_excess[candidate.rank] = (
                compute_excess.get(candidate.rank, 0.0) + candidate.score
            )
        collectives = self._collective_candidates(
            tree, arrivals, iteration, nodes, key_rows, reference
        )
        for candidate in collectives:
            explained = compute_excess.get(candidate.rank, 0.0)
            if candidate.kind == "arrival":
                # a rank whose own work got slower arrives late *because* of it: when its compute
                # excess explains most of the lateness, the collective is a symptom, not a cause
                if explained >= EXPLAINED_LATENESS * candidate.score:
                    continue
                candidate.score -= explained
            elif candidate.kind == "transfer" and explained >= candidate.score:
                # a host-run collective (gloo) on a slowed host is slow for the host's reason
                continue
            if candidate.score > self.noise_floor_ns:
                candidates.append(candidate)
        candidates.sort(key=lambda c: -c.score)
        return keep_top(candidates, self.top_k)

    def _idle_candidates(
        self,
        tree: CallTree,
        nodes,
        gaps: dict[tuple[int, int], dict[int, float]],
        iteration: int,
        reference: list[int],
    ) -> list[OperatorCandidate]:
        """Host work that kept a rank's GPU idle longer than in the nearest normal steps.

        Which host node a gap lands on wanders from step to step, so the evidence is judged per
        rank first: only when the rank's total idle time is itself unusual do its per-operator
        shares get credit."""
        out = []
        for (rank, it), per_name in gaps.items():
            if it != iteration:
                continue
            usual_totals = [sum(gaps.get((rank, r), {}).values()) for r in reference]
            rank_z = self._significance(sum(per_name.values()), usual_totals)
            weight = _credit(rank_z)
            if weight <= 0.0:
                continue
            for name, idle in per_name.items():
                usual = [gaps.get((rank, r), {}).get(name, 0.0) for r in reference]
                excess = idle - (float(np.median(usual)) if usual else 0.0)
                if excess <= self.noise_floor_ns:
                    continue
                where = np.flatnonzero(
                    (nodes.iteration == iteration) & (nodes.rank == rank) & (nodes.name == name)
                )
                if not len(where):
                    continue
                out.append(
                    OperatorCandidate(
                        iteration=iteration,
                        rank=rank,
                        operator=tree.names[name],
                        score=excess * weight,
                        observed_ns=int(idle),
                        normal_ns=int(np.median(usual)) if usual else 0,
                        z=rank_z,
                        node=int(nodes.node[where[np.argmax(nodes.self_ns[where])]]),
                        reference="GPU idle while this host work delayed the next launch, "
                        "vs nearest normal steps",
                        kind="idle",
                    )
                )
        return out

    def _significance(self, observed: float, usual: list[float], scale: float = 0.0) -> float:
        """Robust z of a step's total against its totals in the reference steps, the scale
        floored at `scale`, at 5% of the usual value and at the noise floor (few or identical
        references)."""
        if not usual:
            return observed / max(scale, self.noise_floor_ns)
        median = float(np.median(usual))
        mad = 1.4826 * float(np.median(np.abs(np.asarray(usual) - median)))
        return (observed - median) / max(mad, scale, 0.05 * median, self.noise_floor_ns)

    def _new_operators(
        self,
        step_totals: dict[tuple[int, int, int], float],
        iteration: int,
        reference: list[int],
        waiting: frozenset[int],
    ) -> list[tuple[tuple[int, int], float]]:
        """(rank, name) whose work in this step is absent from most reference steps, on every
        rank: a swapped-in kernel, a fallback path. Their whole time is excess.

        Most, not all: the reference steps are the ones the step scores did not flag, and a
        fault that slows a step less than its batch's spread leaves some of its own steps among
        them. One such step in the reference must not make the swapped kernel usual."""
        references = set(reference)
        steps_with = Counter(
            n for n, _ in {(n, it) for (_, n, it) in step_totals if it in references}
        )
        usual_names = {n for n, count in steps_with.items() if 2 * count > len(references)}
        return [
            ((r, n), total)
            for (r, n, it), total in step_totals.items()
            if it == iteration
            and total > self.noise_floor_ns
            and n not in usual_names
            and n not in waiting
        ]

    def _collective_candidates(
        self,
        tree: CallTree,
        table: tuple[np.ndarray, ...] | None,
        iteration: int,
        nodes,
        key_rows: dict[tuple, dict[int, int]],
        reference: list[int],
    ) -> list[OperatorCandidate]:
        """Arrival and transfer candidates of one step, from the run's `_arrivals` table."""
        if table is None:
            return []
        iteration_of, rank, name, late_ns, own_ns, node, is_last = table
        out: list[OperatorCandidate] = []
        here = iteration_of == iteration
        # how much any rank's lateness wanders from its own usual: host-bound ranks skew by
        # chance, and a rank that is usually on time has no spread of its own to judge by
        deviations = []
        for r in np.unique(rank[here]).tolist():
            for n in np.unique(name[here & (rank == r)]).tolist():
                mine = (rank == r) & (name == n)
                usual = np.array([late_ns[mine & (iteration_of == it)].sum() for it in reference])
                deviations.extend(np.abs(usual - np.median(usual)).tolist() if len(usual) else [])
        pooled_scale = 1.4826 * float(np.median(deviations)) if deviations else 0.0
        for r in np.unique(rank[here]).tolist():
            for n in np.unique(name[here & (rank == r)]).tolist():
                mine = (rank == r) & (name == n)
                now = mine & here
                # lateness against this rank's own lateness in the reference steps: ranks skew a
                # little all the time, only skew beyond the usual points at something
                usual = [late_ns[mine & (iteration_of == it)].sum() for it in reference]
                lateness = float(late_ns[now].sum() - (np.median(usual) if usual else 0.0))
                biggest = int(node[now][np.argmax(late_ns[now])])
                if lateness > self.noise_floor_ns:
                    z = self._significance(float(late_ns[now].sum()), usual, pooled_scale)
                    out.append(
                        OperatorCandidate(
                            iteration=iteration,
                            rank=r,
                            operator=tree.names[n],
                            score=lateness * _credit(z),
                            observed_ns=int(late_ns[now].sum()),
                            normal_ns=int(np.median(usual)) if usual else 0,
                            z=z,
                            node=biggest,
                            reference="arrival after the other ranks, vs this rank's usual skew",
                            kind="arrival",
                        )
                    )
                # transfer: a collective slower on every rank, the last arriver included, is a
                # transfer problem; the last arriver's own time has no waiting in it
                last_rows = now & is_last
                if not last_rows.any():
                    continue
                usual_own = [
                    own_ns[mine & (iteration_of == it) & is_last].sum() for it in reference
                ]
                excess = float(
                    own_ns[last_rows].sum() - (np.median(usual_own) if usual_own else 0.0)
                )
                if usual_own and excess > self.noise_floor_ns:
                    out.append(
                        OperatorCandidate(
                            iteration=iteration,
                            rank=r,
                            operator=tree.names[n],
                            score=excess,
                            observed_ns=int(own_ns[last_rows].sum()),
                            normal_ns=int(np.median(usual_own)),
                            z=_ratio_z(float(own_ns[last_rows].sum()), float(np.median(usual_own))),
                            node=int(node[last_rows][0]),
                            reference="last arriver's own collective time vs nearest normal steps",
                            kind="transfer",
                        )
                    )
        return out


#: A collective that some ranks sat in this long while a peer never joined is a hang, not a delay.
HANG_NS = 10_000_000_000


def unfinished_step(tree: CallTree) -> tuple[StepScore, OperatorCandidate] | None:
    """The step a hang left unfinished, and the rank that never arrived.

    A hang ends the trace inside a step, so that step has no step node and no method sees it.
    Its mark is a collective instance that only some ranks entered, after their last finished
    step, and that they sat in for `HANG_NS` or more (until a watchdog or the profiler stopped).
    The ranks missing from it never arrived: the suspect, as a late arrival with no end."""
    comm = tree.comm
    ranks = np.unique(tree.steps.rank).tolist()
    if not len(comm) or len(ranks) < 2:
        return None
    trailing = tree.step[comm.node] < 0
    waited = comm.end_ns - comm.start_ns
    hung_rows = np.flatnonzero(trailing & (waited >= HANG_NS))
    if not len(hung_rows):
        return None
    instance = int(comm.instance[hung_rows[np.argmax(waited[hung_rows])]])
    members = np.flatnonzero(comm.instance == instance)
    present = sorted(set(comm.rank[members].tolist()))
    missing = [r for r in ranks if r not in present]
    if not missing:
        return None
    longest = int(members[np.argmax(waited[members])])
    wait_ns = int(waited[longest])
    usual_ns = int(np.median(tree.steps.dur_ns))
    iteration = int(tree.steps.index.max()) + 1
    step = StepScore(
        iteration=iteration,
        kind="unfinished",
        dur_ns=wait_ns,
        expected_ns=usual_ns,
        z=float(np.log(max(wait_ns, 1) / max(usual_ns, 1)) / MIN_LOG_SCALE),
        anomalous=True,
        ranks=present,
    )
    candidate = OperatorCandidate(
        iteration=iteration,
        rank=missing[0],
        operator=tree.names[tree.name[comm.node[longest]]],
        score=float(wait_ns),
        observed_ns=wait_ns,
        normal_ns=0,
        z=step.z,
        node=int(comm.node[longest]),
        reference=f"ranks {present} waited in it; rank(s) {missing} never arrived (hang)",
        kind="arrival",
    )
    return step, candidate


def hang_explanation(step: StepScore, candidate: OperatorCandidate) -> str:
    """The sentence for an unfinished step (`unfinished_step`)."""
    return (
        f"Rank {candidate.rank} never reached {candidate.operator}; its peers hung in it for "
        f"{format_ns(step.dur_ns)} until a watchdog or the profiler stopped them, so step "
        f"{step.iteration} never finished."
    )


def _layers_index(key_rows: dict[tuple, dict[int, int]]) -> dict[tuple, dict[int, dict[int, int]]]:
    """(rank, name, on_gpu) → ordinal → {iteration: node}: an operator's repeated layers."""
    index: dict[tuple, dict[int, dict[int, int]]] = {}
    for (rank, name, ordinal, on_gpu), steps_of in key_rows.items():
        index.setdefault((rank, name, on_gpu), {})[ordinal] = steps_of
    return index


def _credit(z: float) -> float:
    """Share of an excess that counts: all of it from FULL_CREDIT_Z on, in proportion below."""
    return min(1.0, max(z, 0.0) / FULL_CREDIT_Z)


def _totals_by_step(nodes) -> dict[tuple[int, int, int], float]:
    """(rank, name, iteration) → total self time of the compute nodes of that name there."""
    compute = np.isin(nodes.layer, list(COMPUTE_LAYERS))
    keys = np.stack([nodes.rank[compute], nodes.name[compute], nodes.iteration[compute]], axis=1)
    if not len(keys):
        return {}
    unique, inverse = np.unique(keys, axis=0, return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=nodes.self_ns[compute].astype(float))
    return {tuple(int(v) for v in unique[k]): float(sums[k]) for k in range(len(unique))}


def _substituted_kernels(tree: CallTree) -> dict[int, set[tuple[int, int]]]:
    """iteration → (rank, kernel name id) of kernels one rank launched where every other rank of
    the step, at the same position of the same-length kernel sequence, launched one other kernel.

    Why: the ranks of a tensor-parallel group launch the same kernels in the same order, so a
    kernel that one rank alone runs in a peer's place is a substitution (a fallback GEMM, a
    regressed path), whether or not earlier steps ran it too: history cannot see a regression
    that has lasted, the peers can. Needs three ranks of one sequence length (with two, neither
    is the odd one out); pipeline stages, whose sequences differ, never compare."""
    out: dict[int, set[tuple[int, int]]] = {}
    for iteration, sequences in kernel_sequences(tree).items():
        by_length: dict[int, list[tuple[int, np.ndarray]]] = {}
        for k, rows in sequences:
            by_length.setdefault(len(rows), []).append((k, rows))
        for length, group in by_length.items():
            if length == 0 or len(group) < 3:
                continue
            names = np.stack([tree.name[rows] for _, rows in group])
            for g, (k, _) in enumerate(group):
                others = np.delete(names, g, axis=0)
                odd = (others != names[g]).all(axis=0) & (others == others[0]).all(axis=0)
                rank = int(tree.steps.rank[k])
                for name in np.unique(names[g][odd]).tolist():
                    out.setdefault(iteration, set()).add((rank, int(name)))
    return out


def _largest_node(nodes, iteration: int, rank: int, name: int) -> int:
    """Position (in `nodes`) of the longest self-time node of `name` on `rank` in the step."""
    where = np.flatnonzero(
        (nodes.iteration == iteration) & (nodes.rank == rank) & (nodes.name == name)
    )
    return int(where[np.argmax(nodes.self_ns[where])])


def _arrivals(tree: CallTree) -> tuple[np.ndarray, ...] | None:
    """Per (collective instance, rank): iteration, rank, name, lateness (arrival after the median
    of the others, ≥ 0) and own duration. Arrival is on the GPU where collectives run there."""
    comm = tree.comm
    if not len(comm):
        return None
    use = np.ones(len(comm), dtype=bool)
    on_gpu = tree.stream[comm.node] >= 0
    if on_gpu.any():  # host-side enqueue times say nothing about arrival on the GPU
        use &= on_gpu
    step = tree.step[comm.node]
    use &= step >= 0
    rows = np.flatnonzero(use)
    late = np.zeros(len(comm), dtype=np.int64)
    last = np.zeros(len(comm), dtype=bool)
    order = np.argsort(comm.instance[rows], kind="stable")
    rows = rows[order]
    boundaries = np.flatnonzero(np.diff(comm.instance[rows])) + 1
    for group in np.split(rows, boundaries):
        if len(group) < 2:
            continue
        starts = comm.start_ns[group]
        last[group[np.argmax(starts)]] = True
        for k, row in enumerate(group.tolist()):
            others = np.delete(starts, k)
            late[row] = max(0, int(starts[k] - np.median(others)))
    kept = np.flatnonzero(use)
    return (
        tree.steps.index[step[kept]],
        comm.rank[kept].astype(np.int64),
        tree.name[comm.node[kept]].astype(np.int64),
        late[kept].astype(float),
        (comm.end_ns[kept] - comm.start_ns[kept]).astype(float),
        comm.node[kept],
        last[kept],
    )


#: Per-rank work measures scored beside the step's wall time: GPU compute (kernels and copies,
#: not collectives) and host compute (self time of Python frames, operators and runtime calls).
_GPU_WORK = frozenset(LAYER_CODE[n] for n in ("kernel", "memcpy", "memset"))
_HOST_WORK = frozenset(LAYER_CODE[n] for n in ("cpu_op", "runtime"))
#: Runtime calls whose time is mostly waiting for the GPU (syncs, blocking copies), not host work (Python frames are left out of
#: host work for the same reason: their self time holds waits the profiler does not name).
_WAITING_CALL = re.compile(
    r"ynchronize|Query|WaitEvent|Memcpy|wait_tensor|c10d::wait", re.IGNORECASE
)


def _waiting_names(tree: CallTree) -> frozenset[int]:
    """Name ids of the calls that mostly wait (`_WAITING_CALL`)."""
    return frozenset(i for i, name in enumerate(tree.names) if _WAITING_CALL.search(name))


#: Log-ratio scale floor for per-rank components (they are noisier than whole steps).
MIN_COMPONENT_SCALE = 0.05


def _component_scores(
    tree: CallTree, iterations: list[int], kinds: np.ndarray, tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration: the largest robust z (and its ratio) of any rank's GPU or host work, against
    the same rank's work in nearest-composition steps (temporal) and against its peers (imbalance)."""
    steps = tree.steps
    count = len(steps)
    in_step = tree.step >= 0
    gpu = in_step & np.isin(tree.layer, list(_GPU_WORK)) & (tree.stream >= 0)
    host = in_step & np.isin(tree.layer, list(_HOST_WORK)) & (tree.stream < 0)
    host &= ~np.isin(tree.name, list(_waiting_names(tree)))
    measures = [  # (per step row, compare across ranks too?)
        (np.bincount(tree.step[gpu], weights=tree.dur[gpu], minlength=count), True),
        (np.bincount(tree.step[host], weights=tree.self_ns[host], minlength=count), True),
    ]
    arrivals = _arrivals(tree)
    if arrivals is not None:
        _, _, _, late_ns, own_ns, node, is_last = arrivals
        # lateness: how long after its peers each rank reached the step's collectives (a
        # straggler's own signature, invisible in its compute when something else delayed it)
        rows = tree.step[node]
        measures.append((np.bincount(rows, weights=late_ns, minlength=count) + 1000.0, True))
        # transfer: the last arriver's own collective time has no waiting in it
        rows = tree.step[node[is_last]]
        measures.append((np.bincount(rows, weights=own_ns[is_last], minlength=count), False))
    position = {it: i for i, it in enumerate(iterations)}
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
        # temporal: this rank against its own median in steps of the same kind and similar size
        temporal = np.zeros_like(logs)
        for kind in set(kinds.tolist()):
            rows = np.flatnonzero(kinds == kind)
            order = rows[np.argsort(tokens[rows])]
            for pos, row in enumerate(order.tolist()):
                window = order[max(0, pos - 4) : pos + 5]
                window = window[window != row]
                if len(window):
                    temporal[row] = logs[row] - np.nanmedian(logs[window], axis=0)
        scores.append(temporal)
        for score in scores:
            finite = np.where(np.isfinite(score), score, 0.0)
            centre = np.median(finite, axis=0, keepdims=True)
            spread = 1.4826 * np.median(np.abs(finite - centre), axis=0, keepdims=True)
            z = (finite - centre) / np.maximum(spread, MIN_COMPONENT_SCALE)
            worst = z.max(axis=1)
            better = worst > best_z
            best_z = np.where(better, worst, best_z)
            best_ratio = np.where(better, np.exp((finite - centre).max(axis=1)), best_ratio)
    return best_z, best_ratio


def _setup_of(tree: CallTree) -> tuple[int, frozenset[str]]:
    """A run's setup fingerprint: its rank count and the names of the operators and kernels that
    ran in its steps (the model, engine and kernels chosen)."""
    work = (tree.step >= 0) & np.isin(tree.layer, list(COMPUTE_LAYERS))
    names = frozenset(tree.names[n] for n in np.unique(tree.name[work]).tolist())
    return len(np.unique(tree.steps.rank)), names


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


FRESH = (NEW_OPERATOR, SUBSTITUTED)


def keep_top(candidates: list[OperatorCandidate], k: int) -> list[OperatorCandidate]:
    """The first k of candidates ranked best first, in their order, except that up to k // 2
    new operators stay whatever their place, in place of the last others.

    Why: a swapped-in kernel's whole time is its excess, often less than an idle gap elsewhere in
    a noisy step, yet an operator the usual work never runs is the strongest structural evidence
    a step has; cut by rank alone, it would never reach the pointer that weighs it."""
    fresh = [i for i, c in enumerate(candidates) if c.reference in FRESH][: k // 2]
    others = [i for i, c in enumerate(candidates) if c.reference not in FRESH]
    kept = sorted(fresh + others[: max(k - len(fresh), 0)])
    return [candidates[i] for i in kept]


def _nearest(
    iteration: int,
    normal: list[int],
    kind_of: dict[int, str],
    tokens_of: dict[int, float],
    count: int,
) -> list[int]:
    normal = [n for n in normal if n != iteration]  # a step proposed while normal is not its own
    same_kind = [n for n in normal if kind_of.get(n) == kind_of.get(iteration)] or normal
    target = tokens_of.get(iteration, 0.0)
    return sorted(
        same_kind, key=lambda n: (abs(tokens_of.get(n, 0.0) - target), abs(n - iteration))
    )[:count]


def _small_median(values: list[int]) -> float:
    """The median of a short list. Why not np.median: candidates take one per operator per
    step (hundreds of thousands per run), where its array overhead was most of the time."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return float(ordered[half]) if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2.0


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
