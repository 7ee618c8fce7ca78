"""The robust statistics every comparison of the localizer (and of the baselines) is made with.

A step, an operator or a rank is unusual by how far it sits from the median of its references,
in units of their spread measured as the median absolute deviation (MAD): one slow step among
the references moves neither, where it would move a mean and a standard deviation. Each caller
floors the spread at what it knows to be noise in its own units, so that a few identical
references still give finite, meaningful scores.

The keyed step nodes and kernel sequences the comparisons run over are facts of the run
(`teller.callchain.facts`); they are named here too for the modules that import them from here.
"""

from __future__ import annotations

import numpy as np

from teller.callchain.facts import StepNodes, kernel_sequences, step_nodes
from teller.ingest.schema import COMPUTE_CODES

__all__ = [
    "COMPUTE_LAYERS",
    "FULL_CREDIT_Z",
    "MAD_TO_SIGMA",
    "StepNodes",
    "credit",
    "kernel_sequences",
    "median_mad",
    "robust_z",
    "significance",
    "step_nodes",
]

#: Layers whose self time is work a rank did itself (not waiting on a peer).
COMPUTE_LAYERS = COMPUTE_CODES
#: MAD × this estimates the standard deviation of normally distributed values.
MAD_TO_SIGMA = 1.4826
#: A candidate's excess counts in full from this robust z on; below it, in proportion (noise that
#: happens to be large in nanoseconds does not outrank a consistent slowdown).
FULL_CREDIT_Z = 5.0


def median_mad(
    reference: np.ndarray, axis: int | None = None, skip_nan: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The median of `reference` and its spread (MAD_TO_SIGMA · MAD), along `axis` (kept as a
    dimension of length one) or over all values; with `skip_nan`, over the values that are not
    NaN (NaN where none is)."""
    keep = axis is not None
    median_of = np.nanmedian if skip_nan else np.median
    median = median_of(reference, axis=axis, keepdims=keep)
    spread = MAD_TO_SIGMA * median_of(np.abs(reference - median), axis=axis, keepdims=keep)
    return median, spread


def robust_z(
    values: np.ndarray | float,
    reference: np.ndarray,
    floor: float = 0.0,
    share_of_median: float = 0.0,
    axis: int | None = None,
) -> np.ndarray:
    """(values − median) / spread of `reference` (`median_mad`), the spread floored at `floor`
    (in the values' own units) and at `share_of_median` × the median (a relative noise level)."""
    median, spread = median_mad(reference, axis)
    limit = np.maximum(floor, share_of_median * median) if share_of_median else floor
    return (values - median) / np.maximum(spread, limit)


def significance(
    observed: float, usual: list[float], noise_floor_ns: float, scale: float = 0.0
) -> float:
    """Robust z of a step's total against its totals in the reference steps (`usual`), the spread
    floored at `scale`, at 5% of the usual value and at `noise_floor_ns` (few or identical
    references); against no references, the observed total in units of the floor."""
    if not usual:
        return observed / max(scale, noise_floor_ns)
    floor = max(scale, noise_floor_ns)
    return float(robust_z(observed, np.asarray(usual), floor=floor, share_of_median=0.05))


def credit(z: float) -> float:
    """Share of an excess that counts: all of it from FULL_CREDIT_Z on, in proportion below."""
    return min(1.0, max(z, 0.0) / FULL_CREDIT_Z)
