"""A composition slower than the step line all through the run is its own cost, not a fault.

On the repository's recorded lab run (fault-free, TP 2), one recurring decode batch is made
three times slower wherever it runs: its steps are expected at that cost and none is flagged.
The same slowdown over a window of consecutive steps, whatever they batch, is a fault: the rule
leaves it to the step model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from teller.callchain.facts import Iterations, RunFacts
from teller.callchain.tree import build_tree
from teller.ingest import read_run
from teller.localize.compositions import MIN_RECURRENCES, composition_costs, composition_keys
from teller.localize.step_model import score_steps

LAB_TRACES = Path(__file__).parents[1] / "align" / "data" / "lab_none_tp2" / "traces"
SLOWER = 3.0


@pytest.fixture(scope="module")
def recorded() -> RunFacts:
    return RunFacts(build_tree(read_run([LAB_TRACES])))


def _slowed(facts: RunFacts, rows: np.ndarray) -> RunFacts:
    """The run's facts with the iterations at `rows` taking `SLOWER` times as long."""
    iterations = facts.iterations
    dur = iterations.dur_ns.copy()
    dur[rows] *= SLOWER
    slowed = RunFacts(facts.tree)
    slowed.__dict__["iterations"] = dataclasses.replace(iterations, dur_ns=dur)
    return slowed


def _recurring(iterations: Iterations, below: int | None = None) -> np.ndarray:
    """The rows of a composition with steps of others between its recurrences: of those that
    recur `MIN_RECURRENCES` times or more, the one spanning the fewest steps (a window over its
    span is then a short fault); with `below`, the one recurring most often under that count."""
    keys = composition_keys(iterations)
    rows = {key: np.flatnonzero([k == key for k in keys]) for key in set(keys)}
    if below is not None:
        fewer = [r for r in rows.values() if len(r) < below]
        return max(fewer, key=len)
    spread = [r for r in rows.values() if len(r) >= MIN_RECURRENCES and r[-1] - r[0] >= 2 * len(r)]
    return min(spread, key=lambda r: r[-1] - r[0])


def _flagged(facts: RunFacts) -> set[int]:
    scores = score_steps(facts, {}, self_fit_keep=0.6, step_z=5.0, min_ratio=1.15)
    return {s.iteration for s in scores if s.anomalous}


def test_a_recurring_composition_slower_everywhere_is_expected_at_its_own_cost(recorded):
    rows = _recurring(recorded.iterations)
    slowed = _slowed(recorded, rows)
    iterations = slowed.iterations
    factor = composition_costs(iterations, recorded.iterations.dur_ns, min_ratio=1.15)
    assert factor[rows] == pytest.approx(SLOWER)
    assert np.all(np.delete(factor, rows) == 1.0)
    assert not _flagged(slowed) & set(iterations.iteration[rows].tolist())


def test_a_window_that_slows_every_step_stays_a_fault(recorded):
    rows = _recurring(recorded.iterations)
    window = np.arange(rows[0], rows[-1] + 1)  # the recurrences and every step between them
    slowed = _slowed(recorded, window)
    iterations = slowed.iterations
    factor = composition_costs(iterations, recorded.iterations.dur_ns, min_ratio=1.15)
    assert np.all(factor == 1.0)  # the step model scores the window as it would without the rule


def test_a_run_of_one_composition_alone_is_not_its_own_cost(recorded):
    """Consecutive steps of one composition, slowed, look like a window, not a cost of theirs."""
    keys = composition_keys(recorded.iterations)
    runs: list[list[int]] = []
    for row, key in enumerate(keys):
        if runs and keys[runs[-1][-1]] == key:
            runs[-1].append(row)
        else:
            runs.append([row])
    run = np.asarray(max(runs, key=len))
    assert len(run) >= MIN_RECURRENCES
    slowed = _slowed(recorded, run).iterations
    assert np.all(composition_costs(slowed, recorded.iterations.dur_ns, min_ratio=1.15) == 1.0)


def test_too_few_recurrences_or_a_small_excess_change_nothing(recorded):
    iterations = recorded.iterations
    rows = _recurring(iterations, below=MIN_RECURRENCES)
    assert len(rows) >= 2
    few = _slowed(recorded, rows).iterations
    assert np.all(composition_costs(few, iterations.dur_ns, min_ratio=1.15) == 1.0)
    slight = dataclasses.replace(iterations, dur_ns=iterations.dur_ns * 1.1)
    assert np.all(composition_costs(slight, iterations.dur_ns, min_ratio=1.15) == 1.0)


def test_a_recurrence_slower_than_its_composition_still_stands_out(recorded):
    """Expected at its composition's cost, with the kind's spread measured about that cost."""
    rows = _recurring(recorded.iterations)
    slowed = _slowed(recorded, rows)
    dur = slowed.iterations.dur_ns.copy()
    dur[rows[len(rows) // 2]] *= 4.0
    worse = RunFacts(recorded.tree)
    worse.__dict__["iterations"] = dataclasses.replace(slowed.iterations, dur_ns=dur)
    flagged = _flagged(worse) & set(worse.iterations.iteration[rows].tolist())
    assert flagged == {int(worse.iterations.iteration[rows[len(rows) // 2]])}
