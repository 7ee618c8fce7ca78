"""Where the time went (teller.callchain.breakdown): GPU busy as a union over streams by kind, idle
split by what the host was doing, exposed communication, top kernels and operators.

A hand-built trace pins every number exactly; real traces pin the sums and the causes a person
reads off the timeline (an HTA trace's `aten::item` sync, SGLang's blocking copy, vLLM's
graph replays)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import real_trace
from teller.analysis import Analysis
from teller.callchain.breakdown import (
    ROUNDING_GAP_NS,
    UNLAUNCHED,
    RunBreakdown,
    StepBreakdown,
    idle_summary,
    run_breakdown,
    share,
)
from teller.callchain.intervals import Intervals, clip_to_windows
from teller.callchain.tree import build_tree
from teller.cli import main
from teller.ingest import read_run

US = 1_000  # ns


# -- intervals ------------------------------------------------------------------------------------
def test_union_joins_overlapping_and_touching_intervals_in_any_order():
    union = Intervals.union_of(np.array([50, 0, 10, 30, 70]), np.array([60, 10, 20, 45, 70]))
    assert union.start.tolist() == [0, 30, 50] and union.end.tolist() == [20, 45, 60]
    assert union.total_ns == 20 + 15 + 10  # the empty [70, 70) is dropped


def test_union_joins_gaps_within_the_rounding_tolerance():
    union = Intervals.union_of(np.array([0, 12, 40]), np.array([10, 30, 50]), join_within_ns=2)
    assert union.start.tolist() == [0, 40] and union.end.tolist() == [30, 50]


def test_covered_measures_the_union_inside_each_window():
    union = Intervals.union_of(np.array([0, 30, 50]), np.array([20, 45, 60]))
    lo, hi = np.array([-5, 10, 21, 44, 100]), np.array([100, 35, 29, 55, 200])
    assert union.covered(lo, hi).tolist() == [45, 15, 0, 6, 0]


def test_complement_and_clipping_give_the_gaps_of_each_window():
    gaps = Intervals.union_of(np.array([10, 40]), np.array([20, 50])).complement(0, 60)
    assert list(zip(gaps.start.tolist(), gaps.end.tolist(), strict=True)) == [
        (0, 10),
        (20, 40),
        (50, 60),
    ]
    window, start, end = clip_to_windows(gaps, np.array([0, 5, 30, 45]), np.array([60, 25, 35, 50]))
    assert window.tolist() == [0, 0, 0, 1, 1, 2]
    assert start.tolist() == [0, 20, 50, 5, 20, 30] and end.tolist() == [10, 40, 60, 10, 25, 35]


# -- a hand-built trace ---------------------------------------------------------------------------
def _cpu(name: str, cat: str, ts: float, dur: float, correlation: int | None = None) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
    if correlation is not None:
        event["args"] = {"correlation": correlation}
    return event


def _gpu(name: str, ts: float, dur: float, correlation: int, stream: int = 7, cat="kernel"):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": correlation, "stream": stream, "device": 0},
    }


def write_hand_trace(path: Path) -> Path:
    """One rank, one step [0, 900) µs, then scheduler work and two late launches. On the GPU:

    a GEMM [100, 400) and an all-reduce on another stream [350, 500) (50 µs overlapped), a
    pageable device-to-host copy [690, 700) inside `aten::item`'s cudaMemcpyAsync [505, 705), two
    small kernels each launched just in time [720, 730) and [750, 760), a relu [800, 850); after
    the step two kernels [1200, 1210) and [1500, 1510), with the scheduler on the host between.
    """
    events = [
        _cpu("ProfilerStep#1", "user_annotation", 0, 900),
        _cpu("aten::mm", "cpu_op", 10, 85),
        _cpu("cudaLaunchKernel", "cuda_runtime", 80, 10, correlation=1),
        _cpu("cudaLaunchKernel", "cuda_runtime", 300, 5, correlation=2),
        _cpu("aten::item", "cpu_op", 500, 210),
        _cpu("aten::_local_scalar_dense", "cpu_op", 502, 206),
        _cpu("cudaMemcpyAsync", "cuda_runtime", 505, 200, correlation=3),
        _cpu("cudaLaunchKernel", "cuda_runtime", 710, 5, correlation=4),
        _cpu("cudaLaunchKernel", "cuda_runtime", 730, 20, correlation=5),
        _cpu("aten::relu", "cpu_op", 770, 20),
        _cpu("cudaLaunchKernel", "cuda_runtime", 780, 10, correlation=6),
        _cpu("sglang/srt/managers/scheduler.py(100): get_next_batch", "python_function", 900, 200),
        _cpu("cudaLaunchKernel", "cuda_runtime", 1190, 5, correlation=7),
        _cpu("cudaLaunchKernel", "cuda_runtime", 1400, 5, correlation=8),
        _gpu("gemm_kernel", 100, 300, 1),
        _gpu("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 350, 150, 2, stream=14),
        _gpu("Memcpy DtoH (Device -> Pageable)", 690, 10, 3, cat="gpu_memcpy"),
        _gpu("elementwise_a", 720, 10, 4),
        _gpu("elementwise_b", 750, 10, 5),
        _gpu("relu_kernel", 800, 50, 6),
        _gpu("elementwise_a", 1200, 10, 7),
        _gpu("elementwise_a", 1500, 10, 8),
    ]
    document = {"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
def hand(tmp_path: Path) -> RunBreakdown:
    return run_breakdown(build_tree(read_run([write_hand_trace(tmp_path / "rank0.json")])))


def test_busy_is_the_union_over_streams_by_kind(hand: RunBreakdown):
    (step,) = hand.steps
    assert step.step == 0 and step.span_ns == 900 * US
    busy = step.busy
    assert busy.busy_ns == (400 + 10 + 10 + 10 + 50) * US  # GEMM ∪ all-reduce = [100, 500)
    assert busy.compute_ns == (300 + 10 + 10 + 50) * US
    assert busy.communication_ns == 150 * US and busy.memory_ns == 10 * US
    assert busy.overlapped_communication_ns == 50 * US  # [350, 400) beside the GEMM
    assert busy.exposed_communication_ns == 100 * US


def test_idle_gaps_are_blamed_on_what_the_host_was_doing(hand: RunBreakdown):
    (step,) = hand.steps
    idle = step.idle
    assert step.idle_ns == step.span_ns - step.busy.busy_ns == 420 * US
    # [500, 690) inside the pageable copy, and [700, 720) which it opened: the sync's
    assert idle.sync_ns == (190 + 20) * US
    assert idle.launch_ns == 20 * US  # [730, 750): the host inside cudaLaunchKernel throughout
    assert idle.host_ns == (100 + 40 + 50) * US  # operators and the step's own Python
    assert idle.scheduler_ns == 0 and idle.unrecorded_ns == 0
    top = step.idle_contributors[0]
    assert (top.cause, top.host_call, top.cpu_operator, top.gaps) == (
        "sync",
        "cudaMemcpyAsync",
        "aten::item",
        2,
    )
    longest = step.longest_gaps[0]
    assert (longest.start_ns, longest.dur_ns, longest.cause) == (500 * US, 190 * US, "sync")
    assert idle_summary(step) == (
        "the GPU sat idle 47% of step 0 on rank 0; 50% of that idle time comes from a blocking "
        "cudaMemcpyAsync in aten::item"
    )


def test_the_whole_run_adds_the_scheduler_and_unrecorded_host_time(hand: RunBreakdown):
    (run,) = hand.runs
    assert run.step is None and run.span_ns == 1510 * US
    assert run.busy.busy_ns == 500 * US
    idle = run.idle
    # the step's last gap runs on past its end: [850, 1200) is 200 µs in scheduler.py, 50 in
    # the step's Python, 5 launching and 95 with nothing recorded, so the scheduler's as a whole
    assert idle.scheduler_ns == 350 * US
    assert idle.host_ns == (100 + 40) * US
    assert idle.unrecorded_ns == 290 * US  # [1210, 1500): one 5 µs launch, else nothing
    assert idle.idle_ns == run.span_ns - run.busy.busy_ns
    gaps = hand.gaps.to_arrow().to_pylist()
    assert [g["cause"] for g in gaps] == [
        "host",
        "sync",
        "sync",
        "launch",
        "host",
        "scheduler",
        "unrecorded",
    ]
    assert sum(g["dur_ns"] for g in gaps) == idle.idle_ns
    assert [g["step"] for g in gaps] == [0] * 6 + [-1]  # the step holding each gap's start


def test_top_kernels_and_operators_count_calls_and_time_per_call(hand: RunBreakdown):
    (run,) = hand.runs
    kernels = {k.name: k for k in run.top_kernels}
    assert kernels["gemm_kernel"].gpu_ns == 300 * US and run.top_kernels[0].name == "gemm_kernel"
    assert (kernels["elementwise_a"].calls, kernels["elementwise_a"].gpu_ns) == (3, 30 * US)
    assert kernels["elementwise_a"].per_call_ns == 10 * US
    assert kernels["ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"].kind == "communication"
    operators = {o.name: o for o in run.top_operators}
    assert operators["aten::mm"].gpu_ns == 300 * US and operators["aten::mm"].calls == 1
    assert operators["aten::_local_scalar_dense"].kernels == 1  # the innermost operator launched
    # launched straight from the step annotation, outside any operator: named after it
    assert operators["ProfilerStep#1"].layer == "engine"
    (step,) = hand.steps
    assert "elementwise_a" in {k.name for k in step.top_kernels}
    assert {k.name: k.calls for k in step.top_kernels}["elementwise_a"] == 1  # the step's own


def test_breakdown_rows_and_json_agree(hand: RunBreakdown):
    table = hand.to_arrow().to_pylist()
    assert [row["step"] for row in table] == [None, 0]
    assert table[1]["idle_sync_ns"] == 210 * US
    document = hand.to_json()
    assert document["steps"][0]["idle_by_cause_ns"]["launch"] == 20 * US
    assert document["runs"][0]["summary"].startswith("the GPU sat idle")
    json.dumps(document, allow_nan=False)


def test_ranks_without_gpu_activity_are_listed_not_broken_down(tmp_path: Path):
    path = tmp_path / "rank0.json"
    events = [_cpu("ProfilerStep#1", "user_annotation", 0, 100), _cpu("aten::add", "cpu_op", 1, 5)]
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    breakdown = run_breakdown(build_tree(read_run([path])))
    assert breakdown.runs == [] and breakdown.steps == [] and breakdown.ranks_without_gpu == [0]


def test_shares_read_at_a_glance():
    assert [share(p, 1000) for p in (0, 0.5, 4, 38.4, 996, 999.6, 1000)] == [
        "0%",
        "<0.1%",
        "0.4%",
        "3.8%",
        "99.6%",
        ">99.9%",
        "100%",
    ]


# -- what a user reads ----------------------------------------------------------------------------
def test_analyze_prints_where_the_time_went_and_writes_it_to_json(tmp_path: Path, capsys):
    trace = write_hand_trace(tmp_path / "rank0.json")
    assert main(["-q", "analyze", str(trace), "--method", "localizer"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(k for k, line in enumerate(lines) if line.startswith("where the time went"))
    assert lines[header + 1].split() == [
        "rank", "span", "busy", "compute", "comm", "exposed", "memcpy", "idle",
        "sync", "launch", "sched", "host", "none",
    ]  # fmt: skip
    # shares of the 1.51 ms run: busy + idle = 100%, the causes add up to idle
    assert lines[header + 2].split() == [
        "0", "1.51", "ms", "33%", "26%", "9.9%", "6.6%", "0.7%", "67%",
        "14%", "1.3%", "23%", "9.3%", "19%",
    ]  # fmt: skip
    sentence = " ".join(line.strip() for line in lines[header + 3 : header + 5])  # wrapped
    assert "35% of that idle time the host was in the engine's scheduler" in sentence

    assert main(["-q", "analyze", str(trace), "--method", "localizer", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    (step,) = document["breakdown"]["steps"]
    assert step["idle_by_cause_ns"] == {
        "sync": 210 * US,
        "launch": 20 * US,
        "scheduler": 0,
        "host": 190 * US,
        "unrecorded": 0,
    }
    assert step["exposed_communication_ns"] == 100 * US


def test_analysis_breakdown_is_computed_once(tmp_path: Path):
    analysis = Analysis(write_hand_trace(tmp_path / "rank0.json"), method="localizer")
    assert analysis.breakdown() is analysis.breakdown()
    assert analysis.breakdown().step(0, 0).busy.busy_ns == 480 * US


# -- real traces ----------------------------------------------------------------------------------
def _breakdown_of(relative: str) -> RunBreakdown:
    return run_breakdown(build_tree(read_run([real_trace(relative)])))


def _assert_adds_up(breakdown: StepBreakdown, gaps_ns: int | None = None) -> None:
    busy = breakdown.busy
    assert busy.busy_ns + breakdown.idle_ns == breakdown.span_ns
    assert max(busy.compute_ns, busy.communication_ns, busy.memory_ns) <= busy.busy_ns
    assert 0 <= busy.overlapped_communication_ns <= busy.communication_ns
    assert breakdown.idle.idle_ns == breakdown.idle_ns
    if gaps_ns is not None:
        assert gaps_ns == breakdown.idle_ns


def test_hta_item_sync_is_named_with_its_operator():
    """HTA's cuda_event_sync trace: `if tensor:` → aten::is_nonzero → aten::item copies the value
    to pageable memory, so the GPU drains while the host waits in cudaMemcpyAsync; then a
    cudaEventSynchronize with no operator around it."""
    breakdown = _breakdown_of("hta/cuda_event_sync.json.gz")
    (run,) = breakdown.runs
    _assert_adds_up(run, int(breakdown.gaps.dur_ns.sum()))
    sync = [c for c in run.idle_contributors if c.cause == "sync"]
    assert [(c.host_call, c.cpu_operator, c.idle_ns) for c in sync] == [
        ("cudaMemcpyAsync", "aten::is_nonzero", 134 * US),
        ("cudaEventSynchronize", None, 81 * US),
    ]
    assert run.busy.busy_ns == 51 * US and run.busy.memory_ns == 2 * US  # four kernels, one copy


def test_alexnet_first_step_idles_in_cudafree():
    """HTA's AlexNet: the first step's cuDNN convolutions free their workspaces with cudaFree,
    which synchronises the device (and the first call sets up the CUDA context): seconds of an
    idle GPU behind a blocked host, not Python between launches."""
    breakdown = _breakdown_of("hta/critical_path_alexnet.json.gz")
    first = min((b for b in breakdown.steps if b.step is not None), key=lambda b: b.step)
    _assert_adds_up(first)
    top = first.idle_contributors[0]
    assert (top.cause, top.host_call, top.cpu_operator) == ("sync", "cudaFree", "aten::conv2d")
    assert top.idle_ns > 0.5 * first.idle_ns


def test_sglang_capture_idles_in_a_blocking_copy():
    """SGLang's prefill step: the host sits 493 ms in hipMemcpyWithStream (`torch.tensor(...)`
    → aten::to) while the copy waits on its stream; the model's GEMMs then run 490 ms after the
    host has finished launching."""
    started = time.perf_counter()
    breakdown = _breakdown_of("tracelens/sglang_Qwen3-8B_prefilldecode.json.gz")
    (run,), (step,) = breakdown.runs, breakdown.steps
    for b in (run, step):
        _assert_adds_up(b)
    assert (
        step.span_ns == run.span_ns
    )  # the step's span reaches the end of the GPU work it launched
    top = step.idle_contributors[0]
    assert (top.cause, top.host_call, top.cpu_operator) == (
        "sync",
        "hipMemcpyWithStream",
        "aten::to",
    )
    assert top.idle_ns > 0.99 * step.idle_ns > 0.45 * step.span_ns
    assert run.top_operators[0].name == "aten::mm" and run.top_operators[0].calls == 145
    assert idle_summary(step).startswith("the GPU sat idle 50% of step 0 on rank 0; ")
    assert time.perf_counter() - started < 10  # reading dominates; see the timing test below


def test_breakdown_of_a_60k_event_trace_is_fast():
    tree = build_tree(read_run([real_trace("tracelens/sglang_Qwen3-8B_prefilldecode.json.gz")]))
    started = time.perf_counter()
    run_breakdown(tree)
    assert time.perf_counter() - started < 1.0


def test_multi_step_training_trace_adds_up_per_step():
    """HTA's DDP trace: 5 ProfilerSteps, NCCL all-reduces on their own stream."""
    breakdown = _breakdown_of("hta/queue_len_rank0_of16.json.gz")
    assert len(breakdown.steps) == 5
    for b in [*breakdown.runs, *breakdown.steps]:
        _assert_adds_up(b)
        assert b.busy.communication_ns > 0
    (run,) = breakdown.runs
    assert int(breakdown.gaps.dur_ns.sum()) == run.idle_ns
    assert run.top_kernels[0].gpu_ns >= run.top_kernels[-1].gpu_ns
    # copies launched before the profiling window: one call each, not one call in all
    unlaunched = next(o for o in run.top_operators if o.name == UNLAUNCHED)
    assert unlaunched.layer == "none" and unlaunched.calls == unlaunched.kernels > 100
    # busy is a union: the streams overlap, so the kinds' sum exceeds it (by the overlap, up to
    # the rounding gaps joined into busy)
    kinds = run.busy.compute_ns + run.busy.communication_ns + run.busy.memory_ns
    assert kinds + ROUNDING_GAP_NS * len(breakdown.gaps) >= run.busy.busy_ns


def test_vllm_graph_replays_are_attributed_to_their_launch():
    """vLLM's piecewise CUDA graphs: the replayed kernels have no aten operator around their
    hipGraphLaunch, so they go to the Python frame that replayed the graph, many kernels a call.
    The host's events end 26 ms into the capture while its GPU runs to 308 ms: the idle time
    there has nothing recorded on the host, and the step's span reaches the GPU's end."""
    breakdown = _breakdown_of("tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz")
    (run,), (step,) = breakdown.runs, breakdown.steps
    _assert_adds_up(step)
    replay = run.top_operators[0]
    assert replay.layer == "python" and "replay" in replay.name
    assert replay.calls == 25 and replay.kernels > 10 * replay.calls
    assert step.span_ns == run.span_ns > 10 * 26_000 * US
    assert step.idle_contributors[0].cause == "unrecorded"
