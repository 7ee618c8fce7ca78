"""Files whose captures do not overlap in time are not one run: reading them together warns,
naming the file that begins long after the others end."""

from __future__ import annotations

import pytest

from conftest import real_trace
from teller.cli import main
from teller.ingest import read_run

#: vLLM's piecewise example: its CUDA-graph capture and, two minutes later, a profiled run.
VLLM_FOLDER = "tracelens/vllm_prefilldecode_piecewise"


def test_two_captures_two_minutes_apart_are_named_as_not_one_run() -> None:
    run = read_run([real_trace(VLLM_FOLDER)])
    apart = [w for w in run.warnings if "does not overlap" in w]
    assert len(apart) == 1
    assert apart[0].startswith("graph_execution.json.gz: begins 2.02 min after graph_capture_")


def test_two_ranks_of_one_job_raise_no_such_warning() -> None:
    run = read_run(
        [
            real_trace("hta/sampled_rank0_of128.json.gz"),
            real_trace("hta/sampled_rank1_of128.json.gz"),
        ]
    )
    assert not [w for w in run.warnings if "does not overlap" in w]


def test_analyze_prints_the_reading_warnings_to_stderr(capsys: pytest.CaptureFixture) -> None:
    """The step finder's warning (which ranges could name the steps) reaches a terminal user,
    not only the JSON; stdout keeps the JSON alone."""
    status = main(
        ["-q", "analyze", str(real_trace("hta/critical_path_alexnet.json.gz")), "--format", "json"]
    )
    out, err = capsys.readouterr()
    assert status == 0 and out.lstrip().startswith("{")
    assert "warning: no step annotations found" in err
    assert "'[param|clear_cache]' ×2" in err
