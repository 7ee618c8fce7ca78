"""Numeric candidate localization: robust z-scores across ranks, steps and layers."""

from teller.localize.localizer import Localization, NumericLocalizer

__all__ = ["Localization", "NumericLocalizer"]
