"""Layer comparisons inside one step, on real one-step captures with one kernel made slower."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from conftest import planted_analysis, real_trace
from teller.analysis import Analysis
from teller.localize import NumericLocalizer
from teller.localize.layers import layer_outliers

QWEN = "tracelens/hf_qwen1.5-0.5b_h100.json.gz"
VLLM = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"
SGLANG = "tracelens/sglang_Qwen3-8B_prefilldecode.json.gz"
#: Its last clip's `np.array` in the feature extractor's `as_tensor` takes 13.5 ms, where the
#: same name in every image resize before it takes microseconds: another call, not a slower one.
TIMESFORMER = "tracelens/more/h100_timesformer_k400.json.gz"
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}


def slowed_copy(source: Path, pattern: str, share: float, out: Path) -> str:
    """A copy of a one-step Kineto trace where one mid-step kernel matching `pattern` takes
    `share` of the step longer and all later GPU work starts that much later; its name."""
    document = json.loads(gzip.decompress(source.read_bytes()))
    events = [e for e in document["traceEvents"] if e.get("ph") == "X"]
    step = max(
        (e for e in events if re.match(r"ProfilerStep#|execute_|step\[", e.get("name", ""))),
        key=lambda e: e["dur"],
    )
    kernels = sorted(
        (e for e in events if e.get("cat") == "kernel" and re.search(pattern, e["name"])),
        key=lambda e: e["ts"],
    )
    target = kernels[len(kernels) // 2]
    added = share * step["dur"]
    for event in events:
        if (
            event is not target
            and event.get("cat") in GPU_CATEGORIES
            and event["ts"] > target["ts"]
        ):
            event["ts"] += added
    target["dur"] += added
    out.write_bytes(gzip.compress(json.dumps(document).encode()))
    return target["name"]


def top_suspect(path: Path) -> tuple[list[int], str | None]:
    analysis = Analysis(path, progress=False)
    found = NumericLocalizer().score(analysis.tree, analysis.facts)
    flagged = [s.iteration for s in found.anomalous_steps()]
    first = found.candidates.get(flagged[0], []) if flagged else []
    return flagged, first[0].operator if first else None


@pytest.mark.parametrize(
    ("relative", "pattern", "share"),
    [
        (QWEN, "gemm", 0.02),
        (QWEN, "flash", 0.2),
        (VLLM, "Cijk", 0.05),
        (VLLM, "Rmsnorm", 0.02),
        (SGLANG, "Cijk", 0.05),
    ],
)
def test_a_slowed_kernel_in_one_step_is_found_among_its_layers(
    relative: str, pattern: str, share: float, tmp_path: Path
) -> None:
    planted = slowed_copy(real_trace(relative), pattern, share, tmp_path / "slowed.json.gz")
    flagged, operator = top_suspect(tmp_path / "slowed.json.gz")
    assert flagged == [0]
    assert operator is not None and operator in planted  # display names drop a `void ` prefix


@pytest.mark.parametrize("relative", [QWEN, VLLM, SGLANG, TIMESFORMER])
def test_an_unmodified_capture_has_no_layer_outlier(relative: str) -> None:
    flagged, _ = top_suspect(real_trace(relative))
    assert flagged == []


def test_the_candidate_names_its_layer(tmp_path: Path) -> None:
    slowed_copy(real_trace(QWEN), "flash", 0.1, tmp_path / "slowed.json.gz")
    analysis = Analysis(tmp_path / "slowed.json.gz", progress=False)
    found = NumericLocalizer().score(analysis.tree, analysis.facts)
    best = found.candidates[0][0]
    assert re.search(r"layer \d+ of 34", best.reference)  # the step runs 34 attention kernels
    assert best.observed_ns > 5 * best.normal_ns


def test_the_first_layer_is_compared_too(tmp_path: Path) -> None:
    """The suite slows the first layer's attention kernel: layers begin at the first name that
    runs once per layer, so the first layer is one of them, not a prologue left out."""
    analysis, truth = planted_analysis(QWEN, "kernel:attention:0.25", tmp_path)
    first = analysis.verdict.findings[0]
    assert first.operator == truth.kernel, first.explanation
    assert "in layer 1 of" in first.explanation


#: ResNet training on a V100, five steps on one rank: its stages' convolutions differ, so a
#: layer unlike its siblings takes the same time at the same place in every step.
RESNET = "hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz"


def test_a_layer_unlike_its_siblings_in_every_step_is_the_networks_shape() -> None:
    analysis = Analysis(real_trace(RESNET), progress=False)
    assert layer_outliers(analysis.facts) == {}
    flagged, _ = top_suspect(real_trace(RESNET))
    assert flagged == []


def test_a_kernel_slowed_in_one_of_several_steps_still_stands_out(tmp_path: Path) -> None:
    analysis, truth = planted_analysis(RESNET, "kernel:gemm:0.05", tmp_path)
    first = analysis.verdict.findings[0]
    assert first.step_name == truth.step_name
    accepted = [truth.kernel, truth.launch_op, *truth.accept_operators]
    assert any(first.operator and first.operator in a for a in accepted if a), first.explanation
