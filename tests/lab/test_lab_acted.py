"""The lab labels the window steps its fault acted on, as the fault's own counter tells."""

from __future__ import annotations

import json

import numpy as np

from teller.lab.acted import (
    STEPS_FILE,
    FaultCounter,
    fault_counter,
    steps_acted_on,
    steps_held_back,
)
from teller.lab.faults.host_stall import GcStorm, collections_file
from teller.lab.faults.link_counters import FILE_NAME

MS = 1_000_000


def _steps(*spans_ms: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.array([a for a, _ in spans_ms], dtype=np.int64) * MS
    ends = np.array([b for _, b in spans_ms], dtype=np.int64) * MS
    return starts, ends


def test_throttled_time_covers_the_stretch_before_the_sample_that_added_it():
    # the kernel adds a throttled stretch when it ends: 15 ms added by the sample at 30 ms
    # means the rank was held from 15 to 30 ms, not somewhere between 20 and 30
    counter = FaultCounter(
        "throttled_ns",
        np.array([0, 10, 20, 30, 40]) * MS,
        np.array([0, 0, 0, 15, 15]) * MS,
        "host/rank0.jsonl",
    )
    starts, ends = _steps((0, 12), (13, 16), (17, 30), (31, 40))
    assert steps_acted_on(starts, ends, counter).tolist() == [False, True, True, False]
    # a step's span runs from the end of the rank's previous step: held back between steps, the
    # rank reaches the step's first collective late
    starts, ends = _steps((0, 12), (31, 40))
    assert steps_acted_on(starts, ends, counter).tolist() == [False, True]


def test_counted_events_mark_every_step_between_the_two_samples():
    times, counts = np.array([0, 10, 20, 30]) * MS, np.array([0, 0, 7, 7.0])
    counter = FaultCounter("major_faults", times, counts, "host/rank0.jsonl")
    starts, ends = _steps((0, 9), (9, 12), (12, 20), (21, 29))
    assert steps_acted_on(starts, ends, counter).tolist() == [False, True, True, False]
    # the steps may come in any order: each is matched with its own predecessor in time
    order = [2, 0, 3, 1]
    acted = steps_acted_on(starts[order], ends[order], counter)
    assert acted.tolist() == [True, False, False, True]


def test_a_flat_counter_marks_no_step():
    counter = FaultCounter(
        "major_faults", np.array([0, 10, 20]) * MS, np.zeros(3), "host/rank0.jsonl"
    )
    starts, ends = _steps((0, 5), (5, 20))
    assert not steps_acted_on(starts, ends, counter).any()
    assert len(steps_acted_on(starts[:0], ends[:0], counter)) == 0


def test_the_rate_limits_counter_is_read_from_the_recording(tmp_path):
    (tmp_path / "run").mkdir()
    assert fault_counter(tmp_path, "net_throttle", 1) is None  # not sampled: the window stands
    rows = [{"t_ns": 100 + 10 * k, "overlimits": n} for k, n in enumerate([0, 0, 5, 9])]
    (tmp_path / "run" / FILE_NAME).write_text("".join(json.dumps(r) + "\n" for r in rows))
    counter = fault_counter(tmp_path, "net_throttle", 1)
    assert counter is not None and counter.name == "link_overlimits"
    assert counter.source == f"run/{FILE_NAME}"
    assert counter.values.tolist() == [0, 0, 5, 9]
    assert fault_counter(tmp_path, "slow_operator", 1) is None  # a fault without a counter


def test_a_gc_storm_marks_the_steps_its_collections_overlapped(tmp_path):
    assert fault_counter(tmp_path, "host_stall", 1) is None  # not recorded: the window stands
    # collections at 10-30 ms and 70-75 ms, written out of order; the storm sleeps between
    storm = GcStorm(lambda: True, 0.5)
    storm.collections = [(70 * MS, 75 * MS), (10 * MS, 30 * MS)]
    storm.write(collections_file(tmp_path / "ground_truth", 1))
    counter = fault_counter(tmp_path, "host_stall", 1)
    assert counter is not None and counter.name == "gc_collect_ns"
    assert counter.source == "ground_truth/gc_collections_rank1.jsonl"
    assert counter.values[-1] == 25 * MS  # time spent collecting, cumulative
    # a step is marked where a collection ran between its predecessor's end and its own end
    starts, ends = _steps((0, 8), (9, 12), (31, 45), (46, 60), (61, 69), (71, 80), (81, 90))
    acted = steps_acted_on(starts, ends, counter)
    assert acted.tolist() == [False, True, True, False, False, True, False]
    assert fault_counter(tmp_path, "host_stall", 0) is None  # another rank's storm
    (collections_file(tmp_path / "ground_truth", 1)).write_text("{not json\n")
    assert fault_counter(tmp_path, "host_stall", 1) is None


def test_a_capped_scheduler_marks_the_steps_its_limits_held_work_back_in(tmp_path):
    truth = tmp_path / "ground_truth"
    truth.mkdir()
    rows = [{"step": k, "annotation": "", "held_back": k in (2, 3)} for k in range(5)]
    (truth / STEPS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert steps_held_back(tmp_path).tolist() == [2, 3]
    # a recording made before the engine said it: the window stands
    (truth / STEPS_FILE).write_text(json.dumps({"step": 0, "annotation": ""}) + "\n")
    assert steps_held_back(tmp_path) is None
    assert steps_held_back(tmp_path / "elsewhere") is None
