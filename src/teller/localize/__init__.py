"""Numeric candidate localization: robust z-scores across ranks, steps and layers.

The public names other stages import; the modules below hold one job each (`localizer` composes
them into `NumericLocalizer`).
"""

from teller.localize.candidates import (
    FRESH,
    NEW_OPERATOR,
    SCORING_TABLES,
    SUBSTITUTED,
    keep_top,
)
from teller.localize.features import median_mad, robust_z
from teller.localize.hang import HANG_NS, hang_explanation, unfinished_step
from teller.localize.localizer import NumericLocalizer
from teller.localize.results import Localization, OperatorCandidate, StepExplanation, StepScore
from teller.localize.step_model import StepModel, design, fit_step_model
from teller.localize.transfer import transfer_residuals

__all__ = [
    "FRESH",
    "HANG_NS",
    "NEW_OPERATOR",
    "SCORING_TABLES",
    "SUBSTITUTED",
    "Localization",
    "NumericLocalizer",
    "OperatorCandidate",
    "StepExplanation",
    "StepModel",
    "StepScore",
    "design",
    "fit_step_model",
    "hang_explanation",
    "keep_top",
    "median_mad",
    "robust_z",
    "transfer_residuals",
    "unfinished_step",
]
