"""Numeric candidate localization: which steps are slow, and which (rank, operator) explains it.

The method narrows the search for the root-cause model and is a complete diagnosis on its own.
`NumericLocalizer` composes its parts, each in its own module:

1. **Steps** (`step_model`): a step's duration against what its batch composition predicts; a
   step is anomalous when its robust z passes `step_z` and it is at least `min_ratio` slower than
   expected.
2. **Operators** (`candidates`): in an anomalous step, every operator instance's self time against
   the same instance in the nearest normal steps, on the peer ranks, or in the step's other layers.
3. **Collectives** (`collectives`): scored by arrival, never duration.
4. **Persistent operator shifts** (`shifts`): one operator on one rank slower than on its peers
   for several steps in a row flags those steps even when the step time hides it, and is their
   first candidate.
5. **GPU idle gaps** (`idle`): host work that delayed the GPU's next launch.
6. **Hangs** (`hang`): the step a collective never finished.
7. **Layers** (`layers`): inside one step, an operator instance far slower than the same slot in
   the step's other repeated layers flags the step and is a candidate, with its layer; this is
   the comparison a one-step, one-rank capture still allows.
8. **Repeats** (`repeats`): in a capture of a few steps, a kernel far slower than the same
   launch of the same operator call in the rank's other steps, or on the other ranks in the
   same step, flags its step and is a candidate; a slower kernel that made nothing later (the
   GPU caught up on host slack) still shows there.
9. **Waits** (`waits`): on a one-rank file of a larger job with a few steps, a collective far
   longer than the same collective took in every other step (the rank waited for a peer the
   file does not hold, or on a slower link) flags its step and is a candidate.

Step models are fitted from the normal runs of the same setup only (rank count and operator
names); a case from another setup is judged against its own quieter steps.

Hyper-parameters live in `__init__`; learned state in attributes ending in `_` (scikit-learn
shape), so the baselines and the scoreboard treat every method alike.
"""

from __future__ import annotations

import re

from teller.callchain.facts import RunFacts
from teller.callchain.render import format_ns
from teller.callchain.tree import CallTree
from teller.ingest.schema import GPU_WORK_CODES, LAYER_CODE
from teller.localize.candidates import FRESH, keep_top, propose
from teller.localize.collectives import late_in_step
from teller.localize.hang import HANG_NS, hang_explanation, unfinished_step
from teller.localize.layers import LayerOutlier, layer_outliers
from teller.localize.repeats import ACROSS_RANKS, MAX_STEPS, RepeatOutlier, repeat_outliers
from teller.localize.results import Localization, OperatorCandidate, StepExplanation, StepScore
from teller.localize.shifts import OperatorShift, operator_shifts
from teller.localize.step_model import (
    NormalRun,
    StepModel,
    ratio_z,
    same_setup_models,
    score_steps,
)
from teller.localize.waits import WAIT_REFERENCE, CollectiveWait, collective_waits

#: Runtime calls that put work on a GPU queue (and block when it is full).
LAUNCH_CALL = re.compile(r"Launch", re.IGNORECASE)
#: A kernel's excess over its normal, as a share of the launch calls' excess, from which the
#: launches are taken to have waited behind it.
BLOCKED_SHARE = 0.25

__all__ = [
    "FRESH",
    "HANG_NS",
    "Localization",
    "NumericLocalizer",
    "OperatorCandidate",
    "StepExplanation",
    "StepScore",
    "hang_explanation",
    "keep_top",
    "unfinished_step",
]


#: Below this many steps per rank, a rank's lateness is judged against its peers inside the step.
FEW_STEPS = 3


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
        layer_share: float | None = 0.01,
        repeat_share: float | None = 0.005,
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
        # an instance slower than its slot in the other layers by this share of its step flags
        # the step (None: no layer comparison)
        self.layer_share = layer_share
        # a kernel slower than the same launch in the run's other steps by this share of its
        # step flags the step (None: no comparison across steps). Lower than `layer_share`: the
        # same launch of the same call varies less from step to step than a slot across layers
        self.repeat_share = repeat_share

    def fit(self, normal_trees: list[CallTree]) -> NumericLocalizer:
        """Remember the fault-free runs' steps, each run with its setup's fingerprint.

        Step models are fitted at `score` time from the normal runs of the same setup only
        (`step_models`): a step time means nothing next to another model's, engine's or
        cluster's."""
        runs: list[NormalRun] = []
        for tree in normal_trees:
            facts = RunFacts(tree)
            runs.append((facts.setup, facts.iterations))
        self.normal_runs_ = runs
        return self

    def step_models(self, facts: RunFacts) -> dict[str, StepModel]:
        """Per-kind step models from the normal runs whose setup matches this run's."""
        return same_setup_models(getattr(self, "normal_runs_", []), facts.setup)

    def score(self, tree: CallTree, facts: RunFacts | None = None) -> Localization:
        """Scored steps and the candidates of the proposed ones; `facts`: the tree's `RunFacts`
        where the caller has them (computed here otherwise)."""
        facts = RunFacts.of(tree, facts)
        steps = score_steps(
            facts, self.step_models(facts), self.self_fit_keep, self.step_z, self.min_ratio
        )
        shifts = self._operator_shifts(facts)
        layered = self._layer_outliers(facts)
        repeated = self._repeat_outliers(facts)
        late = self._late_in_step(facts)
        waited = self._collective_waits(facts)
        only_shifted = set()
        for step in steps:
            if step.iteration in shifts and not step.anomalous:
                step.anomalous = True
                only_shifted.add(step.iteration)
            elif not step.anomalous and any(
                step.iteration in found for found in (layered, repeated, late, waited)
            ):
                step.anomalous = True
        if self.candidate_z is None:
            proposed = {s.iteration for s in steps if s.anomalous}
        else:
            proposed = {s.iteration for s in steps if s.anomalous or s.z >= self.candidate_z}
        candidates = (
            propose(facts, proposed, steps, self.top_k, self.noise_floor_ns) if proposed else {}
        )
        for iteration, found_shifts in shifts.items():
            found = [_shift_candidate(tree, s) for s in found_shifts]
            named = {(c.rank, c.operator) for c in found}
            rest = [c for c in candidates.get(iteration, []) if (c.rank, c.operator) not in named]
            if iteration in only_shifted:  # the step hid it: the persistent shift is the finding
                candidates[iteration] = (found + rest)[: self.top_k]
            else:  # a slow step: the shift is one more explanation, ranked by its excess
                candidates[iteration] = sorted(found + rest, key=lambda c: -c.score)[: self.top_k]
        in_step: dict[int, list[OperatorCandidate]] = {}
        for iteration, outliers in layered.items():
            in_step.setdefault(iteration, []).extend(_layer_candidate(tree, o) for o in outliers)
        for iteration, repeats in repeated.items():
            in_step.setdefault(iteration, []).extend(_repeat_candidate(tree, o) for o in repeats)
        for iteration, found in late.items():
            in_step.setdefault(iteration, []).extend(found)
        for iteration, waits in waited.items():
            in_step.setdefault(iteration, []).extend(_wait_candidate(tree, w) for w in waits)
        for iteration, found in in_step.items():
            named = {(c.rank, c.operator) for c in found}
            rest = [c for c in candidates.get(iteration, []) if (c.rank, c.operator) not in named]
            candidates[iteration] = sorted(found + rest, key=lambda c: -c.score)[: self.top_k]
        for iteration, found in candidates.items():
            candidates[iteration] = _behind_slow_gpu_work(tree, found)
        hang = unfinished_step(tree, facts)
        if hang is not None:
            step, candidate = hang
            steps.append(step)
            candidates[step.iteration] = [candidate]
        return Localization(
            steps=steps,
            candidates=candidates,
            shifted={it: max(s.excess_ns for s in found) for it, found in shifts.items() if found},
        )

    def _operator_shifts(self, facts: RunFacts) -> dict[int, list[OperatorShift]]:
        if not self.operator_shifts:
            return {}
        return facts.derived(
            "operator_shifts", lambda: operator_shifts(facts.tree, waiting=facts.waiting)
        )

    def _late_in_step(self, facts: RunFacts) -> dict[int, list[OperatorCandidate]]:
        """Late arrivals judged inside their step, where the run has too few steps for a rank's
        usual skew (`collectives`, across steps) to be known."""
        steps_per_rank = len(facts.tree.steps) // max(len(facts.ranks), 1)
        if self.layer_share is None or steps_per_rank >= FEW_STEPS:
            return {}
        share = self.layer_share
        return facts.derived(
            f"late_in_step@{share}@{self.noise_floor_ns}",
            lambda: late_in_step(facts.tree, facts.arrivals, share, self.noise_floor_ns),
        )

    def _repeat_outliers(self, facts: RunFacts) -> dict[int, list[RepeatOutlier]]:
        if self.repeat_share is None:
            return {}
        share = self.repeat_share
        return facts.derived(
            f"repeat_outliers@{share}@{self.noise_floor_ns}",
            lambda: repeat_outliers(facts, min_share=share, noise_floor_ns=self.noise_floor_ns),
        )

    def _collective_waits(self, facts: RunFacts) -> dict[int, list[CollectiveWait]]:
        if self.repeat_share is None:
            return {}
        return facts.derived(
            f"collective_waits@{self.noise_floor_ns}",
            lambda: collective_waits(facts, noise_floor_ns=self.noise_floor_ns),
        )

    def _layer_outliers(self, facts: RunFacts) -> dict[int, list[LayerOutlier]]:
        """The step's own layers compared: on one rank at any length (no peer to compare
        with), on several only in a capture of few steps (`MAX_STEPS`), where neither the step
        model nor the rank's other steps give a reference."""
        if self.layer_share is None:
            return {}
        steps_per_rank = len(facts.tree.steps) / max(len(facts.ranks), 1)
        if len(facts.ranks) > 1 and steps_per_rank > MAX_STEPS:
            return {}
        share = self.layer_share
        return facts.derived(
            f"layer_outliers@{share}@{self.noise_floor_ns}",
            lambda: layer_outliers(facts, min_share=share, noise_floor_ns=self.noise_floor_ns),
        )


def _behind_slow_gpu_work(
    tree: CallTree, candidates: list[OperatorCandidate]
) -> list[OperatorCandidate]:
    """A step's candidates with kernel launches that blocked behind a slower kernel put after it.

    A launch call blocks when the GPU's queue is full, so a kernel that ran far over its normal
    makes the launches behind it take longer, often by more than its own excess (every launch
    queued behind it waits). Where a rank's launch calls and one of its kernels or copies are
    both candidates and the kernel's excess is at least `BLOCKED_SHARE` of the launches', the
    kernel is the cause and ranks first; launches that are slower on their own (a contended
    host) come with no slower kernel beside them."""
    gpu_excess: dict[int, float] = {}
    for c in candidates:
        if c.node >= 0 and tree.layer[c.node] in GPU_WORK_CODES:
            excess = float(c.observed_ns - c.normal_ns)
            gpu_excess[c.rank] = max(gpu_excess.get(c.rank, 0.0), excess)

    def blocked(c: OperatorCandidate) -> bool:
        return (
            c.kind == "compute"
            and c.node >= 0
            and tree.layer[c.node] == LAYER_CODE["runtime"]
            and bool(LAUNCH_CALL.search(c.operator))
            and gpu_excess.get(c.rank, 0.0) >= BLOCKED_SHARE * (c.observed_ns - c.normal_ns)
        )

    held = [c for c in candidates if blocked(c)]
    return [c for c in candidates if not blocked(c)] + held if held else candidates


def _found_candidate(
    tree: CallTree,
    found: RepeatOutlier | CollectiveWait | LayerOutlier,
    observed_ns: int,
    normal_ns: float,
    z: float,
    reference: str,
    kind: str = "compute",
) -> OperatorCandidate:
    """The candidate of one comparison's outlier, scored by its excess over its reference."""
    return OperatorCandidate(
        iteration=found.iteration,
        rank=found.rank,
        operator=tree.names[found.name],
        score=found.excess_ns,
        observed_ns=observed_ns,
        normal_ns=int(normal_ns),
        z=z,
        node=found.node,
        reference=reference,
        kind=kind,
    )


def _repeat_candidate(tree: CallTree, outlier: RepeatOutlier) -> OperatorCandidate:
    if outlier.on_gpu:
        what = (
            f"same launch (kernel {outlier.position + 1} of call {outlier.launch_ordinal + 1} "
            f"to {tree.names[outlier.launcher]})"
        )
    else:
        what = f"same frame (call {outlier.launch_ordinal + 1}), its own time,"
    reference = f"{what} {_compared_with(outlier)}"
    return _found_candidate(
        tree, outlier, outlier.dur_ns, outlier.reference_ns, outlier.z, reference
    )


def _wait_candidate(tree: CallTree, wait: CollectiveWait) -> OperatorCandidate:
    steps = "step" if wait.compared == 1 else f"{wait.compared} steps"
    reference = (
        f"{WAIT_REFERENCE} (call {wait.occurrence + 1} of it in the step) in the run's other "
        f"{steps}, {format_ns(wait.ceiling_ns)} at most there"
    )
    return _found_candidate(
        tree, wait, wait.dur_ns, wait.reference_ns, wait.spreads, reference, kind="wait"
    )


def _compared_with(outlier: RepeatOutlier) -> str:
    if outlier.across == ACROSS_RANKS:
        if outlier.compared == 1:
            return "on the other rank in this step"
        return f"on the other {outlier.compared} ranks in this step"
    if outlier.compared == 1:
        return "in the run's other step"
    return f"in the run's other {outlier.compared} steps"


def _layer_candidate(tree: CallTree, outlier: LayerOutlier) -> OperatorCandidate:
    reference = (
        f"same operator at the same place in the step's other {outlier.layers - 1} "
        f"repeated layers; this is layer {outlier.layer + 1} of {outlier.layers}"
    )
    return _found_candidate(
        tree, outlier, outlier.self_ns, outlier.sibling_ns, outlier.z, reference
    )


def _shift_candidate(tree: CallTree, shift: OperatorShift) -> OperatorCandidate:
    return OperatorCandidate(
        iteration=shift.iteration,
        rank=shift.rank,
        operator=tree.names[shift.name],
        score=shift.excess_ns,
        observed_ns=shift.observed_ns,
        normal_ns=int(shift.usual_ratio * shift.peers_ns),
        z=ratio_z(shift.observed_ns, max(shift.usual_ratio * shift.peers_ns, 1.0)),
        node=shift.node,
        reference=f"same operator on peer ranks, same step; shifted for {shift.steps} steps",
        kind="shift",
    )
