"""Reports are written as they are rendered (`render_pieces`, `write_pieces_atomic`): the file
and the standard output carry exactly what `render` gives, and a rendering that fails part-way
leaves no file behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import real_trace
from teller.analysis import Analysis
from teller.atomic import write_pieces_atomic
from teller.cli import main
from teller.report import render, render_pieces

VLLM = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"


@pytest.mark.parametrize("fmt", ["json", "terminal", "html"])
def test_pieces_join_to_the_rendered_text(contention_analysis: Analysis, fmt: str) -> None:
    run = contention_analysis
    verdict, tree, breakdown = run.diagnose(), run.tree, run.breakdown()
    whole = render(verdict, tree, fmt, breakdown, run.facts)
    pieces = list(render_pieces(verdict, tree, fmt, breakdown, run.facts))
    assert "".join(pieces) == whole
    if fmt == "json":  # encoded piece by piece, not one string handed over at the end
        assert len(pieces) > 100


def test_file_and_stdout_carry_the_same_json_of_a_real_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = real_trace(VLLM)
    out = tmp_path / "verdict.json"
    assert main(["-q", "analyze", str(trace), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["-q", "analyze", str(trace), "--format", "json"]) == 0
    printed = capsys.readouterr().out
    written = out.read_text()
    assert printed == written + "\n"  # stdout ends in a newline, the file as JSON ends
    assert json.loads(written)["findings"] is not None


def test_a_rendering_that_fails_part_way_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text("the previous report\n")

    def failing() -> Iterator[str]:
        yield '{"findings": ['
        raise RuntimeError("encoder failed")

    with pytest.raises(RuntimeError, match="encoder failed"):
        write_pieces_atomic(path, failing())
    assert path.read_text() == "the previous report\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary file left

    write_pieces_atomic(path, iter(["{", '"a": 1', "}"]))
    assert json.loads(path.read_text()) == {"a": 1}
