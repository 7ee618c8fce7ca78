"""Whether a slow link's collectives grew with their message size: a rate limit, not a delay.

Added latency (`net_delay`) costs each message about the same; a rate limit (`net_throttle`)
costs each in proportion to its bytes. A learned type head reads step-level numbers and can
call one the other; the collectives themselves tell them apart. Over the flagged steps, each
collective with a known size of the ranks that share the link is compared with the median time
of the same rank's collectives of its size bin in its other steps, and the excess of the larger
half (by bytes) is set against the smaller half's. The ranks are read together because a
collective waits on its slowest member: a rate-limited link stretches every member's transfer
of a large message, so each rank's few flagged collectives add to one measurement. The
measurement itself (`SizeGrowth`) is what the explanation of a slow link quotes.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from teller.callchain.tree import CallTree

#: Sizes fall in bins of one log2 unit: a collective is compared with those of about its size.
SIZE_BIN = 1.0
#: The larger half's median size must be this many times the smaller half's to tell anything.
MIN_SIZE_SPREAD = 4.0
#: Collectives of each half, at least, in the flagged steps.
MIN_PER_HALF = 3
#: A (rank, size bin) key is rank × this + bin: a size bin of bytes is under 64 in log2 units.
_BINS_PER_RANK = 128


@dataclass(frozen=True)
class SizeGrowth:
    """How much longer than their usual the flagged steps' collectives took, by size: the
    smaller and the larger half by bytes, each its median size, its size range and its mean
    excess."""

    small_bytes: float
    large_bytes: float
    small_excess_ns: float
    large_excess_ns: float
    small_range: tuple[float, float]  # the smaller half's least and most bytes
    large_range: tuple[float, float]

    @property
    def grows(self) -> bool:
        """Whether the larger half's excess is at least the geometric mean of 1 and the size
        spread times the smaller half's: between a fixed cost per message (a ratio of 1) and a
        cost per byte (the size spread itself)."""
        spread = self.large_bytes / self.small_bytes
        return bool(self.large_excess_ns >= np.sqrt(spread) * self.small_excess_ns)


def size_growth(
    tree: CallTree, ranks: Collection[int], flagged: Collection[int]
) -> SizeGrowth | None:
    """How the collectives of `ranks` in the `flagged` iterations took longer than their usual
    by size; None where the sizes are unknown, too alike or too few, or nothing rose."""
    comm = tree.comm
    if not len(comm):
        return None
    rows = tree.step[comm.node]
    mine = (rows >= 0) & (comm.bytes > 0) & np.isin(comm.rank, np.fromiter(ranks, dtype=np.int64))
    if not mine.any():
        return None
    sizes = comm.bytes[mine].astype(float)
    durations = tree.dur[comm.node[mine]].astype(float)
    inside = np.isin(tree.steps.index[rows[mine]], np.fromiter(flagged, dtype=np.int64))
    size_bin = np.floor(np.log2(sizes) / SIZE_BIN).astype(np.int64)
    key = comm.rank[mine].astype(np.int64) * _BINS_PER_RANK + size_bin
    usual_keys, usual_ns = _medians_by_key(key[~inside], durations[~inside])
    if not len(usual_keys):
        return None
    at = np.minimum(np.searchsorted(usual_keys, key), len(usual_keys) - 1)
    compared = inside & (usual_keys[at] == key)
    if compared.sum() < 2 * MIN_PER_HALF:
        return None
    excess = np.maximum(durations[compared] - usual_ns[at[compared]], 0.0)
    sizes = sizes[compared]
    larger = sizes > np.median(sizes)
    if larger.sum() < MIN_PER_HALF or (~larger).sum() < MIN_PER_HALF:
        return None
    growth = SizeGrowth(
        small_bytes=float(np.median(sizes[~larger])),
        large_bytes=float(np.median(sizes[larger])),
        small_excess_ns=float(excess[~larger].mean()),
        large_excess_ns=float(excess[larger].mean()),
        small_range=(float(sizes[~larger].min()), float(sizes[~larger].max())),
        large_range=(float(sizes[larger].min()), float(sizes[larger].max())),
    )
    if growth.large_bytes < MIN_SIZE_SPREAD * growth.small_bytes or excess.sum() <= 0:
        return None
    return growth


def _medians_by_key(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct `keys`, ascending, and the median of the `values` under each."""
    order = np.argsort(keys, kind="stable")
    distinct, first = np.unique(keys[order], return_index=True)
    groups = np.split(values[order], first[1:])
    return distinct, np.array([np.median(g) for g in groups], dtype=float)
