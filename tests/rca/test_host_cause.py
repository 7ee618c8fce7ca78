"""Which host slowdown the sampled counters name, and how the explanation states it."""

from __future__ import annotations

import numpy as np

from teller.align.host import MEASURES, HostSteps
from teller.analysis import Analysis
from teller.rca.context import Measured, StepContext
from teller.rca.dataset import read_case_records
from teller.rca.explain import compose
from teller.rca.host import (
    HELD_SHARE,
    cause_of,
    held_off_share,
    pooled_fault,
    readings,
    retyping_readings,
    stated_reading,
)
from teller.rca.infer import HELD_SLOWER, held_off_cpu
from teller.rca.plans import parse

from .conftest import small_case

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


def _cause(c: StepContext) -> tuple[str, str] | None:
    found = cause_of(readings(c), c.rank_dur_ns)
    return found[:2] if found is not None else None


def test_a_quota_names_the_straggler_and_a_run_queue_a_co_tenant() -> None:
    # a throttled task waits queued: its run delay holds the throttled time too
    throttled = _context(throttled_ns=(200 * MS, 0), run_delay_ns=(215 * MS, 5 * MS))
    assert _cause(throttled) == ("straggler", "throttled_ns")
    queued = _context(throttled_ns=(0, 0), run_delay_ns=(150 * MS, 5 * MS))
    assert _cause(queued) == ("cpu_contention", "run_delay_ns")
    stopped = _context(throttled_ns=(0, 0), stopped_ns=(120 * MS, 0))
    assert _cause(stopped) == ("straggler", "stopped_ns")


def test_busy_cpu_with_no_quota_or_queue_is_the_rank_s_own_stall() -> None:
    busy = _context(throttled_ns=(0, 0), run_delay_ns=(1 * MS, 1 * MS), cpu_ns=(250 * MS, 50 * MS))
    assert _cause(busy) == ("host_stall", "cpu_ns")


def test_a_window_is_typed_by_its_steps_together_and_each_states_its_own_rise() -> None:
    """One step of the window is throttled little (the quota's period had not run out): the
    window is still the straggler's, and that step states no counter."""
    heavy = _context(throttled_ns=(200 * MS, 0), run_delay_ns=(210 * MS, 10 * MS))
    light = _context(throttled_ns=(5 * MS, 0), run_delay_ns=(40 * MS, 10 * MS))
    assert _cause(light) is None
    assert pooled_fault([heavy, light]) == "straggler"
    assert stated_reading(light, "straggler") is None
    assert stated_reading(heavy, "straggler")[0] == "throttled_ns"
    assert stated_reading(heavy, "slow_operator") is None


def test_small_rises_name_nothing() -> None:
    quiet = _context(throttled_ns=(5 * MS, 0), run_delay_ns=(8 * MS, 4 * MS))
    assert _cause(quiet) is None and pooled_fault([quiet]) is None


def test_the_explanation_states_the_counter_and_drops_the_no_host_metrics_caveat() -> None:
    text = compose(_context(throttled_ns=(200 * MS, 0)), "straggler", "none").text
    assert "Host counters: rank 1's CPU quota throttled it for 200 ms of this step" in text
    assert "No host metrics" not in text
    assert parse(text) is not None, text


def test_a_link_fault_is_retyped_only_by_a_quota_and_only_for_host_run_collectives() -> None:
    """gloo's transfers run on the throttled rank's threads, so its collectives look slow; its
    own CPU time names nothing there (a slow transfer keeps a thread busy too)."""
    on_host = retyping_readings("net_throttle", host_run_collectives=True)
    assert "cpu_ns" not in on_host and "run_delay_ns" in on_host
    assert retyping_readings("net_throttle", host_run_collectives=False) == {
        "throttled_ns",
        "stopped_ns",
    }
    assert "cpu_ns" in retyping_readings("straggler", host_run_collectives=False)
    throttled = _context(throttled_ns=(200 * MS, 0))
    assert pooled_fault([throttled], on_host) == "straggler"
    busy = _context(throttled_ns=(0, 0), cpu_ns=(250 * MS, 50 * MS))
    assert pooled_fault([busy], on_host) is None


def test_any_learned_type_gives_way_to_a_rank_held_off_a_cpu_and_only_to_that() -> None:
    """A learned type head can read a throttled rank's steps as an engine-wide fault (a
    scheduler's small batches); the quota's throttled time is measured, so it names the cause.
    A co-tenant's run queue or the rank's own busy CPU does not re-type such a finding: both
    also rise under the faults the head may rightly have named."""
    held_off = retyping_readings("scheduler_misconfig", host_run_collectives=False)
    assert pooled_fault([_context(throttled_ns=(200 * MS, 0))], held_off) == "straggler"
    assert pooled_fault([_context(throttled_ns=(0, 0), stopped_ns=(90 * MS, 0))], held_off) == (
        "straggler"
    )
    queued = _context(throttled_ns=(0, 0), run_delay_ns=(150 * MS, 5 * MS))
    busy = _context(throttled_ns=(0, 0), cpu_ns=(250 * MS, 50 * MS))
    assert pooled_fault([queued], held_off) is None
    assert pooled_fault([busy], held_off) is None
    assert pooled_fault([queued]) == "cpu_contention"


def test_a_slow_step_whose_rank_the_counters_show_held_off_a_cpu_is_flagged() -> None:
    """The floor under the step head: throttling beyond the rank's usual on a step that ran half
    again its expected time flags it; the same throttling on a step at its usual time does not,
    and a rank throttled in every step counts only what a step adds."""
    case = small_case("straggler", rank=1, seed=11, gpus=4)  # steps 17 and 19 ran ~5x expected
    tree = Analysis(case).tree
    steps = tree.steps
    throttled = np.zeros(len(steps))
    window = (steps.rank == 1) & np.isin(steps.index, [16, 17, 18, 19])
    throttled[window] = 0.4 * steps.dur_ns[window]
    throttled[steps.rank == 2] = 0.3 * steps.dur_ns[steps.rank == 2]  # a quota in every step
    added = {name: np.full(len(steps), np.nan) for name in MEASURES}
    added["throttled_ns"] = throttled
    share = held_off_share(tree, HostSteps(added, frozenset({0, 1, 2, 3})))
    assert {i for i, s in share.items() if s >= HELD_SHARE} == {16, 17, 18, 19}
    records = read_case_records(case)
    held = held_off_cpu(records, share)
    flagged = {r.iteration for r, f in zip(records, held, strict=True) if f}
    slow = {r.iteration for r in records if r.dur_ns >= HELD_SLOWER * r.expected_ns}
    assert flagged == {17, 19} == slow & {16, 17, 18, 19}
