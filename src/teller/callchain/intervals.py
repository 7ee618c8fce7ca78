"""Unions of time intervals, measured inside many windows at once.

"How long was the GPU busy in this step" is the length of a union (kernels on several streams
overlap; summing their durations counts the overlap twice) clipped to a window. A union kept as
sorted disjoint intervals answers that for every window with two binary searches and a prefix sum,
so a run's thousands of steps and idle gaps cost one vectorised pass each, not a loop over events.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Intervals:
    """Disjoint, non-touching half-open `[start, end)` intervals in ascending order (int64 ns)."""

    start: np.ndarray
    end: np.ndarray

    @classmethod
    def empty(cls) -> Intervals:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    @classmethod
    def union_of(cls, start: np.ndarray, end: np.ndarray, join_within_ns: int = 0) -> Intervals:
        """The union of `[start[i], end[i])`, in any order and overlapping freely; empty intervals
        are dropped, and intervals that touch or lie within `join_within_ns` of each other are
        joined (the gap between them counts as covered)."""
        start = np.asarray(start, dtype=np.int64)
        end = np.asarray(end, dtype=np.int64)
        keep = end > start
        start, end = start[keep], end[keep]
        if not len(start):
            return cls.empty()
        order = np.argsort(start, kind="stable")
        start, end = start[order], end[order]
        reach = np.maximum.accumulate(end)
        opens = np.ones(len(start), dtype=bool)
        opens[1:] = start[1:] > reach[:-1] + join_within_ns
        first = np.flatnonzero(opens)
        last = np.append(first[1:] - 1, len(start) - 1)
        return cls(start[first], reach[last])

    def __len__(self) -> int:
        return len(self.start)

    @property
    def total_ns(self) -> int:
        return int((self.end - self.start).sum())

    def union(self, other: Intervals) -> Intervals:
        return Intervals.union_of(
            np.concatenate([self.start, other.start]), np.concatenate([self.end, other.end])
        )

    def covered_before(self, t: np.ndarray) -> np.ndarray:
        """Length of the union inside `(-inf, t)`, for each `t`."""
        t = np.asarray(t, dtype=np.int64)
        if not len(self.start):
            return np.zeros(t.shape, dtype=np.int64)
        lengths = self.end - self.start
        before = np.concatenate([[0], np.cumsum(lengths)])  # before[k]: length of intervals < k
        k = (
            np.searchsorted(self.start, t, side="right") - 1
        )  # last interval starting at or before t
        inside = k >= 0
        k = np.maximum(k, 0)
        partial = np.clip(t - self.start[k], 0, lengths[k])
        return np.where(inside, before[k] + partial, 0)

    def covered(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Length of the union inside each window `[lo[i], hi[i])`."""
        return self.covered_before(hi) - self.covered_before(lo)

    def complement(self, lo: int, hi: int) -> Intervals:
        """The gaps of the union inside `[lo, hi)`."""
        starts = np.concatenate([[lo], self.end])
        ends = np.concatenate([self.start, [hi]])
        starts, ends = np.maximum(starts, lo), np.minimum(ends, hi)
        keep = ends > starts
        return Intervals(starts[keep], ends[keep])


def clip_to_windows(
    intervals: Intervals, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every piece of `intervals` inside each window `[lo[w], hi[w])`: (window index, piece start,
    piece end), windows in order and pieces in time order within each. Windows may overlap; an
    interval that crosses a window's edge is cut there."""
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    first = np.searchsorted(intervals.end, lo, side="right")  # first interval ending after lo
    stop = np.searchsorted(intervals.start, hi, side="left")  # intervals starting before hi
    counts = np.maximum(stop - first, 0)
    window = np.repeat(np.arange(len(lo)), counts)
    offsets = np.cumsum(counts) - counts
    index = np.repeat(first - offsets, counts) + np.arange(int(counts.sum()))
    start = np.maximum(intervals.start[index], lo[window])
    end = np.minimum(intervals.end[index], hi[window])
    keep = end > start
    return window[keep], start[keep], end[keep]
