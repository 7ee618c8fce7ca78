"""Quantiles of a histogram over a time window, computed the way Prometheus computes them.

A window's histogram is the difference of two cumulative scrapes (what `increase(...[W])` gives);
its quantile is `histogram_quantile`'s: find the bucket the rank falls in and interpolate linearly
inside it, the lowest bucket starting at 0, a rank in the +Inf bucket answering the highest
finite bound. Dashboards and alerts built on the engine's metrics read the same numbers.
"""

from __future__ import annotations

import math

from teller.watch.scrape import HistogramCounts


def difference(newer: HistogramCounts, older: HistogramCounts) -> HistogramCounts | None:
    """Observations made between two scrapes; None when a count went down (the engine restarted,
    its counters began again) or the buckets changed."""
    if newer.bounds != older.bounds or newer.count < older.count:
        return None
    cumulative = tuple(n - o for n, o in zip(newer.cumulative, older.cumulative, strict=True))
    if any(c < 0 for c in cumulative):
        return None
    return HistogramCounts(
        newer.bounds, cumulative, newer.count - older.count, newer.sum - older.sum
    )


def observations(histogram: HistogramCounts) -> float:
    return histogram.cumulative[-1] if histogram.cumulative else 0.0


def histogram_quantile(q: float, histogram: HistogramCounts) -> float | None:
    """The q-quantile (0 < q < 1) of the observations, or None when there are none."""
    total = observations(histogram)
    if total <= 0:
        return None
    rank = q * total
    previous_bound, previous_count = 0.0, 0.0
    for bound, count in zip(histogram.bounds, histogram.cumulative, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return previous_bound
            in_bucket = count - previous_count
            if in_bucket <= 0:
                return bound
            lower = previous_bound if previous_bound < bound else 0.0
            return lower + (bound - lower) * (rank - previous_count) / in_bucket
        previous_bound, previous_count = bound, count
    return previous_bound


def histogram_mean(histogram: HistogramCounts) -> float | None:
    return histogram.sum / histogram.count if histogram.count > 0 else None
