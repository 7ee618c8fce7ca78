"""The methods the scoreboard compares, by name; each builds a fresh, unfitted estimator."""

from __future__ import annotations

from collections.abc import Callable

from teller.eval.baselines import FixedThreshold, GaussianMixtureBaseline, StepZScore
from teller.localize.localizer import NumericLocalizer
from teller.rca.infer import RootCauseMethod, variant_dir

METHODS: dict[str, Callable[[], object]] = {
    "localizer": NumericLocalizer,
    "threshold": FixedThreshold,
    "zscore": StepZScore,
    "gmm": GaussianMixtureBaseline,
    "model": lambda: RootCauseMethod(variant_dir("model")),
    "model-no-logs": lambda: RootCauseMethod(variant_dir("no-logs")),
    "model-no-numeric": lambda: RootCauseMethod(variant_dir("no-numeric")),
    "model-raw-nodes": lambda: RootCauseMethod(variant_dir("raw-nodes")),
}
