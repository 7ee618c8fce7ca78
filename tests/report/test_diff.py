"""`teller diff`: the regressed kernel is named, a real slowdown fails CI, a run against itself does
not."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import teller
from conftest import real_trace
from teller import cli
from teller.analysis import Analysis
from teller.callchain.steps import StepTable
from teller.cli import main
from teller.labels import CaseLabels
from teller.report.diff import (
    _iterations,
    _kind_diff,
    compare,
    distinct_short_names,
    render_diff_terminal,
)

VLLM = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"


def test_kernel_regression_names_the_swapped_kernel(baseline_analysis, kernel_regression_case):
    diff = baseline_analysis.diff(Analysis(kernel_regression_case))
    guilty = CaseLabels.read(kernel_regression_case / "labels.json").guilty_operator
    assert diff.explaining[0] == guilty
    top = diff.operators.slice(0, 1).to_pylist()[0]
    assert top["layer"] == "kernel"
    assert top["a_calls_per_unit"] == 0 and top["b_calls_per_unit"] > 0  # it replaced another
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
    assert document["schema"] == "teller.diff/2"
    mixed = next(k for k in document["kinds"] if k["kind"] == "mixed")
    assert mixed["b_median_ns"] > 1.5 * mixed["a_median_ns"]
    assert mixed["change_pct"] == pytest.approx(
        100 * (mixed["b_median_ns"] - mixed["a_median_ns"]) / mixed["a_median_ns"]
    )
    shares = [row["share_of_step_change"] for row in document["operators"][:3]]
    assert all(share is not None and share > 0 for share in shares)
    deltas = [row["delta_self_ns_per_unit"] for row in document["operators"]]
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
    assert all(row["delta_self_ns_per_unit"] == 0 for row in document["operators"])
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


TRAINING_16 = "hta/queue_len_rank0_of16.json.gz"
NSYS_2GPU = "nsys_ai/fastvideo_h100_sp2_1s.sqlite"
RANK0_OF_128 = "hta/sampled_rank0_of128.json.gz"
RANK1_OF_128 = "hta/sampled_rank1_of128.json.gz"
ALEXNET = "hta/critical_path_alexnet.json.gz"


def test_training_trace_against_nsys_capture_is_not_comparable(capsys):
    """A wrong pairing exits 3 even with a gate, saying why; it never passes as unchanged."""
    a, b = str(real_trace(TRAINING_16)), str(real_trace(NSYS_2GPU))
    status = main(["-q", "diff", a, b, "--fail-on-regression", "1"])
    out, err = capsys.readouterr()
    assert status == 3
    assert "no step kind in common (A: profiler_step; B: step)" in err
    assert "world sizes differ (A: 16, B: 2)" in err
    assert "nan" not in out


def test_different_ranks_need_allow_mismatch(capsys):
    a, b = str(real_trace(RANK0_OF_128)), str(real_trace(RANK1_OF_128))
    assert main(["-q", "diff", a, b, "--fail-on-regression", "50"]) == 3
    assert "ranks differ (A: rank 0; B: rank 1)" in capsys.readouterr().err
    assert main(["-q", "diff", a, b, "--fail-on-regression", "50", "--allow-mismatch"]) == 0
    out = capsys.readouterr().out
    assert "note: ranks differ (A: rank 0; B: rank 1) (compared anyway" in out
    assert "A calls/step" in out and "B /call" in out


def test_negative_gate_is_rejected(capsys):
    path = str(real_trace(ALEXNET))
    with pytest.raises(SystemExit) as exit_info:
        main(["-q", "diff", path, path, "--fail-on-regression", "-1"])
    assert exit_info.value.code == 2
    assert "must be 0 or more" in capsys.readouterr().err


def test_iterations_found_in_the_trace_are_the_unit():
    """A trace without step annotations is compared per iteration found, and says so."""
    path = real_trace(ALEXNET)
    diff = teller.diff(path, path)
    assert diff.unit == "iteration" and diff.not_comparable == []
    assert any("period of top-level sequence" in note for note in diff.notes)
    assert diff.a_shape.units == diff.b_shape.units == 2
    calls = diff.operators.column("a_calls_per_unit").to_pylist()
    assert all(c > 0 for c in calls)
    assert "per iteration" in diff.summary or "no operator takes more" in diff.summary


def test_run_without_steps_is_compared_by_wall_time(baseline_analysis):
    """No steps at all: operators per second of wall time, a warning, and no gate can pass."""
    tree = baseline_analysis.tree
    stepless = replace(tree, steps=StepTable.empty(), step=np.full(len(tree), -1))
    diff = compare(stepless, stepless, ["a"], ["b"])
    assert diff.unit == "second of wall time"
    assert any("per second of wall time" in note for note in diff.notes)
    assert diff.not_comparable == ["a run has no steps: step times cannot be compared"]
    text = render_diff_terminal(diff)
    assert "nan" not in text and "Δ self/s" in text
    assert diff.to_json()["a_step_ns"] is None


def test_markdown_for_a_pull_request(baseline_case, contention_case, capsys):
    argv = ["-q", "diff", str(baseline_case), str(contention_case), "--format", "markdown"]
    assert main([*argv, "--fail-on-regression", "5"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("### teller diff: **regression** beyond 5%: mixed +")
    assert "| step kind | steps A | steps B |" in out
    assert "| Δ self/step | calls/step A | calls/step B | A /call | B /call | operator |" in out
    table_rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert all(line.count("|") - line.count("\\|") in (9, 7) for line in table_rows)


def test_distinct_names_stay_distinct():
    names = [
        "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float>>(int)",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)",
    ]
    shown = distinct_short_names(names, 40)
    assert len(set(shown)) == 3
    assert shown[2] == "ncclKernel_AllReduce_RING_LL_Sum_float(…"
    assert "AddFunctor" in shown[0] and "MulFunctor" in shown[1]


def test_python_api_matches_the_cli(capsys):
    path = real_trace(VLLM)
    diff = teller.diff(path, path)
    assert isinstance(diff, teller.RunDiff)
    assert diff.regressions(0.0) == [] and diff.not_comparable == []
    assert diff.unit == "step"


def test_a_crash_is_not_a_regression(monkeypatch, capsys):
    """An exception no error type covers exits 70, never 1 (which means "regressed")."""

    def broken(argv=None):
        raise RuntimeError("bug")

    monkeypatch.setattr(cli, "main", broken)
    with pytest.raises(SystemExit) as exit_info:
        cli.run()
    assert exit_info.value.code == 70
    assert "internal error" in capsys.readouterr().err
