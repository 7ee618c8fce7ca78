"""Analyse a captured case with the library's `Analysis`, and leave the reports beside it.

`report.json` (the versioned verdict with where the time went) and `report.txt` (what
`teller analyze CASE` prints) are written into the case, so a person who opens it later has the
answer without running anything.
"""

from __future__ import annotations

from pathlib import Path

from teller.analysis import Analysis
from teller.atomic import write_text_atomic
from teller.rca.verdict import Verdict
from teller.report import render

REPORT_JSON = "report.json"
REPORT_TEXT = "report.txt"


def analyze_case(case_dir: Path, method: str = "model", model_dir: Path | None = None) -> Verdict:
    analysis = Analysis(case_dir, method=method, model_dir=model_dir)
    verdict = analysis.diagnose()
    tree, breakdown = analysis.tree, analysis.breakdown()
    write_text_atomic(case_dir / REPORT_JSON, render(verdict, tree, "json", breakdown))
    write_text_atomic(case_dir / REPORT_TEXT, render(verdict, tree, "terminal", breakdown))
    return verdict
