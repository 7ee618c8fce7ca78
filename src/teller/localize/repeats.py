"""Across the run's steps and ranks, the same kernel launch of the same operator call: one far
from the rest.

A training or serving loop runs the same calls in every step, so the k-th kernel that the n-th
`aten::convolution_backward` of a step launches should take what it takes in the other steps.
This is the comparison a capture of a few steps allows where neither the step's duration (the GPU
catches up on host slack, so a slower kernel often makes nothing later) nor the step's own layers
(a ResNet's blocks are not alike) tell: a kernel's own duration does not move with the delays
around it. Data-, sequence- and tensor-parallel ranks run the same calls in one step too, so in
a capture of one step on several ranks (an nsys export of a 2-GPU job) a launch is compared with
its peers' in the same step.

Kernels are matched by their launching operator call's place in the step's sequence of launching
calls (aligned across like steps: same rank, or same iteration on the ranks, with the same kind
and batch) and their position among that call's launches, not by the kernel's name: cuDNN and
MIOpen pick different algorithms, so different kernel names, for one call from step to step. A
call that launches a different number of kernels in some step (autotuning, a split-K GEMM's
extra reduction, a data-dependent embedding backward) is compared only with the steps where it
launched as many: its positions do not line up with the others'. Host frames (user annotations,
Python frames) are compared the same way across steps, by their own time.

The reference is the median of the other like steps; the spread is floored at `RELATIVE_NOISE`
of it, since two to eight steps give no spread worth the name. An outlier must also be a real share of
its step (`min_share`), and a step where many launches stand out is slower as a whole (a clock
or power cap), which the step model judges, not one kernel.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from difflib import SequenceMatcher

import numpy as np

from teller.callchain.facts import RunFacts, run_ordinals
from teller.callchain.tree import EDGE_LAUNCH, CallTree
from teller.ingest.schema import GPU_WORK_CODES, LAYER_CODE

#: What an outlier was compared with: the rank's other like steps, or its peers in this step.
ACROSS_STEPS, ACROSS_RANKS = "steps", "ranks"
#: Fewest steps per rank (or ranks per step) for the comparison: the outlier against at least one other step.
MIN_STEPS = 2
#: Most steps per rank for the comparison. A run with more has the step model and each
#: instance's nearest normal steps (`teller.localize.candidates`) to judge it; over hundreds of
#: short serving steps a microsecond kernel's jitter alone passes this comparison's bar somewhere.
MAX_STEPS = 8
#: A launch's spread across steps is floored at this share of its median: kernels of one shape
#: and size vary this much from step to step.
RELATIVE_NOISE = 0.1
#: Host frames compared by self time: user annotations and Python frames.
FRAME_CODES = frozenset({LAYER_CODE["engine"], LAYER_CODE["python"]})
#: The spread floor of a frame's self time: Python overheads vary by half from step to step, so
#: an outlier is four times the others' (z 6), a stall rather than jitter.
FRAME_NOISE = 0.5
#: The floor where the launch ran in one other step only: its spread unknown, an outlier must be
#: several times that step's duration (z 6: seven times), not the tens of percent that
#: data-dependent kernels (an embedding lookup) vary by between two steps.
ONE_REFERENCE_NOISE = 1.0
#: Robust z an outlier reaches: with the floor above, 6 is 60% over the other steps' median.
Z_MIN = 6.0
#: More outliers than this share of a step's compared launches: the step is slower as a whole.
STEP_WIDE = 0.05


@dataclass(frozen=True)
class RepeatOutlier:
    """One kernel launch slower than the same launch of the same call in the run's other steps
    (or on the peers), or one host frame with more self time than the same frame's."""

    iteration: int
    rank: int
    node: int  # the kernel's node (the frame's)
    name: int  # the kernel's name id (the frame's)
    launcher: int  # name id of the operator whose call launched it (the frame's own)
    launch_ordinal: int  # which call of that operator in the step, from 0
    position: int  # which of that call's launches, from 0 (0 for a frame)
    dur_ns: int  # the kernel's duration (the frame's self time)
    reference_ns: float  # median of the same in the steps compared
    on_gpu: bool
    compared: int  # how many other steps ran it
    across: str  # ACROSS_STEPS (the rank's other like steps) or ACROSS_RANKS (this step's peers)
    z: float
    step_share: float  # excess over the reference / the step's duration on this rank

    @property
    def excess_ns(self) -> float:
        return float(self.dur_ns) - self.reference_ns


@dataclass(frozen=True)
class _Work:
    """What is compared, one row per item, sorted by call then time: a kernel or copy with its
    launching call (a step-node row) and its position among that call's launches, by duration;
    or a host frame itself (position 0), by self time."""

    node: np.ndarray  # tree node of the kernel, copy or frame
    call: np.ndarray  # step-node row of the launching call (the frame's own)
    position: np.ndarray
    launches_of_call: np.ndarray
    name_position: np.ndarray  # which of the call's launches of this kernel name, from 0
    step_row: np.ndarray  # the call's step
    value_ns: np.ndarray  # float: a launch's duration, a frame's self time
    on_gpu: bool

    @classmethod
    def launches(cls, facts: RunFacts) -> _Work:
        tree, nodes = facts.tree, facts.step_nodes
        position_of = np.full(len(tree.name), -1, dtype=np.int64)
        position_of[nodes.node] = np.arange(len(nodes.node))
        # a kernel that ran past its step's end belongs to the step that launched it
        launched = _launched(facts)
        runtime = tree.parent[launched]
        call = position_of[np.where(runtime >= 0, tree.parent[np.maximum(runtime, 0)], -1)]
        keep = (runtime >= 0) & (call >= 0)
        launched, call = launched[keep], call[keep]
        order = np.lexsort((tree.start[launched], call))
        launched, call = launched[order], call[order]
        return cls(
            node=launched,
            call=call,
            position=run_ordinals(call),
            launches_of_call=np.bincount(call, minlength=len(nodes.node))[call],
            name_position=_name_ordinals(call, tree.name[launched]),
            step_row=nodes.step[call].astype(np.int64),
            value_ns=tree.dur[launched].astype(np.float64),
            on_gpu=True,
        )

    @classmethod
    def frames(cls, facts: RunFacts) -> _Work:
        """The host frames that hold operators: user annotations (`record_function`, a module's
        NVTX range) and Python frames, not the steps' own. A thread that stopped between two
        operators shows as its frame's self time, which is small and steady from step to step;
        operators' own host time is not compared (an allocator stall, a cuDNN autotune or a
        launch into a full queue moves it by milliseconds in clean captures)."""
        tree, nodes = facts.tree, facts.step_nodes
        rows = np.flatnonzero(
            ~nodes.on_gpu
            & np.isin(nodes.layer, list(FRAME_CODES))
            & ~np.isin(nodes.node, tree.steps.node)
        )
        one = np.ones(len(rows), dtype=np.int64)
        return cls(
            node=nodes.node[rows],
            call=rows,
            position=one * 0,
            launches_of_call=one,
            name_position=one * 0,
            step_row=nodes.step[rows].astype(np.int64),
            value_ns=nodes.self_ns[rows].astype(np.float64),
            on_gpu=False,
        )


def repeat_outliers(
    facts: RunFacts, min_share: float = 0.005, noise_floor_ns: float = 2_000.0
) -> dict[int, list[RepeatOutlier]]:
    """iteration → its launches far from the same launch in the other steps of the rank, or on
    the other ranks in the same step, and its frames far from the same frame in the rank's other
    steps, largest first (a launch found both ways: the larger z).

    Collective kernels never take part: their time is mostly the wait for the last peer to
    arrive (which `teller.localize.collectives` scores where the peers are in the trace), and on
    one rank of a larger job it varies with peers the trace never saw (`teller.localize.waits`
    judges it there against its own spread)."""
    tree = facts.tree
    steps_per_rank = len(tree.steps) / max(len(facts.ranks), 1)
    if not len(tree.steps) or steps_per_rank > MAX_STEPS:
        return {}
    # (what, grouped how, compared across, by kernel name): launches across steps and ranks,
    # by position among the call's launches and by name; frames across steps
    across_steps = _step_groups(tree) if steps_per_rank >= MIN_STEPS else None
    across_ranks = _peer_groups(tree) if len(facts.ranks) >= MIN_STEPS else None
    launches, frames = _Work.launches(facts), _Work.frames(facts)
    comparisons = [
        (launches, across_steps, ACROSS_STEPS, False),
        (launches, across_steps, ACROSS_STEPS, True),
        (launches, across_ranks, ACROSS_RANKS, False),
        (launches, across_ranks, ACROSS_RANKS, True),
        (frames, across_steps, ACROSS_STEPS, False),
    ]
    found: list[RepeatOutlier] = []
    for work, groups, across, by_name in comparisons:
        if groups is not None and len(work.node):
            found += _outliers(facts, work, groups, across, by_name, min_share, noise_floor_ns)
    best: dict[int, RepeatOutlier] = {}
    for o in found:
        if o.node not in best or o.z > best[o.node].z:
            best[o.node] = o
    out: dict[int, list[RepeatOutlier]] = {}
    for o in best.values():
        out.setdefault(o.iteration, []).append(o)
    return {it: sorted(group, key=lambda o: -o.excess_ns) for it, group in out.items()}


def _outliers(
    facts: RunFacts,
    work: _Work,
    groups: np.ndarray,
    across: str,
    by_name: bool,
    min_share: float,
    noise_floor_ns: float,
) -> list[RepeatOutlier]:
    """The items of `work` far from the same item in the other steps of their group (`groups`:
    per step row, its group of like steps). A launch is the same launch by its position among
    the call's launches where the call launched as many, or (`by_name`) by its kernel name and
    its place among the call's launches of that name: a split-K GEMM adds a reduction kernel
    in some steps, and its GEMM is still the other steps' GEMM."""
    tree, nodes = facts.tree, facts.step_nodes
    slot = _call_slots(facts, groups, np.unique(work.call))[work.call]
    aligned = slot >= 0
    launched, call = work.node[aligned], work.call[aligned]
    position, step_row = work.position[aligned], work.step_row[aligned]
    group = groups[step_row]
    if not len(launched):
        return []
    if by_name:
        what = [tree.name[launched], work.name_position[aligned]]
    else:
        what = [position, work.launches_of_call[aligned]]
    place = np.stack([group, slot[aligned], *what])
    _, key = np.unique(place, axis=1, return_inverse=True)
    key = key.reshape(-1)
    dur = work.value_ns[aligned]
    ran = np.bincount(key)  # a slot is one call per step: one value per (key, step)
    group_size = np.bincount(groups)[group]
    comparable = ran[key] >= np.maximum(MIN_STEPS, group_size // 2 + 1)
    reference = _others_median(key, dur)
    excess = dur - reference
    # against one other step the launch's spread is unknown: only a far larger gap counts
    relative = RELATIVE_NOISE if work.on_gpu else FRAME_NOISE
    noise = np.where(ran[key] > MIN_STEPS, relative, max(relative, ONE_REFERENCE_NOISE))
    z = excess / np.maximum(noise * reference, noise_floor_ns / 4.0)
    step_dur = tree.steps.dur_ns[step_row].astype(np.float64)
    share = excess / np.maximum(step_dur, 1.0)
    hits = np.flatnonzero(
        comparable & (z >= Z_MIN) & (excess >= noise_floor_ns) & (share >= min_share)
    )
    compared = np.bincount(step_row[comparable], minlength=len(tree.steps))
    outliers = np.bincount(step_row[hits], minlength=len(tree.steps))
    out = []
    for h in hits.tolist():
        row = int(step_row[h])
        if outliers[row] > max(2, STEP_WIDE * compared[row]):
            continue  # the step is slower as a whole
        out.append(
            RepeatOutlier(
                iteration=int(tree.steps.index[row]),
                rank=int(tree.steps.rank[row]),
                node=int(launched[h]),
                name=int(tree.name[launched[h]]),
                launcher=int(nodes.name[call[h]]),
                launch_ordinal=int(nodes.ordinal[call[h]]),
                position=int(position[h]),
                dur_ns=int(dur[h]),
                reference_ns=float(reference[h]),
                on_gpu=work.on_gpu,
                compared=int(ran[key[h]]) - 1,
                across=across,
                z=float(z[h]),
                step_share=float(share[h]),
            )
        )
    return out


def _peer_groups(tree: CallTree) -> np.ndarray:
    """Per step row: its group of like steps on the ranks (the same iteration, kind and batch):
    data-, sequence- and tensor-parallel ranks run the same calls in one step."""
    return like_steps(tree, tree.steps.index)


def _step_groups(tree: CallTree) -> np.ndarray:
    """Per step row: its group of like steps (rank, kind and the batch its annotation states).
    A serving step's kernels scale with its tokens, so only steps of one batch are alike; a
    training loop's steps state none and form one group per rank."""
    return like_steps(tree, tree.steps.rank)


def like_steps(tree: CallTree, within: np.ndarray) -> np.ndarray:
    """Per step row: a group id shared by the steps with the same `within` value, kind and batch."""
    steps = tree.steps
    like = np.stack(
        [
            within.astype(np.int64),
            np.unique(np.asarray(steps.kind, dtype=object).astype(str), return_inverse=True)[1],
            steps.context_tokens.astype(np.int64),
            steps.generation_tokens.astype(np.int64),
        ]
    )
    return np.unique(like, axis=1, return_inverse=True)[1].reshape(-1)


def _call_slots(facts: RunFacts, groups: np.ndarray, calls: np.ndarray) -> np.ndarray:
    """Per step-node row (of `calls`, the calls compared): its place in its step
    group's call sequence, the same for the same call in every like step; -1 where a step's
    sequence has no counterpart in its group's reference step.

    A step whose sequence of launching calls (by name) equals the reference's maps one to one.
    Otherwise a name called as often as in the reference maps occurrence by occurrence (threads
    that interleave differently, the autograd thread beside the main one, do not matter), and a
    name called more or less often (a data-dependent branch, a first iteration's extra copy) is
    aligned by longest matching blocks, so one extra `aten::mm` early in a step does not shift
    every later `aten::mm` onto its neighbour's slot."""
    nodes, tree = facts.step_nodes, facts.tree
    out = np.full(len(nodes.node), -1, dtype=np.int64)
    context = facts.derived("repeats.call_contexts", lambda: _call_contexts(tree, nodes.node))
    step_of = nodes.step[calls].astype(np.int64)
    order = np.lexsort((tree.start[nodes.node[calls]], step_of))
    calls, step_of = calls[order], step_of[order]
    bounds = np.flatnonzero(np.diff(step_of)) + 1
    per_step = dict(zip(step_of[np.r_[0, bounds]].tolist(), np.split(calls, bounds), strict=True))
    for g in np.unique(groups).tolist():
        rows = [r for r in np.flatnonzero(groups == g).tolist() if r in per_step]
        if len(rows) < MIN_STEPS:
            continue
        sequences = {r: nodes.name[per_step[r]] for r in rows}
        lengths = [len(sequences[r]) for r in rows]
        modal = max(set(lengths), key=lengths.count)
        first = next(r for r in rows if len(sequences[r]) == modal)
        reference, reference_context = sequences[first], context[per_step[first]]
        slot_of = {key: k for k, key in enumerate(_occurrences(reference))}
        slot_in_context = {key: k for k, key in enumerate(_occurrences(reference_context))}
        reference_count = Counter(reference.tolist())
        reference_context_count = Counter(reference_context.tolist())
        for r in rows:
            sequence = sequences[r]
            if len(sequence) == len(reference) and np.array_equal(sequence, reference):
                out[per_step[r]] = np.arange(len(sequence))
                continue
            # a name the step calls as often as the reference does: its k-th call is the
            # reference's k-th, however the threads interleaved (the k-th under the same
            # parent where the parent's calls are as many too); the others by alignment
            count = Counter(sequence.tolist())
            slots = np.array([slot_of.get(key, -1) for key in _occurrences(sequence)])
            in_context = context[per_step[r]]
            context_count = Counter(in_context.tolist())
            by_context = np.array(
                [slot_in_context.get(key, -1) for key in _occurrences(in_context)]
            )
            same_context = np.array(
                [context_count[c] == reference_context_count.get(c, 0) for c in in_context.tolist()]
            )
            slots[same_context] = by_context[same_context]
            differ = np.array([count[n] != reference_count.get(n, 0) for n in sequence.tolist()])
            slots[differ] = -1
            if differ.any():
                matcher = SequenceMatcher(None, reference.tolist(), sequence.tolist(), False)
                for block in matcher.get_matching_blocks():
                    span = np.arange(block.b, block.b + block.size)
                    span = span[differ[span]]
                    slots[span] = span - block.b + block.a
            out[per_step[r]] = slots
    return out


def _call_contexts(tree: CallTree, node: np.ndarray) -> np.ndarray:
    """Per node: its name and its parent's name in one id. The same operator runs on several
    threads (`aten::add_` in the forward on the main thread and in DDP's gradient hooks on the
    autograd thread), and a delay on one thread reorders their calls by time; the parent tells
    the two apart, so the k-th call of each keeps its place."""
    parent = tree.parent[node]
    parent_name = np.where(parent >= 0, tree.name[np.maximum(parent, 0)], -1).astype(np.int64)
    return tree.name[node].astype(np.int64) * (len(tree.names) + 1) + parent_name + 1


def _name_ordinals(call: np.ndarray, name: np.ndarray) -> np.ndarray:
    """Per launch (sorted by call, then time): which of its call's launches of its kernel name
    it is, from 0."""
    order = np.lexsort((np.arange(len(call)), name, call))
    ordinals = np.empty(len(call), dtype=np.int64)
    ordinals[order] = run_ordinals(call[order], name[order])
    return ordinals


def _occurrences(sequence: np.ndarray) -> list[tuple[int, int]]:
    """(name, how many times it came before) of each element of a name sequence."""
    seen: Counter[int] = Counter()
    out = []
    for name in sequence.tolist():
        out.append((name, seen[name]))
        seen[name] += 1
    return out


def _launched(facts: RunFacts) -> np.ndarray:
    """Tree nodes of the GPU work launched from the host: kernels and copies. Collectives are
    not in it: the readers put them in their own layer (`comm`)."""
    tree = facts.tree
    return np.flatnonzero(
        (tree.stream >= 0) & np.isin(tree.layer, list(GPU_WORK_CODES)) & (tree.edge == EDGE_LAUNCH)
    )


def _others_median(key: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per value: the median of the other values of its key (NaN where it has none), without a
    (keys x steps) table: a run of thousands of steps on dozens of ranks would not fit one."""
    order = np.lexsort((values, key))
    sorted_key, sorted_values = key[order], values[order]
    start = np.searchsorted(sorted_key, sorted_key, side="left")
    count = np.bincount(key)[sorted_key]
    rank_in_key = np.arange(len(order)) - start
    others = count - 1

    def other(j: np.ndarray) -> np.ndarray:
        """The j-th smallest of the key's values once this one is left out."""
        skip = (j >= rank_in_key).astype(np.int64)
        return sorted_values[np.minimum(start + j + skip, len(order) - 1)]

    low = other(np.maximum((others - 1) // 2, 0))
    high = other(np.maximum(others // 2, 0))
    median = np.where(others > 0, (low + high) / 2.0, np.nan)
    out = np.empty(len(order))
    out[order] = median
    return out
