"""Every real trace gets a verdict or a one-line reason from `teller analyze`, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import traces_root
from teller.cli import main

SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep")


def _real_traces() -> list:
    root = traces_root()
    found = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))
    if not found:  # one test that says where the traces come from
        reason = f"real traces not found under {root}: run `make traces`"
        return [pytest.param(root, marks=pytest.mark.skip(reason=reason), id="no-traces")]
    return found


@pytest.mark.slow
@pytest.mark.parametrize(
    "trace",
    _real_traces(),
    ids=lambda p: str(p.relative_to(traces_root())) if isinstance(p, Path) else str(p),
)
def test_analyze_answers_every_real_trace(trace: Path, capsys: pytest.CaptureFixture) -> None:
    status = main(["-q", "analyze", str(trace), "--format", "json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if status == 2:  # a file teller cannot read: one line naming it
        assert err.strip().count("\n") == 0 and str(trace.name) in err
    else:
        assert status == 0 and out.lstrip().startswith("{")
