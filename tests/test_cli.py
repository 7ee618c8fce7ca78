"""The command line, called in-process as a user would type it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import real_trace
from teller.cli import main
from teller.ingest.schema import read_parquet

VLLM = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"


def test_info_reports_ranks_steps_layers_and_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(real_trace(VLLM))]) == 0
    out = capsys.readouterr().out
    assert "ranks [0]" in out
    rows = [line.split() for line in out.splitlines()]
    header = rows.index(["rank", "steps", "kinds", "median", "longest", "found", "by"])
    assert rows[header + 1][:3] == ["0", "1", "mixed"]  # rank 0: one mixed step
    assert "kernel 413" in out


def test_info_on_a_directory_of_rank_files(capsys: pytest.CaptureFixture[str]) -> None:
    directory = real_trace(VLLM).parent
    assert main(["-q", "info", str(directory)]) == 0
    out = capsys.readouterr().out
    assert out.count("file  ") == 2  # the two traces; execution_details.json is not one


def test_tree_prints_the_step_with_kernels_under_ops(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tree", str(real_trace(VLLM)), "--step", "0", "--depth", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("execute_8192_context_9(")
    assert "⇒ GPU" in out and "[cpu_op]" in out
    assert "[python]" not in out  # Python frames are see-through by default


def test_tree_unknown_step_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tree", str(real_trace(VLLM)), "--step", "7"]) == 2
    err = capsys.readouterr().err
    assert "has no step 7 (1 steps found)" in err


def test_ingest_writes_parquet_per_rank_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["ingest", str(real_trace("hta/sampled_rank0_of128.json.gz")), "-o", str(out)]) == 0
    written = sorted(out.glob("*.parquet"))
    assert [p.name for p in written] == ["rank0.sampled_rank0_of128.parquet"]
    assert read_parquet(written[0]).sources[0].rank == 0


def test_bad_input_exits_2_naming_the_file_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "rank1.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1')
    out = tmp_path / "out"
    status = main(
        ["ingest", str(real_trace("hta/sampled_rank0_of128.json.gz")), str(bad), "-o", str(out)]
    )
    assert status == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "byte" in err and "truncated" in err
    assert not out.exists() or not any(out.iterdir())


#: An operator name that would turn the terminal red and rewrite the line it is on.
HOSTILE = "aten::mm\x1b[31m\rEVIL"


def _trace_with_a_hostile_name(tmp_path: Path) -> Path:
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#0",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 100,
        },
        {"ph": "X", "cat": "cpu_op", "name": HOSTILE, "pid": 1, "tid": 1, "ts": 10, "dur": 50},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::add\x07",
            "pid": 1,
            "tid": 1,
            "ts": 70,
            "dur": 10,
        },
    ]
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_tree_and_info_escape_control_characters_from_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _trace_with_a_hostile_name(tmp_path)
    assert main(["-q", "tree", str(path), "--step", "0"]) == 0
    tree = capsys.readouterr().out
    assert main(["-q", "tree", str(path)]) == 0
    tree += capsys.readouterr().out
    assert main(["-q", "info", str(path)]) == 0
    info = capsys.readouterr().out
    for out in (tree, info):
        assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert "aten::mm\\x1b[31m\\x0dEVIL" in tree
    assert "aten::add\\x07" in tree


def test_otlp_spans_without_logs_are_a_one_line_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace_with_a_hostile_name(tmp_path)
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps({"resourceSpans": []}))
    report = tmp_path / "report.json"
    assert main(["-q", "analyze", str(trace), "--otlp", str(spans), "-o", str(report)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("teller: error: ")
    assert str(spans) in err and "--logs" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.pt.trace.json", "spans.json"]
