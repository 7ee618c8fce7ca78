"""Reading host counter files: a cut-off last line, a broken one, a counter that was reset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from teller.errors import TellerError
from teller.ingest.host import cumulative_at, read_host_file, read_host_files


def _sample(t_ns: int, throttled: int, stopped: bool = False) -> str:
    return json.dumps(
        {
            "t_ns": t_ns,
            "cpu_ns": t_ns // 2,
            "run_delay_ns": 0,
            "throttled_ns": throttled,
            "memory_stall_ns": -1,
            "major_faults": 7,
            "stopped": stopped,
        }
    )


def test_a_cut_off_last_line_is_left_out_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    path.write_text("\n".join([_sample(0, 0), _sample(10, 5), _sample(20, 9)[:30]]))
    series, warnings = read_host_files([path])
    assert len(series) == 1 and len(series[0]) == 2
    assert warnings == [f"{path}: the last host sample (line 3) is cut off; left out"]


def test_a_broken_line_inside_names_the_file_and_line(tmp_path: Path) -> None:
    """Reading the file is an error naming it and the line; the run's reader leaves the file out
    with that as a warning, and the traces are analysed without its counters."""
    path = tmp_path / "rank1.jsonl"
    path.write_text("\n".join([_sample(0, 0), "{not json", _sample(20, 9)]))
    with pytest.raises(TellerError, match=r"rank1\.jsonl: line 2 is not a host sample"):
        read_host_file(path, 1)
    series, warnings = read_host_files([path])
    assert series == [] and warnings[0].endswith("; its host counters are left out")
    assert "rank1.jsonl: line 2 is not a host sample" in warnings[0]


def test_a_reset_counter_keeps_its_rises_and_an_unreadable_one_is_nan(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    rows = [_sample(0, 0), _sample(10, 100), _sample(20, 0), _sample(30, 40, True), _sample(40, 40)]
    path.write_text("\n".join(rows) + "\n")
    series, warning = read_host_file(path, 0)
    assert warning is None
    assert series.counters["throttled_ns"].tolist() == [0, 100, 100, 140, 140]
    assert np.isnan(series.counters["memory_stall_ns"]).all()
    assert series.stopped_ns.tolist() == [0, 0, 0, 0, 10]


def test_a_file_not_named_after_a_rank_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "1234.jsonl"
    path.write_text(_sample(0, 0))
    series, warnings = read_host_files([path])
    assert series == [] and "not a rank's host counters" in warnings[0]


def test_time_the_kernel_adds_when_a_stretch_ends_is_placed_before_its_sample() -> None:
    ms = 1_000_000
    t_ns = np.array([0, 10, 20, 30, 40]) * ms
    values = np.array([0, 0, 0, 25, 25], dtype=np.float64) * ms  # 25 ms added at 30 ms
    at = np.array([0, 5, 10, 20, 30, 40]) * ms
    # throttled time: the 25 ms ran from 5 to 30 ms, one ms per ms
    throttled = cumulative_at("throttled_ns", t_ns, values, at) / ms
    assert throttled.tolist() == [0, 0, 5, 15, 25, 25]
    # a counter that grows as things happen is spread over the interval between its samples
    faults = cumulative_at("major_faults", t_ns, values / ms, at)
    assert faults.tolist() == [0, 0, 0, 0, 25, 25]
    # an unreadable counter stays unknown
    unknown = cumulative_at("throttled_ns", t_ns, np.full(5, np.nan), at)
    assert np.isnan(unknown).all()
