"""The counter shift between a log's iteration lines and the traced steps (`logtime`), when the
log runs far longer than the capture or its time window: found among the best-correlated shifts
instead of scoring every one (10⁵ lines against 10³ steps took minutes per window; timed in
docs/benchmarks.md, not here)."""

from __future__ import annotations

import numpy as np
import pytest

from teller.align.logtime import EXACT_SHIFTS, _counter_shift

LINES = 150_000


@pytest.fixture(scope="module")
def iterations() -> tuple[list[int], list[int], np.ndarray]:
    """A long log's iteration lines (counter, printed elapsed ns) and the durations behind them."""
    rng = np.random.default_rng(0)
    durations = np.exp(rng.normal(np.log(5e6), 0.5, LINES)).astype(np.int64)
    printed = (durations * rng.uniform(0.97, 1.03, LINES)).astype(np.int64)
    return list(range(LINES)), printed.tolist(), durations


@pytest.mark.parametrize(
    ("first", "last", "shift"),
    [(0, 3_000, 0), (70_000, 73_000, 0), (0, 3_000, 5), (1_000, LINES, -3)],
)
def test_the_shift_is_found_for_a_window_of_a_long_log(iterations, first, last, shift) -> None:
    counters, printed, durations = iterations
    steps = {o: int(durations[o - shift]) for o in range(first, last) if 0 <= o - shift < LINES}
    assert last - first + LINES > EXACT_SHIFTS  # the correlation path, not every shift
    warnings: list[str] = []
    assert _counter_shift(counters, printed, steps, warnings) == shift
    assert warnings == []
