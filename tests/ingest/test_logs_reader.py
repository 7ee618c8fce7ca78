"""What every log file gets: collector prefixes, bad bytes, unknown lines, disorder, bad paths."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from teller.collect.logs import timestamp_prefix
from teller.errors import TraceError
from teller.ingest.logs import read_logs, request_key

ADDED = "(APIServer pid=90458) INFO 02-13 11:33:33 [async_llm.py:382] Added request chatcmpl-a269fdcb7c6ce890-a8a65d16."
STATS = "(APIServer pid=90458) INFO 02-13 11:33:39 [loggers.py:257] Engine 000: Avg prompt throughput: 0.8 tokens/s, Avg generation throughput: 4.6 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%"


def test_collector_prefix_gives_exact_time_year_and_rank(tmp_path):
    wall_ns = [1_770_982_413_123_456_000, 1_770_982_419_000_001_000]  # 2026-02-13T11:33:33Z …
    path = tmp_path / "rank1.log"
    path.write_bytes(
        timestamp_prefix(wall_ns[0])
        + ADDED.encode()
        + b"\n"
        + timestamp_prefix(wall_ns[1])
        + STATS.encode()
        + b"\n"
    )
    table = read_logs([path])
    assert table.column("ts_ns") == wall_ns
    assert table.column("ts_exact") == [True, True]
    assert table.column("rank") == [1, 1]  # rank{R}.log is one rank's process
    assert table.column("event") == ["request_added", "stats"]
    assert table.column("raw")[0] == ADDED  # the prefix is not part of the engine's text
    assert table.sources[0].collector_prefix and not table.warnings


def test_invalid_utf8_is_counted_and_kept(tmp_path):
    path = tmp_path / "engine.log"
    path.write_bytes(ADDED.encode() + b"\n" + b"INFO 02-13 11:33:34 [x.py:1] caf\xe9 \xff\n")
    table = read_logs([path], year=2026)
    assert len(table) == 2
    assert table.column("raw")[1] == "INFO 02-13 11:33:34 [x.py:1] caf\ufffd \ufffd"
    assert table.sources[0].counts["invalid_utf8_lines"] == 1
    assert any("invalid UTF-8" in w for w in table.warnings)


def test_unknown_lines_get_stable_template_ids_and_numbers(tmp_path):
    lines = [
        "Loading weights took 3.51 GB and 12.3 seconds",
        "Loading weights took 4.10 GB and 2.7 seconds",
        "graph capturing finished in 5 secs, took 0.31 GiB",
        "\x00\x01 garbage ###",
    ]
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_text("\n".join(lines) + "\n")
    second.write_text("\n".join(reversed(lines)) + "\n")
    a, b = read_logs([first]), read_logs([second])
    ids_a = dict(zip(a.column("raw"), a.column("template_id"), strict=True))
    ids_b = dict(zip(b.column("raw"), b.column("template_id"), strict=True))
    assert ids_a == ids_b  # same shape, same id, whatever the order or run
    assert ids_a[lines[0]] == ids_a[lines[1]] != ids_a[lines[2]]
    assert a.column("template")[0] == "Loading weights took <NUM> GB and <NUM> seconds"
    assert json.loads(a.column("fields")[0]) == {"numbers": [3.51, 12.3]}
    assert a.column("format") == ["unparsed"] * 4 and a.column("event") == ["other"] * 4
    assert a.sources[0].counts["format_unparsed"] == 4  # counted, none dropped


def test_template_key_of_a_line_does_not_depend_on_the_rest_of_the_read(tmp_path):
    """drain generalises a template when a variant arrives; the line's own key stays put."""
    line = "Loading weights took 3.51 GB"
    variant = "Loading model took 4.10 GB"
    (tmp_path / "alone.log").write_text(line + "\n")
    (tmp_path / "both.log").write_text(line + "\n" + variant + "\n")
    alone = read_logs([tmp_path / "alone.log"])
    both = read_logs([tmp_path / "both.log"])
    assert alone.column("template") == ["Loading weights took <NUM> GB"]
    assert both.column("template") == ["Loading <*> took <NUM> GB"] * 2
    assert alone.column("template_id")[0] != both.column("template_id")[0]
    assert alone.column("template_key")[0] == both.column("template_key")[0]
    assert both.column("template_key")[0] != both.column("template_key")[1]
    engine = read_lines_of(tmp_path, [ADDED])  # a known shape: its key is its template's id
    assert engine.column("template_key") == engine.column("template_id")


def read_lines_of(tmp_path: Path, lines: list[str]):
    path = tmp_path / "engine.log"
    path.write_text("\n".join(lines) + "\n")
    return read_logs([path], year=2026)


def test_interleaved_processes_and_out_of_order_times_are_kept_and_counted(tmp_path):
    lines = [
        "(EngineCore_0 pid=2) INFO 02-13 11:33:35 [core.py:1] step a",
        "(APIServer pid=1) INFO 02-13 11:33:33 [api.py:1] late flush",
        "(EngineCore_0 pid=2) INFO 02-13 11:33:36 [core.py:1] step b",
        "(VllmWorker TP1 pid=3)   indented line from another process",
        "[rank1]:[E0213 11:33:30.000000001 ProcessGroupNCCL.cpp:1709] [Rank 1] Timeout at NCCL work: 7, last enqueued NCCL work: 7, last completed NCCL work: 6.",
    ]
    path = tmp_path / "mixed.log"
    path.write_text("\n".join(lines) + "\n")
    table = read_logs([path], year=2026)
    assert table.column("line") == [1, 2, 3, 4, 5]
    assert table.column("pid") == [2, 1, 2, 3, -1]
    assert table.column("rank") == [-1, -1, -1, 1, 1]
    assert table.sources[0].counts["out_of_order"] == 2
    assert any("earlier than the record before them" in w for w in table.warnings)


def test_out_of_range_times_of_day_are_counted_with_impossible_dates(tmp_path):
    lines = [
        ADDED,  # 11:33:33, fine
        ADDED.replace("11:33:33", "25:33:33"),  # vLLM, hour 25
        ADDED.replace("11:33:33", "11:61:33"),  # minute 61
        ADDED.replace("02-13", "13-13"),  # month 13
        "[2025-02-27 04:46:60 TP0] Decode batch. #running-req: 8, #queue-req: 0",  # SGLang
        "2025-02-27 24:00:00,123 INFO generic line",  # generic header
        "[rank1]:[E0213 11:99:30.000000001 ProcessGroupNCCL.cpp:1709] [Rank 1] Timeout at NCCL work: 7, last enqueued NCCL work: 7, last completed NCCL work: 6.",
    ]
    path = tmp_path / "clock.log"
    path.write_text("\n".join(lines) + "\n")
    table = read_logs([path], year=2026)
    assert len(table) == len(lines)  # kept
    assert table.sources[0].counts["impossible_dates"] == 6
    assert any("6 lines printed an impossible date or time" in w for w in table.warnings)
    assert table.column("ts_exact")[1:] == [False] * 6  # they carry the time before over


def test_gzip_files_and_directories(tmp_path):
    (tmp_path / "logs").mkdir()
    with gzip.open(tmp_path / "logs" / "server.log.gz", "wt") as handle:
        handle.write(ADDED + "\n")
    (tmp_path / "logs" / "trace.json").write_text("{}")  # not a log: skipped by name
    table = read_logs([tmp_path / "logs"], year=2026)
    assert table.column("event") == ["request_added"]
    assert table.column("file")[0].endswith("server.log.gz")


def test_missing_file_and_empty_directory_raise_trace_error(tmp_path):
    with pytest.raises(TraceError, match="no such log file"):
        read_logs([tmp_path / "absent.log"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="no log files found"):
        read_logs([tmp_path / "empty"])


def test_empty_file_is_an_empty_table(tmp_path):
    path = tmp_path / "empty.log"
    path.write_text("")
    table = read_logs([path])
    assert len(table) == 0 and table.sources[0].lines == 0


@pytest.mark.parametrize(
    ("request_id", "key"),
    [
        ("chatcmpl-a269fdcb7c6ce890-a8a65d16", "chatcmpl-a269fdcb7c6ce890"),  # V1 engine id
        ("chatcmpl-a269fdcb7c6ce890", "chatcmpl-a269fdcb7c6ce890"),  # V1 API id
        ("cmpl-c5044c83c77b430d9038ecd2b7d1089e-0", "cmpl-c5044c83c77b430d9038ecd2b7d1089e"),
        (
            "cmpl-e309b6d4f57c26a5b87e098c9ac8f851-0-00000000",
            "cmpl-e309b6d4f57c26a5b87e098c9ac8f851",
        ),
        ("1_chatcmpl-a269fdcb7c6ce890-a8a65d16", "chatcmpl-a269fdcb7c6ce890"),  # parallel sample
        ("550e8400-e29b-41d4-a716-446655440000", "550e8400-e29b-41d4-a716-446655440000"),
        ("165", "165"),  # V0 sequence group
        ("my-request-1", "my-request-1"),  # a client's id: no choice index to strip
        ("myreq-a8a65d16", "myreq-a8a65d16"),  # a suffix only shows beside the id without it
    ],
)
def test_request_key_joins_api_and_engine_ids(request_id, key):
    assert request_key(request_id) == key


def test_client_request_ids_join_their_engine_ids_only_when_both_were_read(tmp_path):
    """V1 appends `-<8 hex>` to whatever id the client sent (`X-Request-Id`)."""
    uuid = "550e8400-e29b-41d4-a716-446655440000"
    api = [
        f"(APIServer pid=1) INFO 02-13 11:33:33 [logger.py:49] Received request {rid}: params: x"
        for rid in ("myreq", uuid, "my-request-1", "my-request-2")
    ]
    engine = [
        f"(APIServer pid=1) INFO 02-13 11:33:33 [async_llm.py:382] Added request {rid}."
        for rid in ("myreq-a8a65d16", f"{uuid}-0b1c2d3e", "my-request-1", "my-request-2")
    ]
    (tmp_path / "api.log").write_text("\n".join(api) + "\n")
    (tmp_path / "engine.log").write_text("\n".join(engine) + "\n")
    keys = read_logs([tmp_path / "api.log", tmp_path / "engine.log"], year=2026)
    assert keys.column("request_key") == ["myreq", uuid, "my-request-1", "my-request-2"] * 2
    alone = read_logs([tmp_path / "engine.log"], year=2026).column("request_key")
    assert alone == ["myreq-a8a65d16", f"{uuid}-0b1c2d3e", "my-request-1", "my-request-2"]


def test_collector_console_copy_is_skipped_beside_rank_logs():
    logs_dir = Path(__file__).parents[1] / "align" / "data" / "lab_none_tp2" / "logs"
    table = read_logs([logs_dir])
    assert sorted(Path(s.path).name for s in table.sources) == ["rank0.log", "rank1.log"]
    assert any("skipped" in w and "launcher.log" in w for w in table.warnings)
    explicit = read_logs([logs_dir / "launcher.log"])
    assert len(explicit) == sum(s.records for s in table.sources)  # the same lines, once
