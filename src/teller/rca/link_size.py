"""Whether a slow link's collectives grew with their message size: a rate limit, not a delay.

Added latency (`net_delay`) costs each message about the same; a rate limit (`net_throttle`)
costs each in proportion to its bytes. A learned type head reads step-level numbers and can
call one the other; the collectives themselves tell them apart. Over the flagged steps, each
collective with a known size of the ranks that share the link is compared with the median time
of the same rank's collectives of its size bin in its other steps, and the excess of the larger
half (by bytes) is set against the smaller half's. The ranks are read together because a
collective waits on its slowest member: a rate-limited link stretches every member's transfer
of a large message, so each rank's few flagged collectives add to one measurement.
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


def grows_with_size(
    tree: CallTree, ranks: Collection[int], flagged: Collection[int]
) -> bool | None:
    """Whether the collectives of `ranks` in the `flagged` iterations took more beyond their
    usual the larger they were: True where the larger half's mean excess is at least the
    geometric mean of 1 and the size spread times the smaller half's (between a fixed cost,
    a ratio of 1, and a cost per byte, the size spread itself), False where it is less; None
    where the sizes are unknown, too alike or too few, or nothing rose."""
    comm = tree.comm
    if not len(comm):
        return None
    rows = tree.step[comm.node]
    mine = (rows >= 0) & (comm.bytes > 0) & np.isin(comm.rank, np.fromiter(ranks, dtype=np.int64))
    nodes, sizes, rows = comm.node[mine], comm.bytes[mine].astype(float), rows[mine]
    if not len(nodes):
        return None
    inside = np.isin(tree.steps.index[rows], np.fromiter(flagged, dtype=np.int64))
    size_bin = np.floor(np.log2(sizes) / SIZE_BIN).astype(np.int64)
    rank_and_bin = list(zip(comm.rank[mine].tolist(), size_bin.tolist(), strict=True))
    durations = tree.dur[nodes].astype(float)
    outside: dict[tuple[int, int], list[float]] = {}
    for key, duration, flagged_step in zip(rank_and_bin, durations, inside, strict=True):
        if not flagged_step:
            outside.setdefault(key, []).append(float(duration))
    usual = {key: float(np.median(times)) for key, times in outside.items()}
    compared = inside & np.array([key in usual for key in rank_and_bin])
    if compared.sum() < 2 * MIN_PER_HALF:
        return None
    excess = np.maximum(
        durations[compared]
        - np.array([usual[key] for key, c in zip(rank_and_bin, compared, strict=True) if c]),
        0.0,
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
