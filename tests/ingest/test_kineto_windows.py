"""A Kineto file read once to disk and back a time window at a time (`kineto_windows`): the
windows together are the file as `read_trace(args=False)` reads it, row for row, on real traces."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from conftest import real_trace
from teller.errors import TraceError
from teller.ingest import read_trace
from teller.ingest.kineto_windows import BUCKET_NS, read_window, spill_kineto

#: Real traces large enough to be read in several slices, from Kineto and from vLLM.
SLICED = [
    "hta/df_index_resolver_rank1_of2_216k_events.json.gz",
    "tracelens/sglang_Qwen3-8B_prefilldecode.json.gz",
]


@pytest.mark.parametrize("relative", SLICED)
def test_windows_of_a_spilled_trace_are_the_file_row_for_row(relative: str, tmp_path: Path) -> None:
    path = real_trace(relative)
    spilled = spill_kineto(path, tmp_path / "slices")
    whole = read_trace(path, args=False)
    assert spilled.events == whole.table.num_rows
    assert len(spilled.slices) > 1  # read in slices, each written as it was sealed
    assert sum(spilled.events_of_bucket.values()) == spilled.events
    first, last = min(spilled.events_of_bucket), max(spilled.events_of_bucket)
    start, end = first * BUCKET_NS, (last + 1) * BUCKET_NS
    every = read_window(spilled, start, end)
    assert every is not None
    for column in whole.table.column_names:
        if column != "args":
            assert every.table.column(column).equals(whole.table.column(column)), column
    assert every.sources[0].to_json() == whole.sources[0].to_json()
    # two halves: every row in exactly one, by where it starts
    middle = (start + end) // 2
    halves = [read_window(spilled, start, middle), read_window(spilled, middle, end)]
    ts = whole.table.column("ts_ns").to_numpy()
    assert [h.table.num_rows if h else 0 for h in halves] == [
        int((ts < middle).sum()),
        int((ts >= middle).sum()),
    ]
    assert read_window(spilled, end, end + BUCKET_NS) is None  # nothing starts there


def test_a_cut_trace_is_read_as_far_as_it_goes_with_a_warning(tmp_path: Path) -> None:
    text = gzip.decompress(real_trace(SLICED[0]).read_bytes())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(text[: len(text) // 2]))  # ends mid-event, no closing bracket
    spilled = spill_kineto(cut, tmp_path / "slices")
    whole = read_trace(real_trace(SLICED[0]), args=False)
    assert 0 < spilled.events < whole.table.num_rows
    assert "cut short or damaged" in spilled.source["warnings"][-1]
    first, last = min(spilled.events_of_bucket), max(spilled.events_of_bucket)
    read = read_window(spilled, first * BUCKET_NS, (last + 1) * BUCKET_NS)
    assert read is not None and read.table.num_rows == spilled.events
    assert any("cut short" in w for w in read.sources[0].warnings)


def test_a_trace_that_cannot_be_sliced_is_refused_naming_it(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.json"
    wrong.write_bytes(b'{"traceEvents": 3, "x": "' + b"y" * (1 << 20) + b'"}')
    with pytest.raises(TraceError) as refused:
        spill_kineto(wrong, tmp_path / "slices")
    assert "wrong.json" in str(refused.value)
    assert "too large to read whole" in str(refused.value)


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"  \n")
    with pytest.raises(TraceError, match="empty file"):
        spill_kineto(empty, tmp_path / "slices")
