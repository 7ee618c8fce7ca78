"""Each reader's boundary, pinned on the malformed values users' files have held: the value is
skipped and counted when the rest of the file is sound, else one TraceError names the file, the
place and what was expected. Never another exception type."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from conftest import real_trace
from teller.errors import TraceError, printable
from teller.ingest import read_run, read_trace
from teller.ingest.logs import read_logs
from teller.ingest.otlp import read_spans

KERNEL = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10.0, "dur": 5.0}
CPU_OP = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 9.0, "dur": 9.0}


def write_events(path: Path, *events: str) -> Path:
    """A trace whose events are raw JSON text, so literals Python would not write fit in."""
    path.write_text('{"traceEvents": [' + ", ".join(events) + "]}")
    return path


def with_field(event: dict, key: str, literal: str) -> str:
    fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in event.items() if k != key]
    return "{" + ", ".join([*fields, f"{json.dumps(key)}: {literal}"]) + "}"


@pytest.mark.parametrize(
    ("key", "literal", "reason"),
    [
        ("ts", "-1e999", "ts not finite"),
        ("ts", "1e300", "ts not finite or beyond int64"),
        ("dur", "1e999", "dur not finite"),
        ("dur", str(2**63 // 1000 + 1), "dur not finite or beyond int64"),
        ("ts", "NaN", "ts not finite"),
    ],
)
def test_times_beyond_int64_ns_are_skipped_and_counted(tmp_path, key, literal, reason) -> None:
    path = write_events(
        tmp_path / "rank0.json", json.dumps(CPU_OP), with_field(KERNEL, key, literal)
    )
    events = read_trace(path)
    assert len(events) == 1
    assert (events.table.column("dur_ns").to_numpy() >= 0).all()
    assert any(reason in w and "first at event 1" in w for w in events.warnings)


@pytest.mark.parametrize(
    ("key", "literal"),
    [
        ("pid", str(10**30)),
        ("tid", '"\u2460"'),
        ("pid", "NaN"),
        ("tid", "Infinity"),
        ("pid", "-1e999"),
    ],
)
def test_ids_of_the_wrong_type_or_beyond_int64_do_not_crash(tmp_path, key, literal) -> None:
    path = write_events(
        tmp_path / "rank0.json", json.dumps(CPU_OP), with_field(KERNEL, key, literal)
    )
    events = read_trace(path)
    assert len(events) == 2
    assert str(events.table.column(key).type) == "int64"


def test_a_rank_in_unicode_digits_is_not_a_rank(tmp_path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(
        json.dumps(
            {"traceEvents": [CPU_OP], "distributedInfo": {"rank": "\u00b2", "world_size": 2}}
        )
    )
    assert read_trace(path).ranks == [0]


def test_an_id_beyond_int64_in_args_is_read_as_unknown_and_counted(tmp_path) -> None:
    args = '{"correlation": ' + str(10**30) + ', "External id": "\u2460"}'
    path = write_events(tmp_path / "rank0.json", with_field(KERNEL, "args", args))
    events = read_trace(path)
    assert events.table.column("correlation").to_pylist() == [-1]
    assert any("correlation beyond int64" in w for w in events.warnings)


@pytest.mark.parametrize("where", ["name", "document", "args"])
def test_nesting_past_the_depth_limit_is_a_trace_error_naming_the_byte(tmp_path, where) -> None:
    deep = "[" * 5000 + "]" * 5000
    path = tmp_path / "rank0.json"
    if where == "document":
        path.write_text(deep)
    else:
        write_events(path, json.dumps(CPU_OP), with_field(KERNEL, where, deep))
    with pytest.raises(TraceError, match="nested more than 256 levels") as error:
        read_trace(path)
    assert error.value.path == str(path) and error.value.where.startswith("byte ")


def test_a_base_time_that_overflows_int64_is_ignored_with_a_warning(tmp_path) -> None:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": [CPU_OP], "baseTimeNanoseconds": 2**63 - 2}))
    events = read_trace(path)
    assert events.table.column("ts_ns").to_pylist() == [9000]
    assert any("beyond int64" in w for w in events.warnings)


@pytest.mark.parametrize("value", [None, "text", b"\x00\xff", 1e300, 2.5])
def test_nsys_non_integer_kernel_start_names_table_and_row(tmp_path, value) -> None:
    path = tmp_path / "export.sqlite"
    shutil.copy(real_trace("nsys_ai/healthy_1pct.sqlite"), path)
    with sqlite3.connect(path) as connection:
        connection.execute(
            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = ? WHERE rowid = "
            "(SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1 OFFSET 3)",
            (value,),
        )
    with pytest.raises(TraceError) as error:
        read_trace(path)
    assert error.value.path == str(path)
    assert "table CUPTI_ACTIVITY_KIND_KERNEL, row" in error.value.where
    assert "integer" in error.value.what


def test_nsys_blob_string_and_text_copy_kind_do_not_crash(tmp_path) -> None:
    path = tmp_path / "export.sqlite"
    shutil.copy(real_trace("nsys_ai/mock_tiny_real_export.sqlite"), path)
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE StringIds SET value = ? WHERE rowid % 3 = 0", (b"\xff\x00",))
        tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master")}
        if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
            connection.execute("UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET srcKind = 'host'")
    try:
        read_trace(path)
    except TraceError as error:
        assert error.path == str(path)


def test_a_gzip_file_named_log_is_read_and_a_corrupt_one_refused(tmp_path) -> None:
    line = b"INFO 02-13 11:33:33 [a.py:1] Added request r1.\n"
    plain_name = tmp_path / "one" / "rank0.log"
    plain_name.parent.mkdir()
    plain_name.write_bytes(gzip.compress(line * 3))
    assert len(read_logs([plain_name], year=2025)) == 3
    corrupt = tmp_path / "two" / "rank0.log.gz"
    corrupt.parent.mkdir()
    packed = bytearray(gzip.compress(line * 200))
    packed[len(packed) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(packed))
    with pytest.raises(TraceError, match="corrupt gzip") as error:
        read_logs([corrupt], year=2025)
    assert error.value.path == str(corrupt)


@pytest.mark.parametrize(
    "stamp",
    ["0000-01-01T00:00:00.000000Z", "2262-04-12T00:00:00.000000Z", "9999-12-31T23:59:59.999999Z"],
)
def test_collector_dates_outside_int64_ns_are_impossible_dates(tmp_path, stamp) -> None:
    good = "2025-02-13T11:33:33.000000Z INFO 02-13 11:33:33 [a.py:1] fine"
    path = tmp_path / "rank0.log"
    path.write_text("\n".join([good, f"{stamp} INFO 12-31 23:59:59 [a.py:1] odd", good]) + "\n")
    logs = read_logs([path])
    assert logs.sources[0].counts["impossible_dates"] >= 1
    assert (logs.table.column("ts_ns").to_numpy() >= 0).all()


@pytest.mark.parametrize("scope_spans", ['"text"', "[1]", '[{"spans": 3}]', '[{"spans": [[]]}]'])
def test_otlp_structure_of_the_wrong_type_names_where(tmp_path, scope_spans) -> None:
    path = tmp_path / "spans.json"
    path.write_text('{"resourceSpans": [{"resource": {}, "scopeSpans": ' + scope_spans + "}]}")
    with pytest.raises(TraceError) as error:
        read_spans([path])
    assert error.value.path == str(path) and "resourceSpans[0]" in error.value.where


def test_printable_escapes_what_a_terminal_would_act_on() -> None:
    assert printable("a\x1b[2Jb\x07\u202ec\n") == "a\\x1b[2Jb\\x07\\u202ec\n"
    assert printable("x\ny\tz", one_line=True) == "x\\ny\\tz"
    assert "\x1b" not in str(TraceError("t\x1b]0;x\x07.json", "bad \x1b[31mname"))


def test_one_bad_rank_file_does_not_stop_the_others(tmp_path) -> None:
    good = real_trace("hta/sampled_rank0_of128.json.gz")
    bad = tmp_path / "rank1.json"
    bad.write_text("[" * 5000)
    run = read_run([good, bad])
    assert run.ranks == read_trace(good).ranks
    (warning,) = [w for w in run.warnings if "rank file left out" in w]
    assert str(bad) in warning
    with pytest.raises(TraceError) as error:
        read_run([bad])
    assert error.value.path == str(bad)
