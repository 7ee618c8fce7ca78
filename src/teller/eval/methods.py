"""The methods the scoreboard compares, by name; each builds a fresh, unfitted estimator."""

from __future__ import annotations

from collections.abc import Callable

from teller.eval.baselines import FixedThreshold, GaussianMixtureBaseline, StepZScore
from teller.localize.localizer import NumericLocalizer

METHODS: dict[str, Callable[[], object]] = {
    "localizer": NumericLocalizer,
    "threshold": FixedThreshold,
    "zscore": StepZScore,
    "gmm": GaussianMixtureBaseline,
}
