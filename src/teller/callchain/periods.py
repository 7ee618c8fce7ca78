"""Iterations from the period of the top-level operation sequence, for traces that name no steps.

A loop that runs a model leaves the same sequence of top-level operations once per iteration: the
forward's operators (or, under CUDA graphs and in bare nsys captures, runtime calls named by the
kernel they launch), the sampling or the backward and optimizer, the copies in and out. So an
iteration is a stretch between two consecutive occurrences of an operation that occurs once per
iteration (an *anchor*), and an anchor is right when the stretches it cuts are alike.

Cutting at anchors rather than at a fixed stride keeps each boundary on a real operation, so an
iteration that runs one extra operator (a recompile, a data-dependent branch) shifts nothing after
it; comparing stretches by their operation counts, not position by position, tolerates the
interleaving of the main and autograd threads varying between iterations.

Stretches are only iterations when they are a loop's (`work.py`): together they hold most of the
rank's work, and the usual one closes as an iteration does (results to the host, a host wait, the
optimizer's step) with the GPU busy for some of its time. Decoder layers repeat as regularly as
iterations, but inside one forward they close nothing, so one forward is not cut into its layers.
Anchors are tried coarsest first (fewest occurrences): a sub-part of the iteration that happens
to pass (a layer of a model that synchronises in every layer) then loses to the iteration that
holds it, and micro-batches lose to the optimizer step that closes them.

A boundary then moves, within the period, to where the iteration begins: the first of its input
copies when most iterations copy inputs in, else the operation after the longest usual host
pause (Python between iterations: data loading, scheduling), not at whichever operation happened
to be the anchor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from teller.callchain.work import MIN_GPU_BUSY, Forest, NodeWork

#: Largest share of the usual stretch's operation counts another stretch may differ by and still
#: be alike (an L1 distance between count vectors, over the usual stretch's size).
ALIKE_DISTANCE = 0.25
#: Share of the elements of an anchor's whole stretches that alike stretches must hold for the
#: anchor to cut iterations. Counted in elements, not stretches: a layer's anchor cuts many alike
#: layers and one stretch holding the rest of the iteration, which holds most of the elements.
ALIKE_SHARE = 0.75
#: Share of the rank's work the iterations must hold together: most of it.
MIN_WORK_SHARE = 0.5
#: An iteration is a repetition: at least this many.
MIN_ITERATIONS = 2
#: Anchors whose stretch × operation count table would exceed this many cells are not tried
#: (an operation that occurs thousands of times is a layer's, not an iteration's).
MAX_TABLE_CELLS = 4_000_000


@dataclass(frozen=True)
class Period:
    """Iterations of one sequence: each one's elements are `first[k]` up to `stop[k]`."""

    first: np.ndarray
    stop: np.ndarray
    anchor: int  # the symbol that occurs once per iteration
    length: int  # the usual iteration's element count

    def __len__(self) -> int:
        return len(self.first)


@dataclass
class Sequence:
    """One rank's top-level elements in time order, as the period finder reads them."""

    symbols: np.ndarray  # small non-negative ids
    start_ns: np.ndarray
    end_ns: np.ndarray
    work_ns: np.ndarray  # the work each element holds
    closes: np.ndarray  # bool: the element closes an iteration (work.py)
    copy_in: np.ndarray  # bool: the element copies data into the device
    total_work_ns: float  # the rank's work, held by these elements or not
    on_gpu: bool = True  # False on a CPU-only rank: no busy test

    def __len__(self) -> int:
        return len(self.symbols)


def find_period(sequence: Sequence) -> Period | None:
    """Iterations of a sequence, or None when it does not repeat as a loop does."""
    symbols = sequence.symbols
    count = len(symbols)
    if count < 2 * MIN_ITERATIONS:
        return None
    gap_ns = host_gaps(sequence.start_ns, sequence.end_ns)
    occurrences = np.bincount(symbols)
    vocabulary = len(occurrences)
    by_symbol = np.argsort(symbols, kind="stable")
    starts = np.concatenate(([0], np.cumsum(occurrences)))
    candidates = np.flatnonzero((occurrences >= MIN_ITERATIONS) & (occurrences <= count // 2))
    first_seen = np.full(vocabulary, count, dtype=np.int64)
    np.minimum.at(first_seen, symbols, np.arange(count))
    # coarsest loop first; among equal counts, the operation seen first
    ranked = sorted(candidates.tolist(), key=lambda s: (occurrences[s], first_seen[s]))
    for anchor in ranked:
        if occurrences[anchor] * vocabulary > MAX_TABLE_CELLS:
            continue
        at = by_symbol[starts[anchor] : starts[anchor + 1]]
        length = int(np.median(np.diff(at)))
        if length < 1:
            continue
        bounds = at + _phase(at, length, gap_ns, sequence.copy_in)
        # stretch edges: one usual length before the first boundary, the boundaries, one after
        raw = np.concatenate(([bounds[0] - length], bounds, [bounds[-1] + length]))
        edges = np.clip(raw, 0, count).astype(np.int64)
        kept = _iterations(edges, raw < 0, symbols, vocabulary)
        if kept is None:
            continue
        period = Period(first=edges[kept], stop=edges[kept + 1], anchor=int(anchor), length=length)
        if _is_loop(sequence, period):
            return period
    return None


def _is_loop(sequence: Sequence, period: Period) -> bool:
    """Most of the rank's work, and the usual iteration closes with the GPU busy (`work.py`)."""
    held = _sums(sequence.work_ns, period)
    if sequence.total_work_ns > 0 and held.sum() < MIN_WORK_SHARE * sequence.total_work_ns:
        return False
    closings = _sums(sequence.closes, period)
    if np.median(closings) < 1:
        return False
    if not sequence.on_gpu:
        return True
    window_start = sequence.start_ns[period.first]
    last_stop = sequence.end_ns[period.first[-1] : period.stop[-1]].max()
    duration = np.append(window_start[1:], last_stop) - window_start
    return bool(np.median(held / np.maximum(duration, 1)) >= MIN_GPU_BUSY)


def _sums(values: np.ndarray, period: Period) -> np.ndarray:
    cumulative = np.concatenate(([0.0], np.cumsum(values, dtype=np.float64)))
    return cumulative[period.stop] - cumulative[period.first]


def _phase(at: np.ndarray, length: int, gap_ns: np.ndarray, copy_in: np.ndarray) -> int:
    """How many elements to move every boundary by, back into the period, so that each falls where
    an iteration begins: on the first of a run of input copies, when most iterations have one;
    else on the element after the longest usual host pause (the anchor itself on a tie)."""
    offsets = np.arange(0, -length, -1)
    positions = at[None, :] + offsets[:, None]
    valid = positions >= 0
    safe = np.maximum(positions, 0)
    opens = copy_in[safe] & ~np.where(positions >= 1, copy_in[np.maximum(positions - 1, 0)], False)
    input_share = np.where(valid, opens, False).mean(axis=1)
    pause = np.median(np.where(valid, gap_ns[safe], 0), axis=1)
    # the first offset with the best (input share, pause): offset 0 on a tie
    best = np.lexsort((-np.arange(length), pause, input_share >= 0.5))[-1]
    return int(offsets[best])


def _iterations(
    edges: np.ndarray, cut_off: np.ndarray, symbols: np.ndarray, vocabulary: int
) -> np.ndarray | None:
    """Indices of the stretches (between consecutive edges) that are iterations: the whole ones
    between two boundaries, when most are alike, and the partial ones (at either end, or cut off
    by the sequence's start: `cut_off[k]`) that are alike as well. None when they are no loop."""
    stretches = len(edges) - 1
    index = np.arange(edges[0], edges[-1])
    stretch = np.searchsorted(edges, index, side="right") - 1
    table = np.bincount(
        stretch * vocabulary + symbols[index], minlength=stretches * vocabulary
    ).reshape(stretches, vocabulary)
    partial = np.zeros(stretches, dtype=bool)
    partial[[0, -1]] = True
    partial |= cut_off[:-1]
    whole = np.flatnonzero(~partial)
    if not len(whole):
        return None
    usual = np.median(table[whole], axis=0)
    size = max(float(usual.sum()), 1.0)
    alike = (np.abs(table - usual).sum(axis=1) / size <= ALIKE_DISTANCE) & (edges[1:] > edges[:-1])
    sizes = edges[1:] - edges[:-1]
    if sizes[whole][alike[whole]].sum() < ALIKE_SHARE * sizes[whole].sum():
        return None
    kept = np.flatnonzero(~partial | alike)
    return kept if len(kept) >= MIN_ITERATIONS else None


def host_gaps(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Time before each element (in start order) in which no earlier element was still running."""
    if not len(start):
        return np.zeros(0, dtype=np.int64)
    running_end = np.maximum.accumulate(end)
    gaps = np.empty(len(start), dtype=np.int64)
    gaps[0] = 0
    gaps[1:] = np.maximum(start[1:] - running_end[:-1], 0)
    return gaps


@dataclass(frozen=True)
class RankIterations:
    """Iterations found on one rank: each one's first top-level node and its time window."""

    rank: int
    node: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    tops: np.ndarray  # the rank's top-level host nodes, each to join the window its start is in
    period: Period


def iterations_on_rank(tree: Forest, rank: int, work: NodeWork) -> RankIterations | None:
    """The rank's iterations from the period of its top-level sequence, or None.

    The sequence is the rank's top-level host operations that hold work, close an iteration or
    copy inputs in (on a CPU-only rank, all of them): an operator by its name, a runtime call by
    its name and the first GPU activity it launched (`cudaLaunchKernel` alone says nothing; the
    kernel does). When the host launched little of the rank's GPU work (a GPU-only capture, CUPTI
    counter ranges without launch records), the GPU activity nothing launched is read instead.
    """
    node_ids = np.arange(len(tree))
    mine = tree.rank == rank
    tops = np.flatnonzero(mine & (work.top == node_ids))
    on_gpu = work.rank_has_gpu.get(rank, False)
    under_top = mine & (work.top >= 0)
    held = np.bincount(work.top[under_top], weights=work.work_ns[under_top], minlength=len(tree))
    closes = np.bincount(work.top[under_top & work.closes], minlength=len(tree)) > 0
    copy_in = np.bincount(work.top[under_top & work.copy_in], minlength=len(tree)) > 0
    total_work = float(work.work_ns[mine].sum())
    elements = tops[(held[tops] > 0) | closes[tops] | copy_in[tops]] if on_gpu else tops
    if on_gpu and held[elements].sum() < MIN_WORK_SHARE * total_work:
        elements = np.flatnonzero(mine & (tree.stream >= 0) & (tree.parent < 0))
        held, closes, copy_in = work.work_ns, work.closes, work.copy_in
        elements = elements[(held[elements] > 0) | closes[elements] | copy_in[elements]]
    if not len(elements):
        return None
    elements = elements[np.lexsort((elements, tree.start[elements]))]
    starts = tree.start[elements]
    ends = starts + tree.dur[elements]
    period = find_period(
        Sequence(
            symbols=_symbols(tree, elements),
            start_ns=starts,
            end_ns=ends,
            work_ns=held[elements].astype(np.int64),
            closes=closes[elements],
            copy_in=copy_in[elements],
            total_work_ns=total_work,
            on_gpu=on_gpu,
        )
    )
    if period is None:
        return None
    window_start = starts[period.first]
    last_end = max(int(ends[period.first[-1] : period.stop[-1]].max()), int(window_start[-1]))
    # a window ends where the next begins, so the host time between iterations is an iteration's
    window_end = np.append(window_start[1:], last_end)
    return RankIterations(
        rank=rank,
        node=elements[period.first],
        start_ns=window_start,
        end_ns=window_end,
        tops=tops,
        period=period,
    )


def _symbols(tree: Forest, elements: np.ndarray) -> np.ndarray:
    """Small ids, in order of first appearance: the element's name and its first GPU child's."""
    offsets = tree.child_offsets
    has_child = offsets[elements + 1] > offsets[elements]
    first_child = (
        np.where(
            has_child,
            tree.child_index[np.minimum(offsets[elements], len(tree.child_index) - 1)],
            -1,
        )
        if len(tree.child_index)
        else np.full(len(elements), -1)
    )
    gpu_child = (first_child >= 0) & (tree.stream[np.maximum(first_child, 0)] >= 0)
    child_name = np.where(gpu_child, tree.name[np.maximum(first_child, 0)], -1).astype(np.int64)
    keys = tree.name[elements].astype(np.int64) * (len(tree.names) + 1) + child_name + 1
    _, first_index, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rename = np.empty(len(first_index), dtype=np.int64)
    rename[np.argsort(first_index, kind="stable")] = np.arange(len(first_index))
    return rename[inverse.reshape(-1)]
