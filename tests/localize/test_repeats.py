"""The comparison across steps, on real several-step captures with one kernel made slower by the
planting suite's physically consistent replay (`teller.eval.planting`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import planted_analysis, real_trace
from teller.analysis import Analysis
from teller.localize.repeats import repeat_outliers

RESNET_V100 = "hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz"
RESNET_MI300 = "tracelens/more/mi300_resnet_act_checkpoint.json.gz"
SAMPLED = "hta/sampled_rank0_of128.json.gz"


@pytest.mark.parametrize(
    ("relative", "variant"),
    [
        (RESNET_V100, "kernel:gemm:0.02"),  # made nothing later: the GPU caught up
        (RESNET_MI300, "kernel:norm:0.05"),
        (SAMPLED, "kernel:norm:0.1"),  # two steps: one reference only
    ],
)
def test_a_slowed_kernel_is_the_headline_of_its_step(
    tmp_path: Path, relative: str, variant: str
) -> None:
    analysis, truth = planted_analysis(relative, variant, tmp_path)
    first = analysis.verdict.findings[0]
    assert first.step_name == truth.step_name
    assert first.operator in truth.accept_operators, first.explanation
    assert "in the run's other" in first.evidence[0].reference


@pytest.mark.parametrize(
    "relative", [RESNET_V100, RESNET_MI300, SAMPLED, "hta/queue_len_rank0_of16.json.gz"]
)
def test_unmodified_captures_have_no_repeat_outlier(relative: str) -> None:
    analysis = Analysis(real_trace(relative), method="localizer", progress=False)
    assert repeat_outliers(analysis.facts) == {}


@pytest.mark.parametrize(
    ("relative", "variant"),
    [
        ("hta/queue_len_rank0_of16.json.gz", "host_gap:host_gap:0.05"),
        (RESNET_V100, "host_gap:host_gap:0.25"),
    ],
)
def test_a_stalled_thread_shows_in_its_frame_s_own_time(
    tmp_path: Path, relative: str, variant: str
) -> None:
    """The thread stops between two operators inside a user annotation: the annotation's own
    time, against the same frame in the run's other steps, names it."""
    analysis, truth = planted_analysis(relative, variant, tmp_path)
    found = [f for f in analysis.verdict.findings if f.step_name == truth.step_name]
    assert found and found[0].operator in truth.accept_operators, [f.operator for f in found]
    assert "between the operators it runs" in found[0].explanation
    assert found[0].fault_type == "host_stall"


def test_a_split_k_gemm_is_compared_by_its_kernel_name(tmp_path: Path) -> None:
    """In the planted step the `aten::mm` call launches a split-K reduction after its GEMM and
    in the other step it does not: the GEMM is still compared with the other step's GEMM."""
    analysis, truth = planted_analysis(SAMPLED, "kernel:gemm:0.05", tmp_path)
    first = analysis.verdict.findings[0]
    assert first.step_name == truth.step_name
    assert first.operator == truth.kernel, first.explanation


def test_launches_blocked_behind_a_slowed_kernel_do_not_take_its_place(tmp_path: Path) -> None:
    """The slowed GEMM runs on into the next step, whose launches then block on a full queue
    for longer than the GEMM's own excess: the GEMM, not `cudaLaunchKernel`, is named there."""
    analysis, truth = planted_analysis(RESNET_V100, "kernel:gemm:0.5", tmp_path)
    named = {f.step_name: f.operator for f in analysis.verdict.findings}
    assert named[truth.step_name] == truth.kernel
    after = f"ProfilerStep#{int(truth.step_name.split('#')[1]) + 1}"
    assert named[after] == truth.kernel, named


def test_a_host_gap_on_the_main_thread_does_not_reorder_the_autograd_threads_calls(
    tmp_path: Path,
) -> None:
    """A stall planted in one ResNet step delays the main thread's calls there, not the autograd
    thread's: `aten::add_` runs on both, so its k-th call by time is another tensor's add in that
    step. Matched under its parent, each add keeps its place, and no other step is flagged."""
    analysis, truth = planted_analysis(RESNET_V100, "host_gap:host_gap:0.25", tmp_path)
    assert [f.step_name for f in analysis.verdict.findings] == [truth.step_name]
