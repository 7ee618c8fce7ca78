"""Steps on real traces, by each rule in turn: engine annotations, ProfilerStep#N, a repeated range
that is clearly the iteration, and the period of the top-level operation sequence.

Where a real trace has no example of a rule, a real trace is changed the least way that makes one:
its ProfilerStep#N ranges renamed (a user's own `record_function` around each iteration) or
removed (the same loop with nothing naming its steps), so the true steps are known.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from conftest import real_trace
from teller.callchain.steps import (
    FOUND_BY_CAPTURE,
    FOUND_BY_ENGINE,
    FOUND_BY_PERIOD,
    FOUND_BY_PROFILER_STEP,
    FOUND_BY_REGEX,
    found_by_range,
)
from teller.callchain.tree import CallTree, build_tree
from teller.cli import main
from teller.ingest import read_trace
from teller.ingest.schema import EventTable

VLLM = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"
SGLANG = "tracelens/sglang_Qwen3-8B_prefilldecode.json.gz"
RESNET = "hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz"
HTA_ANNOTATIONS = "hta/gpu_user_annotation_steps.json.gz"
ALEXNET = "hta/critical_path_alexnet.json.gz"
MI300 = "tracelens/more/mi300_resnet_act_checkpoint.json.gz"
PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")


def names_of(events: EventTable) -> tuple[pa.DictionaryArray, list[str]]:
    column = events.table.column("name").combine_chunks()
    return column, column.dictionary.to_pylist()


def without_profiler_steps(events: EventTable) -> EventTable:
    """The same trace with every ProfilerStep#N range (host and GPU copy) removed."""
    column, names = names_of(events)
    step_name = np.array([bool(PROFILER_STEP.match(n)) for n in names])
    keep = ~step_name[column.indices.to_numpy()]
    return EventTable(table=events.table.filter(pa.array(keep)), sources=events.sources)


def profiler_steps_renamed(events: EventTable, name: str) -> EventTable:
    """The same trace with every ProfilerStep#N range renamed to one user range name."""
    column, names = names_of(events)
    renamed = pa.array([name if PROFILER_STEP.match(n) else n for n in names])
    encoded = renamed.take(column.indices).dictionary_encode()
    table = events.table.set_column(events.table.schema.get_field_index("name"), "name", encoded)
    return EventTable(table=table, sources=events.sources)


def names_in_step(tree: CallTree, row: int) -> Counter[str]:
    """Host nodes only: Kineto records each annotation again on the GPU."""
    held = np.flatnonzero((tree.step == row) & (tree.stream < 0))
    return Counter(tree.node_name(i) for i in held.tolist())


# -- rule 1: engine annotations and ProfilerStep#N, as before ---------------------------------------


@pytest.mark.parametrize(
    ("relative", "count", "found_by"),
    [
        (VLLM, 1, FOUND_BY_ENGINE),
        (SGLANG, 1, FOUND_BY_ENGINE),
        (RESNET, 5, FOUND_BY_PROFILER_STEP),
        ("hta/queue_len_rank0_of16.json.gz", 5, FOUND_BY_PROFILER_STEP),
        ("tracelens/hf_qwen1.5-0.5b_h100.json.gz", 1, FOUND_BY_PROFILER_STEP),
    ],
)
def test_annotated_steps_say_they_were_annotated(relative: str, count: int, found_by: str) -> None:
    tree = build_tree(read_trace(real_trace(relative)))
    assert len(tree.steps) == count
    assert tree.steps.found_by == [found_by] * count
    assert not any("no step annotations" in w for w in tree.warnings)


def test_a_step_regex_names_its_steps() -> None:
    tree = build_tree(read_trace(real_trace(RESNET)), step_regex=r"^## forward ##$")
    assert len(tree.steps) == 5
    assert tree.steps.found_by == [FOUND_BY_REGEX] * 5


def test_a_step_regex_that_matches_nothing_says_so_and_offers_the_ranges() -> None:
    tree = build_tree(read_trace(real_trace(HTA_ANNOTATIONS)), step_regex="no such range")
    assert len(tree.steps) == 0
    (note,) = [w for w in tree.warnings if "step regex" in w]
    assert "'no such range' matched no annotation" in note
    assert "'Optimizer.step#SGD.step' ×5" in note


# -- rule 2: a repeated range that is clearly the iteration --------------------------------------


def test_a_user_range_around_each_iteration_becomes_the_steps() -> None:
    events = read_trace(real_trace(RESNET))
    truth = build_tree(events)
    tree = build_tree(profiler_steps_renamed(events, "## train step ##"))

    assert len(tree.steps) == 5
    assert tree.steps.found_by == [found_by_range("## train step ##")] * 5
    assert tree.steps.start_ns.tolist() == truth.steps.start_ns.tolist()
    assert tree.steps.dur_ns.tolist() == truth.steps.dur_ns.tolist()
    # the host's nodes in the same steps as when the profiler named them; GPU work in the step of
    # the host call that launched it
    host = tree.stream < 0
    assert np.array_equal(tree.step[host], truth.step[host])
    launched = (tree.stream >= 0) & (tree.parent >= 0)
    assert np.array_equal(tree.step[launched], tree.step[tree.parent[launched]])
    assert any("steps are the repeated range '## train step ##' (×5" in w for w in tree.warnings)


def gpu_annotated_loop(path: Path, iterations: int = 3) -> Path:
    """A loop whose only range is a GPU one (`gpu_user_annotation` with no host copy, as some
    tools write): per iteration two GEMMs and the result copied back, the GPU behind the host."""
    events: list[dict] = []
    correlation = 0
    for k in range(iterations):
        host, gpu = 1000.0 + k * 1000.0, 1300.0 + k * 1000.0
        gpu_start = gpu
        for name, dur, cat in (("gemm", 300.0, "kernel"), ("gemm", 300.0, "kernel")):
            correlation += 1
            events.append(runtime("cudaLaunchKernel", host, correlation))
            events.append(gpu_event(name, cat, gpu, dur, correlation))
            host, gpu = host + 20.0, gpu + dur + 5.0
        correlation += 1
        events.append(runtime("cudaMemcpyAsync", host, correlation))
        events.append(
            gpu_event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", gpu, 10.0, correlation)
        )
        events.append(
            gpu_event("iteration", "gpu_user_annotation", gpu_start, gpu + 10 - gpu_start, -1)
        )
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def runtime(name: str, ts: float, correlation: int) -> dict:
    args = {"correlation": correlation}
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": 8.0,
        "args": args,
    }


def gpu_event(name: str, cat: str, ts: float, dur: float, correlation: int) -> dict:
    args = {"device": 0, "stream": 7, "correlation": correlation}
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": 7,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def test_a_gpu_annotation_without_a_host_range_names_the_steps(tmp_path: Path) -> None:
    tree = build_tree(read_trace(gpu_annotated_loop(tmp_path / "gpu_ranges.json")))
    steps = tree.steps
    assert len(steps) == 3
    assert steps.found_by == [found_by_range("iteration")] * 3
    assert (tree.stream[steps.node] >= 0).all()
    gpu_work = np.flatnonzero((tree.stream >= 0) & (tree.name != tree.name[steps.node[0]]))
    # each GEMM and copy in the step whose GPU range it ran in, two GEMMs and a copy each, and
    # the host call that launched each in the same step (the host ran 300 µs ahead)
    assert np.bincount(tree.step[gpu_work], minlength=3).tolist() == [3, 3, 3]
    assert np.array_equal(tree.step[tree.parent[gpu_work]], tree.step[gpu_work])


def test_ranges_around_parts_of_the_iteration_are_offered_not_taken() -> None:
    """HTA's trace marks only the optimizer's calls: each is a small part of the iteration."""
    tree = build_tree(read_trace(real_trace(HTA_ANNOTATIONS)))
    assert not any(f.startswith("repeated range") for f in tree.steps.found_by)
    (offer,) = [w for w in tree.warnings if w.startswith("no step annotations found")]
    assert "'Optimizer.zero_grad#SGD.zero_grad' ×5" in offer
    assert "'Optimizer.step#SGD.step' ×5" in offer
    assert "pass --step-regex" in offer


# -- rule 3: the period of the top-level operation sequence --------------------------------------


def test_training_iterations_from_the_period_of_hta_annotation_trace() -> None:
    tree = build_tree(read_trace(real_trace(HTA_ANNOTATIONS)))
    steps = tree.steps
    assert len(steps) == 5
    assert steps.found_by == [FOUND_BY_PERIOD] * 5
    for row in range(5):  # each one whole iteration: inputs in, zero_grad, forward, backward, step
        held = names_in_step(tree, row)
        assert held["Optimizer.step#SGD.step"] == 1
        assert held["Optimizer.zero_grad#SGD.zero_grad"] == 1
        assert held["autograd::engine::evaluate_function: MseLossBackward0"] == 1
    assert [tree.node_name(int(n)) for n in steps.node] == ["aten::to"] * 5  # the input copy


def test_benchmark_forwards_from_the_period_of_alexnet() -> None:
    """AlexNet benchmarked twice (warm-up, measure) after its weights were copied in."""
    tree = build_tree(read_trace(real_trace(ALEXNET)))
    assert len(tree.steps) == 2
    assert tree.steps.found_by == [FOUND_BY_PERIOD] * 2
    for row in range(2):
        held = names_in_step(tree, row)
        assert (held["aten::conv2d"], held["aten::linear"]) == (5, 3)  # one forward each


@pytest.mark.parametrize(
    ("relative", "count"),
    [
        ("hta/df_index_resolver_rank1_of2_216k_events.json.gz", 5),
        (RESNET, 5),
        ("hta/queue_len_rank0_of16.json.gz", 5),
        ("hta/sampled_rank0_of128.json.gz", 2),
        (MI300, 3),
    ],
)
def test_the_period_finds_the_profilers_steps_when_they_are_removed(
    relative: str, count: int
) -> None:
    events = read_trace(real_trace(relative))
    truth = build_tree(events).steps
    steps = build_tree(without_profiler_steps(events)).steps

    assert len(truth) == count
    assert len(steps) == count
    assert steps.found_by == [FOUND_BY_PERIOD] * count
    # each found iteration starts near its true step's start: the same loop, cut at most a fifth of
    # a step away from where profiler.step() was called
    usual = float(np.median(truth.dur_ns))
    assert np.abs(steps.start_ns - truth.start_ns).max() < 0.2 * usual


@pytest.mark.parametrize(
    "relative",
    [
        VLLM,  # one engine step: a forward of 28 decoder layers under piecewise CUDA graphs
        SGLANG,  # one prefill
        "tracelens/hf_qwen1.5-0.5b_h100.json.gz",  # one HF forward of 24 layers
        "tracelens/more/h100_timesformer_k400.json.gz",
    ],
)
def test_one_forward_is_not_cut_into_its_layers(relative: str) -> None:
    events = read_trace(real_trace(relative))
    column, names = names_of(events)
    annotation = re.compile(r"^(ProfilerStep#\d+|execute_.*context_.*|step\[.*\])$")
    drop = np.array([bool(annotation.match(n)) for n in names])
    bare = events.table.filter(pa.array(~drop[column.indices.to_numpy()]))
    tree = build_tree(EventTable(table=bare, sources=events.sources))
    assert tree.steps.found_by == [FOUND_BY_CAPTURE]  # the whole forward is one step
    assert (tree.step >= 0).all()
    assert any("does not repeat as a loop does" in w for w in tree.warnings)


@pytest.mark.parametrize(
    "relative",
    [
        # FSDP with CPU offload: every T5 encoder block copies its weights in and repeats, but no
        # block brings anything back to the host; the capture ends mid-way through a forward
        "nsys_ai/fastvideo_h100_sp2_1s.sqlite",
        # vLLM capturing its piecewise CUDA graphs: a sync per piece, the GPU idle
        "tracelens/vllm_prefilldecode_piecewise/graph_capture_rank_0.1773709679453551615.pt.trace.json.gz",
        # two kernels alternating with nothing around them
        "nsys_ai/healthy_1pct.sqlite",
    ],
)
def test_repetition_that_is_no_loop_is_one_capture_step_per_rank(relative: str) -> None:
    tree = build_tree(read_trace(real_trace(relative)))
    assert tree.steps.found_by == [FOUND_BY_CAPTURE] * len(np.unique(tree.rank))
    assert (tree.step >= 0).all()


# -- how users see it ------------------------------------------------------------------------------


def test_info_and_tree_say_how_steps_were_found(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(real_trace(HTA_ANNOTATIONS))
    assert main(["-q", "info", path]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.split()[:3] == ["0", "5", "step"])
    assert " ".join(row[-4:]) == "period of top-level sequence"
    said = " ".join(out.split())  # warnings are wrapped to the terminal's width
    assert "repeated ranges that could name them: 'Optimizer.zero_grad#SGD.zero_grad' ×5" in said

    assert main(["-q", "tree", path, "--step", "2", "--depth", "1"]) == 0
    out = capsys.readouterr().out
    first, second = out.splitlines()[:2]
    assert (
        first.startswith("step 2 on rank 0: ")
        and "(found by period of top-level sequence)" in first
    )
    assert second.lstrip().startswith("aten::to ")
    assert "Optimizer.step#SGD.step" in out

    assert main(["-q", "info", str(real_trace(VLLM))]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert any(row[:1] == ["0"] and row[-2:] == ["engine", "annotation"] for row in rows)
