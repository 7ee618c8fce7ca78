"""A second method's analysis of one run reuses the first's read and gives its own verdict.

`bench/planted.py` scores both methods on each planted file and reads it once; the model's
analysis once crashed there because the shared read left out what the files said about
themselves. On the repository's recorded lab run, the model's verdict after `share_read` is
the one a fresh analysis gives.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from teller.analysis import Analysis
from teller.report import render

LAB_CASE = Path(__file__).parent / "align" / "data" / "lab_none_tp2"


def _json(analysis: Analysis) -> str:
    return render(analysis.diagnose(), analysis.tree, "json")


def test_a_shared_read_gives_the_verdict_a_fresh_read_gives() -> None:
    first = Analysis(LAB_CASE, method="localizer")
    first.diagnose()
    second = Analysis(LAB_CASE, method="model")
    second.share_read(first)
    assert second.tree is first.tree
    assert second.sources == first.sources
    assert _json(second) == _json(Analysis(LAB_CASE, method="model"))


def test_a_read_of_other_files_is_not_shared(tmp_path: Path) -> None:
    first = Analysis(LAB_CASE, method="localizer")
    first.tree  # noqa: B018
    other = tmp_path / "traces"
    other.mkdir()
    source = next((LAB_CASE / "traces").iterdir())
    (other / source.name).write_bytes(source.read_bytes())
    with pytest.raises(ValueError, match="other files"):
        Analysis(other, method="model").share_read(first)
