"""`teller diff`: the regressed kernel is named, a real slowdown fails CI, a run against itself does
not."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import real_trace
from teller.analysis import Analysis
from teller.cli import main
from teller.labels import CaseLabels
from teller.report.diff import _iterations, _kind_diff, render_diff_terminal

VLLM = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"


def test_kernel_regression_names_the_swapped_kernel(baseline_analysis, kernel_regression_case):
    diff = baseline_analysis.diff(Analysis(kernel_regression_case))
    guilty = CaseLabels.read(kernel_regression_case / "labels.json").guilty_operator
    assert diff.explaining[0] == guilty
    top = diff.operators.slice(0, 1).to_pylist()[0]
    assert top["layer"] == "kernel"
    assert top["a_calls_per_step"] == 0 and top["b_calls_per_step"] > 0  # it replaced another
    assert top["b_self_ns_per_call"] > 0
    assert "cutlass::Kernel2" in diff.summary and "new in B" in diff.summary
    # The swapped kernel runs beside the host: step times are unchanged, so no CI failure.
    assert diff.regressions(5.0) == []
    assert {k.kind for k in diff.kinds} == {"prefill", "mixed", "decode"}


def test_contention_regresses_and_fails_ci(baseline_case, contention_case, capsys):
    argv = ["-q", "diff", str(baseline_case), str(contention_case), "--format", "json"]
    status = main([*argv, "--fail-on-regression", "5"])
    out, err = capsys.readouterr()
    assert status == 1
    assert "mixed steps regressed" in err
    document = json.loads(out)
    assert document["schema"] == "teller.diff/1"
    mixed = next(k for k in document["kinds"] if k["kind"] == "mixed")
    assert mixed["b_median_ns"] > 1.5 * mixed["a_median_ns"]
    assert mixed["change_pct"] == pytest.approx(
        100 * (mixed["b_median_ns"] - mixed["a_median_ns"]) / mixed["a_median_ns"]
    )
    shares = [row["share_of_step_change"] for row in document["operators"][:3]]
    assert all(share is not None and share > 0 for share in shares)
    deltas = [row["delta_self_ns_per_step"] for row in document["operators"]]
    assert deltas == sorted(deltas, reverse=True)


def test_threshold_and_direction(baseline_analysis, contention_analysis):
    """CI fails only beyond the threshold, and only for B slower than A."""
    diff = baseline_analysis.diff(contention_analysis)
    mixed = next(k for k in diff.kinds if k.kind == "mixed")
    assert mixed in diff.regressions(mixed.change_pct - 1)
    assert mixed not in diff.regressions(mixed.change_pct + 1)
    assert contention_analysis.diff(baseline_analysis).regressions(5.0) == []
    assert "mixed: median" in render_diff_terminal(diff)


def test_real_vllm_trace_against_itself(capsys):
    path = real_trace(VLLM)
    status = main(
        ["-q", "diff", str(path), str(path), "--fail-on-regression", "0", "--format", "json"]
    )
    document = json.loads(capsys.readouterr().out)
    assert status == 0
    assert [k["kind"] for k in document["kinds"]] == ["mixed"]
    assert document["kinds"][0]["change_pct"] == 0.0
    assert document["explaining"] == []
    assert all(row["delta_self_ns_per_step"] == 0 for row in document["operators"])
    assert document["operators"], "a real trace has operators"


def test_tokens_normalise_when_batches_differ(baseline_analysis):
    """Steps that batch twice the tokens in twice the time are no regression per token."""
    same = _iterations(baseline_analysis.tree)
    doubled = same | {"dur_ns": same["dur_ns"] * 2, "tokens": same["tokens"] * 2}
    by_step = _kind_diff("mixed", same, same)
    assert (by_step.metric, by_step.change_pct) == ("median step time", 0.0)
    per_token = _kind_diff("mixed", same, doubled)
    assert per_token.metric == "median time per token"
    assert per_token.change_pct == pytest.approx(0.0)
    assert per_token.b_median_ns == 2 * per_token.a_median_ns
    assert not per_token.regressed(5.0)
    slower = same | {"dur_ns": same["dur_ns"] * 2}  # same batches, twice the time
    assert _kind_diff("mixed", same, slower).change_pct == pytest.approx(100.0, abs=0.5)


def test_truncated_trace_is_a_one_line_error(tmp_path: Path, capsys):
    """Bad input names the file and what is wrong, exits 2, and prints no half diff. (A trace cut
    after some complete events is read up to them instead: this one is cut before the first.)"""
    whole = gzip.decompress(real_trace(VLLM).read_bytes())
    broken = tmp_path / "rank0.json.gz"
    broken.write_bytes(gzip.compress(whole[: whole.index(b'"traceEvents"') + 20]))
    status = main(["-q", "diff", str(real_trace(VLLM)), str(broken)])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert str(broken) in err and "truncated" in err


def test_missing_run_is_a_one_line_error(tmp_path: Path, capsys):
    status = main(["-q", "diff", str(tmp_path), str(tmp_path)])
    assert status == 2
    assert "no trace files found" in capsys.readouterr().err
