"""The timestamped log format: byte-for-byte lines behind a fixed 28-byte UTC prefix."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from teller.collect.inject._teller_collect_tee import tee, timestamp_prefix
from teller.collect.logs import PREFIX_BYTES, read_log, split_prefix
from teller.errors import TraceError


def test_prefix_is_iso_utc_with_microseconds():
    wall_ns = 1_796_026_480_353_255_712  # 2026-11-30T08:14:40.353255712Z
    prefix = timestamp_prefix(wall_ns)
    assert prefix == b"2026-11-30T08:14:40.353255Z "
    assert len(prefix) == PREFIX_BYTES
    assert split_prefix(prefix + b"hello\n") == (wall_ns // 1000 * 1000, b"hello\n")


def test_tee_forwards_raw_bytes_and_logs_every_line(tmp_path: Path):
    """Invalid UTF-8, carriage returns and an unterminated last line all survive, on both streams."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    console_r, console_w = os.pipe()
    written_out = b"first line\nbad \xff\xfe utf-8\nprogress 1\rprogress 2\nno newline at end"
    written_err = b"WARNING something\n"
    os.write(out_w, written_out)
    os.write(err_w, written_err)
    os.close(out_w)
    os.close(err_w)
    before_ns = time.time_ns()
    log = tmp_path / "x.log"
    tee([(out_r, console_w), (err_r, None)], str(log))
    after_ns = time.time_ns()
    os.close(console_w)
    assert os.read(console_r, 1 << 16) == written_out  # passed through untouched
    lines = list(read_log(log))
    raws = sorted(line.raw for line in lines)
    assert raws == sorted(
        [
            b"first line",
            b"bad \xff\xfe utf-8",
            b"progress 1\rprogress 2",
            b"no newline at end",
            b"WARNING something",
        ]
    )
    assert all(before_ns - 1000 <= line.wall_ns <= after_ns for line in lines)


def test_read_log_names_file_and_line_of_a_bad_line(tmp_path: Path):
    log = tmp_path / "rank0.log"
    log.write_bytes(timestamp_prefix(time.time_ns()) + b"ok\nnot a collector line\n")
    with pytest.raises(TraceError) as caught:
        list(read_log(log))
    assert caught.value.path == str(log)
    assert caught.value.where == "line 2"
