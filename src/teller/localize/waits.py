"""On a one-rank file of a larger job, the same collective in the rank's other steps: one that took
far longer than it ever did.

A collective kernel's time is mostly the wait for the last peer to arrive, and where the trace
holds the peers `teller.localize.collectives` scores who arrived when. A file of one rank out of
16 or 128 (what a per-rank profiler writes) holds none of them: its collectives vary from step to
step with peers it never saw, so by tens of percent and, at some slots, by several times (a
send/recv that waits in some steps and not in others). A collective is an outlier here only when
it took longer than it did in *every* other like step by several times the spread it shows there,
so a slot that sometimes waits long is judged against its own long waits. What the rank cannot
tell is why it waited: a peer that arrived late and a slower link look alike from one rank.

Collectives are matched by their kernel name and stream and their occurrence among those in the
step; a step that runs a different number of them (a first iteration's extra broadcast, DDP
buckets that fire differently under activation checkpointing) is left out of that comparison:
its k-th collective need not be the others' k-th.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from teller.callchain.facts import RunFacts, run_ordinals
from teller.callchain.tree import CallTree
from teller.ingest.schema import LAYER_CODE
from teller.localize.repeats import MAX_STEPS, MIN_STEPS, like_steps

#: An outlier exceeds every other like step's time at its slot by this many spreads, where the
#: spread is the larger of the slot's own range over the other steps and the run's median range
#: over its collective slots: a collective that waits a little longer now and then is not one.
SPREADS = 3.0
#: Against one other step the slot's own range is unknown, and the run's median range of two
#: values is a poor guess of it: the bar is twice as high.
ONE_REFERENCE_SPREADS = 6.0
#: Fewest share of the step the excess over the other steps' median takes: a per-rank trace's
#: collectives move by a fraction of a percent of a step all the time.
MIN_SHARE = 0.01
#: How a wait candidate's reference begins (`OperatorCandidate.reference`).
WAIT_REFERENCE = "same collective"


@dataclass(frozen=True)
class CollectiveWait:
    """One collective kernel far longer than the same collective in the rank's other steps."""

    iteration: int
    rank: int
    node: int
    name: int  # the kernel's name id
    occurrence: int  # which of the step's collectives of this name and stream, from 0
    dur_ns: int
    reference_ns: float  # median of the same collective in the steps compared
    ceiling_ns: float  # the longest it took in those steps
    compared: int  # how many other steps ran it
    spreads: float  # its excess over the ceiling, in spreads
    step_share: float  # excess over the reference / the step's duration

    @property
    def excess_ns(self) -> float:
        return float(self.dur_ns) - self.reference_ns


def collective_waits(
    facts: RunFacts, min_share: float = MIN_SHARE, noise_floor_ns: float = 2_000.0
) -> dict[int, list[CollectiveWait]]:
    """iteration → its collectives far longer than in every other like step, largest first.
    Only for a trace of one rank with a few steps (`repeats.MAX_STEPS`): with peers in the trace
    their arrivals tell more, and over many steps the step model judges the step."""
    tree = facts.tree
    if len(facts.ranks) != 1 or not MIN_STEPS <= len(tree.steps) <= MAX_STEPS:
        return {}
    kernels = _collective_kernels(tree)
    if not len(kernels):
        return {}
    groups = like_steps(tree, tree.steps.rank)
    step_row = _launching_step(tree, kernels)
    # (group, name, stream) identifies a kind of collective; its occurrence in the step, a slot
    kind_key = np.unique(
        np.stack([groups[step_row], tree.name[kernels], tree.stream[kernels]]),
        axis=1,
        return_inverse=True,
    )[1].reshape(-1)
    order = np.lexsort((tree.start[kernels], step_row, kind_key))
    kernels, step_row, kind_key = kernels[order], step_row[order], kind_key[order]
    occurrence = run_ordinals(kind_key, step_row)
    # a step that runs a kind as often as most like steps do is compared at that kind
    pairs, pair_of, count = np.unique(
        np.stack([kind_key, step_row]), axis=1, return_inverse=True, return_counts=True
    )
    usual = _modal_count(pairs[0], count)
    keep = count[pair_of.reshape(-1)] == usual[kind_key]
    kernels, step_row, kind_key, occurrence = (
        kernels[keep],
        step_row[keep],
        kind_key[keep],
        occurrence[keep],
    )
    slot = np.unique(np.stack([kind_key, occurrence]), axis=1, return_inverse=True)[1].reshape(-1)
    dur = tree.dur[kernels].astype(np.float64)
    found: dict[int, list[CollectiveWait]] = {}
    for group in np.unique(groups[step_row]).tolist():
        mine = np.flatnonzero(groups[step_row] == group)
        out = _outliers(
            tree,
            kernels[mine],
            step_row[mine],
            slot[mine],
            dur[mine],
            occurrence[mine],
            min_share,
            noise_floor_ns,
        )
        for w in out:
            found.setdefault(w.iteration, []).append(w)
    return {it: sorted(ws, key=lambda w: -w.excess_ns) for it, ws in found.items()}


def _outliers(
    tree: CallTree,
    kernels: np.ndarray,
    step_row: np.ndarray,
    slot: np.ndarray,
    dur: np.ndarray,
    occurrence: np.ndarray,
    min_share: float,
    noise_floor_ns: float,
) -> list[CollectiveWait]:
    """The collectives of one group of like steps that exceed every other step's time at their
    slot by the bar (`SPREADS`)."""
    by_slot: dict[int, np.ndarray] = {}
    for i, s in enumerate(slot.tolist()):
        by_slot.setdefault(s, []).append(i)
    rows = {s: np.array(v) for s, v in by_slot.items() if len(v) >= MIN_STEPS}
    ranges = [float(np.ptp(dur[v])) for v in rows.values()]
    if not ranges:
        return []
    run_spread = max(float(np.median(ranges)), noise_floor_ns)
    out = []
    for v in rows.values():
        for i in v.tolist():
            others = dur[v[v != i]]
            ceiling, reference = float(others.max()), float(np.median(others))
            spread = max(float(np.ptp(others)), run_spread)
            bar = (SPREADS if len(others) >= 2 else ONE_REFERENCE_SPREADS) * spread
            step = int(step_row[i])
            share = (dur[i] - reference) / max(float(tree.steps.dur_ns[step]), 1.0)
            if dur[i] - ceiling < bar or share < min_share:
                continue
            out.append(
                CollectiveWait(
                    iteration=int(tree.steps.index[step]),
                    rank=int(tree.steps.rank[step]),
                    node=int(kernels[i]),
                    name=int(tree.name[kernels[i]]),
                    occurrence=int(occurrence[i]),
                    dur_ns=int(dur[i]),
                    reference_ns=reference,
                    ceiling_ns=ceiling,
                    compared=len(others),
                    spreads=float((dur[i] - ceiling) / spread),
                    step_share=float(share),
                )
            )
    return out


def _collective_kernels(tree: CallTree) -> np.ndarray:
    """Tree nodes of the collective kernels launched inside a step (the readers' `comm`
    layer, on a GPU stream)."""
    kernels = np.flatnonzero((tree.layer == LAYER_CODE["comm"]) & (tree.stream >= 0))
    return kernels[_launching_step(tree, kernels) >= 0]


def _launching_step(tree: CallTree, kernels: np.ndarray) -> np.ndarray:
    """Per kernel: the step row of the host call that launched it, else the step it ran in. A
    collective that a long wait pushed past its step's end is still that step's."""
    launcher = tree.parent[kernels]
    on_host = (launcher >= 0) & (tree.stream[np.maximum(launcher, 0)] < 0)
    return np.where(on_host, tree.step[np.maximum(launcher, 0)], tree.step[kernels]).astype(
        np.int64
    )


def _modal_count(kind: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per collective kind (by id): how many times most steps run it (the larger on a tie)."""
    out = np.zeros(int(kind.max()) + 1, dtype=np.int64)
    for k in np.unique(kind).tolist():
        values, times = np.unique(count[kind == k], return_counts=True)
        out[k] = int(values[times == times.max()].max())
    return out
