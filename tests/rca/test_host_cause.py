"""Which host slowdown the sampled counters name, and how the explanation states it."""

from __future__ import annotations

from teller.rca.context import Measured, StepContext
from teller.rca.explain import compose
from teller.rca.host import host_cause, refined_fault
from teller.rca.plans import parse

MS = 1_000_000


def _context(**counters: tuple[float, float]) -> StepContext:
    return StepContext(
        iteration=40,
        kind="decode",
        step_dur_ns=300 * MS,
        expected_ns=60 * MS,
        rank=1,
        rank_dur_ns=300 * MS,
        ranks=2,
        candidate=None,
        host_counters={k: Measured(*v) for k, v in counters.items()},
    )


def test_a_quota_names_the_straggler_and_a_run_queue_a_co_tenant() -> None:
    throttled = _context(throttled_ns=(200 * MS, 0), run_delay_ns=(20 * MS, 5 * MS))
    assert host_cause(throttled)[:2] == ("straggler", "throttled_ns")
    assert refined_fault(throttled, "host_stall") == "straggler"
    queued = _context(throttled_ns=(0, 0), run_delay_ns=(150 * MS, 5 * MS))
    assert refined_fault(queued, "straggler") == "cpu_contention"
    stopped = _context(throttled_ns=(0, 0), stopped_ns=(120 * MS, 0))
    assert host_cause(stopped)[:2] == ("straggler", "stopped_ns")


def test_busy_cpu_with_no_quota_or_queue_is_the_rank_s_own_stall() -> None:
    busy = _context(throttled_ns=(0, 0), run_delay_ns=(1 * MS, 1 * MS), cpu_ns=(250 * MS, 50 * MS))
    assert refined_fault(busy, "straggler") == "host_stall"


def test_small_rises_and_faults_outside_the_host_leave_the_fault_as_it_was() -> None:
    quiet = _context(throttled_ns=(5 * MS, 0), run_delay_ns=(8 * MS, 4 * MS))
    assert (
        host_cause(quiet) is None and refined_fault(quiet, "memory_pressure") == "memory_pressure"
    )
    throttled = _context(throttled_ns=(200 * MS, 0))
    assert refined_fault(throttled, "slow_operator") == "slow_operator"


def test_the_explanation_states_the_counter_and_drops_the_no_host_metrics_caveat() -> None:
    text = compose(_context(throttled_ns=(200 * MS, 0)), "straggler", "none").text
    assert "Host counters: rank 1's CPU quota throttled it for 200 ms of this step" in text
    assert "No host metrics" not in text
    assert parse(text) is not None, text
