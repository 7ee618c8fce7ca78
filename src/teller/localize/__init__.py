"""Numeric candidate localization: robust z-scores across ranks, steps and layers."""
