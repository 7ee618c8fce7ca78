"""Whether a slow link's collectives grew with their message size: a rate limit, not a delay.

Added latency (`net_delay`) costs each message about the same; a rate limit (`net_throttle`)
costs each in proportion to its bytes. A learned type head reads step-level numbers and can
call one the other; the collectives themselves tell them apart. Over a rank's flagged steps,
each of its collectives with a known size is compared with the median time of the rank's
collectives of the same size bin in its other steps, and the excess of the larger half (by
bytes) is set against the smaller half's.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from teller.callchain.tree import CallTree

#: Sizes fall in bins of one log2 unit: a collective is compared with those of about its size.
SIZE_BIN = 1.0
#: The larger half's median size must be this many times the smaller half's to tell anything.
MIN_SIZE_SPREAD = 4.0
#: Collectives of each half, at least, in the flagged steps.
MIN_PER_HALF = 3


def grows_with_size(tree: CallTree, rank: int, flagged: Collection[int]) -> bool | None:
    """Whether the `rank`'s collectives in the `flagged` iterations took more beyond their
    usual the larger they were: True where the larger half's mean excess is at least the
    geometric mean of 1 and the size spread times the smaller half's (between a fixed cost,
    a ratio of 1, and a cost per byte, the size spread itself), False where it is less; None
    where the sizes are unknown, too alike or too few, or nothing rose."""
    comm = tree.comm
    if not len(comm):
        return None
    rows = tree.step[comm.node]
    mine = (rows >= 0) & (comm.bytes > 0) & (comm.rank == rank)
    nodes, sizes, rows = comm.node[mine], comm.bytes[mine].astype(float), rows[mine]
    if not len(nodes):
        return None
    inside = np.isin(tree.steps.index[rows], np.fromiter(flagged, dtype=np.int64))
    size_bin = np.floor(np.log2(sizes) / SIZE_BIN).astype(np.int64)
    durations = tree.dur[nodes].astype(float)
    usual = {
        b: float(np.median(durations[~inside & (size_bin == b)]))
        for b in np.unique(size_bin[~inside]).tolist()
    }
    compared = inside & np.isin(size_bin, list(usual))
    if compared.sum() < 2 * MIN_PER_HALF:
        return None
    excess = np.maximum(
        durations[compared] - np.array([usual[b] for b in size_bin[compared].tolist()]), 0.0
    )
    sizes = sizes[compared]
    larger = sizes > np.median(sizes)
    if larger.sum() < MIN_PER_HALF or (~larger).sum() < MIN_PER_HALF:
        return None
    spread = float(np.median(sizes[larger]) / np.median(sizes[~larger]))
    if spread < MIN_SIZE_SPREAD or excess.sum() <= 0:
        return None
    small, large = float(excess[~larger].mean()), float(excess[larger].mean())
    return bool(large >= np.sqrt(spread) * small)
