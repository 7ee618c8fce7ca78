"""Evaluation: metrics, baselines and the scoreboard (DESIGN.md §5)."""
