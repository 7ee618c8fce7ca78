"""`teller diff --format html`: one self-contained page with the gate's verdict, the step kinds and
the operators that changed, charted; every name from a trace shown as text, never as markup; the
exit codes those of the other formats."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from chromium_page import Dom
from conftest import real_trace
from teller.callchain.steps import StepTable
from teller.cli import main
from teller.report.diff import compare
from teller.report.diff_html import render_diff_html

HOSTILE = "<script>alert(1)</script>\"quoted\" 'single'"
RANK0_OF_128 = "hta/sampled_rank0_of128.json.gz"
RANK1_OF_128 = "hta/sampled_rank1_of128.json.gz"


def test_html_diff_of_a_regression(baseline_case, contention_case, capsys):
    argv = ["-q", "diff", str(baseline_case), str(contention_case), "--format", "html"]
    assert main([*argv, "--fail-on-regression", "5"]) == 1  # the gate's code, whatever the format
    page = capsys.readouterr().out
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and not re.search(r"(src|href)=['\"]?https?:", page)
    dom = Dom(page)
    (verdict,) = dom.find(id="verdict")
    assert verdict[1]["class"] == "verdict"  # red: B regressed
    assert any(
        e[0] == "strong" and e[2].startswith("regression beyond 5%: mixed +") for e in dom.elements
    )
    assert dom.find(id="kinds") and dom.find(id="operators")
    headers = [e[2] for e in dom.elements if e[0] == "th"]
    assert {"A calls per step", "B per call", "operator"} <= set(headers)
    if _charts_drawn():
        assert dom.find(id="chart-operators") and dom.find(id="chart-kinds")
        texts = {e[2].strip() for e in dom.elements if e[0] == "text"}
        assert "self time per step, B minus A (ms)" in texts
        assert "median step time (ms)" in texts
    assert main(argv) == 0  # no gate, no regression verdict
    assert "no regression" in capsys.readouterr().out


def test_html_diff_escapes_every_name(baseline_analysis):
    """An operator called `<script>…` and a hostile input path are shown as text."""
    tree = baseline_analysis.tree
    renamed = next(k for k, name in enumerate(tree.names) if name.startswith("cudaLaunchKernel"))
    hostile = replace(tree, names=[*tree.names[:renamed], HOSTILE, *tree.names[renamed + 1 :]])
    diff = compare(tree, hostile, ["a<b>.json"], [f"b{HOSTILE}.json"])
    page = render_diff_html(diff, top=200)
    assert "<script>" not in page
    dom = Dom(page)
    assert [e for e in dom.elements if e[0] == "script"] == []
    codes = [e for e in dom.elements if e[0] == "code"]
    assert any(e[2] == HOSTILE and e[1]["title"] == HOSTILE for e in codes)
    assert any(f"b{HOSTILE}.json" in e[2] for e in dom.elements if e[0] in ("div", "br"))
    if _charts_drawn():  # Vega writes the name into the SVG as text too
        labels = [e[1].get("aria-label", "") for e in dom.elements if e[0] == "path"]
        assert any(HOSTILE in label for label in labels)


def test_html_diff_not_comparable_exits_3(capsys):
    a, b = str(real_trace(RANK0_OF_128)), str(real_trace(RANK1_OF_128))
    assert main(["-q", "diff", a, b, "--format", "html", "--fail-on-regression", "50"]) == 3
    out, err = capsys.readouterr()
    assert "ranks differ (A: rank 0; B: rank 1)" in err
    dom = Dom(out)
    assert any(e[0] == "strong" and e[2].startswith("not comparable: ") for e in dom.elements)
    assert "ranks differ (A: rank 0; B: rank 1)" in out


def _charts_drawn() -> bool:
    try:
        import vl_convert  # noqa: F401
    except ImportError:
        return False
    return True


def test_html_diff_of_runs_without_steps(baseline_analysis):
    """No steps on either side: the page says so and why no verdict holds, with no NaN in it."""
    tree = baseline_analysis.tree
    stepless = replace(tree, steps=StepTable.empty(), step=np.full(len(tree), -1))
    page = render_diff_html(compare(stepless, stepless, ["a"], ["b"]), gate_pct=5.0)
    dom = Dom(page)
    assert any(e[0] == "strong" and e[2].startswith("not comparable: ") for e in dom.elements)
    assert "Neither run has steps." in page and "per second of wall time" in page
    assert re.search(r"\bnan\b", page, re.IGNORECASE) is None
