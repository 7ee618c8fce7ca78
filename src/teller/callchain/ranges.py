"""Repeated ranges: user annotations and NVTX ranges that may name a trace's steps.

Training and serving code often marks its loop with its own names rather than an engine's:
`record_function("forward")`, an NVTX range per batch, HTA's `Optimizer.step#SGD.step`. A range
that repeats at one nesting level without overlapping itself is a candidate for the step. Most
candidates are parts of an iteration (the optimizer, one module, a data-loader wait), so a
candidate becomes the steps only when it is clearly the iteration (`work.py`):

* it repeats (at least twice on the rank), at one nesting level, never overlapping itself;
* its instances hold most of the rank's work (GPU time; a part of the iteration holds less);
* the usual instance closes as an iteration does and keeps the GPU busy for some of its time
  (`work.py`: layers of one forward do neither the first).

A part can pass all three (a backward holds most of a training step's GPU time and the fused
optimizer's step), so a candidate with a sibling (another repeated range at its level holding
real work, as `## forward ##` is to `## backward ##`) is a part of the loop's body, not its
iteration. When several pass, the outermost wins (an iteration range holds its sub-ranges, which
can pass too when they hold nearly all of its work), then the one holding more work. Every candidate is
offered by name either way, so a user can pass it as the step regex.

Kineto records an annotation twice, on the host and as `gpu_user_annotation` on the stream its
GPU work ran on; the GPU copy hangs under the host one and is the same candidate. A GPU range with
no host range is a candidate of its own and holds the GPU work that ran inside it, with the host
operations that launched that work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from teller.callchain.work import MIN_GPU_BUSY, Forest, NodeWork
from teller.ingest.schema import LAYER_CODE

#: An iteration range repeats at least this often on its rank.
MIN_REPEATS = 2
#: Share of the rank's work an iteration range's instances hold together: most of it.
MIN_WORK_SHARE = 0.5
#: A repeated range beside the candidate, at its level, holding this share of the work makes both
#: parts of the iteration (a backward can hold most of a training step's GPU time by itself).
SIBLING_WORK_SHARE = 0.1
#: Consecutive instances may overlap by this share of their usual length (timestamps rounded to
#: µs put one range's start a tick before the previous one's end) and still be one after another.
OVERLAP_SHARE = 0.01
#: Candidates weighed per trace, longest first (only traces without engine steps get here).
MAX_CANDIDATES = 64


@dataclass(frozen=True)
class RepeatedRange:
    """One range name repeated at one nesting level of one rank, and what its instances hold."""

    rank: int
    name: str
    level: int  # host nesting level, Python frames not counted
    on_gpu: bool
    nodes: np.ndarray  # instances, in time order
    start_ns: np.ndarray
    end_ns: np.ndarray
    work_share: float  # share of the rank's work its instances hold
    closings: np.ndarray  # per instance: nodes inside it that close an iteration (work.py)
    busy: np.ndarray  # per instance: its GPU work over its duration

    @property
    def count(self) -> int:
        return len(self.nodes)

    def is_iteration(self, on_gpu: bool) -> bool:
        return (
            self.count >= MIN_REPEATS
            and self.work_share >= MIN_WORK_SHARE
            and np.median(self.closings) >= 1
            and (not on_gpu or np.median(self.busy) >= MIN_GPU_BUSY)
        )


def repeated_ranges(tree: Forest, work: NodeWork) -> list[RepeatedRange]:
    """Every range that repeats without overlapping itself at one level of a rank, by work held."""
    name, layer, rank, stream = tree.name, tree.layer, tree.rank, tree.stream
    start, dur, parent = tree.start, tree.dur, tree.parent
    engine = layer == LAYER_CODE["engine"]
    on_gpu = stream >= 0
    # a GPU annotation under a host one is that annotation's shadow, not a range of its own
    own = engine & (~on_gpu | (parent < 0))
    if not own.any():
        return []
    level = _host_levels(layer, parent, work)
    ids = np.flatnonzero(own)
    keys = np.stack([rank[ids], name[ids], on_gpu[ids].astype(np.int64), level[ids]], axis=1)
    groups, group_of = np.unique(keys, axis=0, return_inverse=True)
    group_of = group_of.reshape(-1)
    sizes = np.bincount(group_of, minlength=len(groups))
    spans = np.bincount(group_of, weights=dur[ids], minlength=len(groups))
    repeated = np.flatnonzero(sizes >= MIN_REPEATS)
    repeated = repeated[np.argsort(-spans[repeated], kind="stable")][:MAX_CANDIDATES]
    rank_work = {r: float(work.work_ns[rank == r].sum()) for r in np.unique(rank).tolist()}
    found: list[RepeatedRange] = []
    for g in repeated.tolist():
        nodes = ids[group_of == g]
        nodes = nodes[np.argsort(start[nodes], kind="stable")]
        ends = start[nodes] + dur[nodes]
        slack = OVERLAP_SHARE * float(np.median(dur[nodes]))
        if np.any(start[nodes[1:]] < ends[:-1] - slack):
            continue  # instances overlap: concurrent work (a per-request range), not a loop
        r, name_id, gpu, lvl = (int(v) for v in groups[g])
        owner = _owners(tree, nodes, ends, bool(gpu), work)
        held = owner >= 0
        total = rank_work[r]
        share = float(work.work_ns[held].sum()) / total if total > 0 else 0.0
        closings = np.bincount(owner[held & work.closes], minlength=len(nodes))
        busy = np.bincount(owner[held], weights=work.work_ns[held], minlength=len(nodes))
        found.append(
            RepeatedRange(
                rank=r,
                name=tree.names[name_id],
                level=lvl,
                on_gpu=bool(gpu),
                nodes=nodes,
                start_ns=start[nodes],
                end_ns=ends,
                work_share=share,
                closings=closings,
                busy=busy / np.maximum(ends - start[nodes], 1),
            )
        )
    found.sort(key=lambda c: (-c.work_share, c.rank, c.level, c.name))
    return found


def pick_iteration_ranges(
    candidates: list[RepeatedRange], rank_has_gpu: dict[int, bool]
) -> dict[int, RepeatedRange]:
    """Per rank, the candidate that is clearly the iteration (module docstring), if any."""
    picked: dict[int, RepeatedRange] = {}
    for candidate in candidates:
        if not candidate.is_iteration(rank_has_gpu.get(candidate.rank, False)):
            continue
        if any(_is_sibling_part(other, candidate) for other in candidates):
            continue
        best = picked.get(candidate.rank)
        if best is None or (candidate.level, -candidate.work_share) < (
            best.level,
            -best.work_share,
        ):
            picked[candidate.rank] = candidate
    return picked


def _is_sibling_part(other: RepeatedRange, candidate: RepeatedRange) -> bool:
    """Another repeated range beside the candidate, at its level, holding real work: both are
    parts of one loop's body (`## forward ##` beside `## backward ##`), neither its iteration."""
    return (
        other.rank == candidate.rank
        and other.level == candidate.level
        and other.on_gpu == candidate.on_gpu
        and other.name != candidate.name
        and other.work_share >= SIBLING_WORK_SHARE
    )


def describe_candidates(candidates: list[RepeatedRange], limit: int = 6) -> str:
    """`'forward' ×5 (92% of GPU time), …`: one entry per name, its largest count and share."""
    best: dict[str, RepeatedRange] = {}
    for candidate in candidates:  # already ordered by share
        best.setdefault(candidate.name, candidate)
    shown = [
        f"'{c.name}' ×{c.count} ({c.work_share:.0%} of the work)"
        for c in list(best.values())[:limit]
    ]
    more = len(best) - len(shown)
    return ", ".join(shown) + (f", and {more} more" if more > 0 else "")


def _host_levels(layer: np.ndarray, parent: np.ndarray, work: NodeWork) -> np.ndarray:
    """Nesting level counting host frames but not Python ones (a stack trace's depth varies)."""
    level = np.zeros(len(parent), dtype=np.int64)
    counted = layer != LAYER_CODE["python"]
    for nodes in work.levels[1:]:
        above = parent[nodes]
        level[nodes] = level[above] + counted[above]
    return level


def instance_of_nodes(tree: Forest, candidate: RepeatedRange, work: NodeWork) -> np.ndarray:
    """Per node, the index of the candidate's instance that holds it, -1 for none."""
    return _owners(tree, candidate.nodes, candidate.end_ns, candidate.on_gpu, work)


def _owners(
    tree: Forest, nodes: np.ndarray, ends: np.ndarray, gpu_range: bool, work: NodeWork
) -> np.ndarray:
    """Per node, the instance that holds it: a host range's subtree; any other host node of the
    rank whose start falls in an instance (a worker thread's ops, the autograd thread's
    backward), with everything under it; GPU work by the host call that launched it, and GPU work
    nothing traced launched by where its start falls. (A GPU range holds the GPU work that ran
    inside it and the top-level host operations that launched it.)

    GPU work joins through its launch, not its own start: the GPU runs behind the host, so a
    window on the host clock would take in the previous part's kernels."""
    rank, stream, start, parent = tree.rank, tree.stream, tree.start, tree.parent
    mine = rank == rank[nodes[0]]
    owner = np.full(len(parent), -1, dtype=np.int64)
    if gpu_range:
        _by_window(owner, np.flatnonzero(mine & (stream >= 0)), start, start[nodes], ends)
        # the host operation that launched an instance's first GPU work comes with it
        launched = np.flatnonzero((owner >= 0) & (stream >= 0) & (work.top >= 0))
        latest_first = launched[np.argsort(start[launched], kind="stable")[::-1]]
        owner[work.top[latest_first]] = owner[latest_first]
        return work.owners(parent, owner)
    owner[nodes] = np.arange(len(nodes))
    owner = work.owners(parent, owner)
    _by_window(owner, np.flatnonzero(mine & (stream < 0) & (owner < 0)), start, start[nodes], ends)
    owner = work.owners(parent, owner)
    unlaunched = np.flatnonzero(mine & (stream >= 0) & (parent < 0) & (owner < 0))
    _by_window(owner, unlaunched, start, start[nodes], ends)
    return owner


def _by_window(
    owner: np.ndarray,
    candidates: np.ndarray,
    start: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
) -> None:
    position = np.searchsorted(starts, start[candidates], side="right") - 1
    inside = (position >= 0) & (start[candidates] < ends[np.maximum(position, 0)])
    owner[candidates[inside]] = position[inside]
