"""The planted-fault suite's planting is physically consistent, as teller's own readers see it.

Each test plants one fault in a real trace, writes the copy, reads original and copy with
`teller.ingest.read_trace` and compares them row for row (the readers keep file order, and the
planting keeps every event): the slowed kernel is longer by exactly the amount, later work on its
stream moves by what the slack before it does not absorb, no stream overlaps itself, the host
moves after the blocking call that waited on the kernel and not before, nothing moves earlier.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from conftest import real_trace
from teller.analysis import Analysis
from teller.eval.planting import DISPATCH_GAP_NS, KERNEL, kernel_kind, replay
from teller.eval.planting_nsys import COLLECTIVE_KERNEL
from teller.eval.planting_suite import (
    COLLECTIVE_BASE_NS,
    SUITE,
    Planted,
    Planter,
    load,
    locate,
    score,
)
from teller.ingest import read_trace

HF_QWEN = "tracelens/hf_qwen1.5-0.5b_h100.json.gz"
RESNET_NS = "hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz"
FASTVIDEO = "nsys_ai/fastvideo_h100_sp2_1s.sqlite"
ADDED_NS = 1_234_567


def _columns(path: Path) -> dict[str, np.ndarray]:
    table = read_trace(path).table
    out = {
        name: table.column(name).to_numpy()
        for name in ("ts_ns", "dur_ns", "stream", "pid", "tid", "layer")
    }
    out["name"] = np.array(table.column("name").to_pylist(), dtype=object)
    return out


def _gemm_waited_on_by_a_sync(timeline) -> tuple[int, int]:
    """A GEMM launched before its process's last blocking call, and the first blocking call of
    that process to return after the GEMM ends (the one that waits on it)."""
    t = timeline
    syncs = np.flatnonzero(t.host_sync)
    last = int(syncs[np.argmax(t.host_end[syncs])])
    pid = t.threads[int(t.host_thread[last])][0]
    rows = [
        r
        for r, name in enumerate(t.gpu_name)
        if kernel_kind(name) == "gemm"
        and t.gpu_launch[r] >= 0
        and t.threads[int(t.host_thread[t.gpu_launch[r]])][0] == pid
        and t.host_start[t.gpu_launch[r]] < t.host_start[last]
        and t.gpu_end[r] < t.host_end[last]
    ]
    row = rows[len(rows) // 2]
    launched = t.host_start[t.gpu_launch[row]]
    waiting = [
        s
        for s in syncs.tolist()
        if t.threads[int(t.host_thread[s])][0] == pid
        and t.host_end[s] >= t.gpu_end[row]
        and t.host_start[s] > launched
    ]
    return row, min(waiting, key=lambda s: t.host_end[s])


def _no_new_overlap(before: dict, after: dict) -> None:
    gpu = np.flatnonzero(before["stream"] >= 0)
    keys = {(int(before["pid"][i]), int(before["stream"][i])) for i in gpu}
    for pid, stream in keys:
        rows = gpu[(before["pid"][gpu] == pid) & (before["stream"][gpu] == stream)]
        rows = rows[np.lexsort((rows, before["ts_ns"][rows]))]
        old_gap = before["ts_ns"][rows[1:]] - (
            before["ts_ns"][rows[:-1]] + before["dur_ns"][rows[:-1]]
        )
        new_gap = after["ts_ns"][rows[1:]] - (
            after["ts_ns"][rows[:-1]] + after["dur_ns"][rows[:-1]]
        )
        assert np.all(new_gap[old_gap >= 0] >= 0), f"ops overlap on stream {stream} of {pid}"


def test_slowed_kernel_moves_its_stream_and_the_host_after_the_sync(tmp_path: Path) -> None:
    path = real_trace(HF_QWEN)
    trace = load(path)
    t = trace.timeline
    row, sync = _gemm_waited_on_by_a_sync(t)
    replayed = replay(t, slower={row: ADDED_NS})
    copy = trace.write(replayed, tmp_path / "planted.json")
    before, after = _columns(path), _columns(copy)

    assert len(before["ts_ns"]) == len(after["ts_ns"])
    assert list(before["name"]) == list(after["name"])
    shift = after["ts_ns"] - before["ts_ns"]
    end_shift = shift + after["dur_ns"] - before["dur_ns"]
    assert shift.min() >= 0 and end_shift.min() >= 0, "nothing moves earlier"

    kernel = int(
        np.flatnonzero(
            (before["ts_ns"] == t.gpu_start[row] + _base(path))
            & (before["name"] == t.gpu_name[row])
        )[0]
    )
    assert shift[kernel] == 0
    assert after["dur_ns"][kernel] - before["dur_ns"][kernel] == ADDED_NS

    earlier = before["ts_ns"] + before["dur_ns"] <= before["ts_ns"][kernel]
    assert not shift[earlier].any() and not end_shift[earlier].any(), "what ended before it stays"

    gpu = before["stream"] >= 0
    same = np.flatnonzero(
        gpu
        & (before["stream"] == before["stream"][kernel])
        & (before["ts_ns"] > before["ts_ns"][kernel])
    )
    same = same[np.argsort(before["ts_ns"][same], kind="stable")]
    kernel_end = before["ts_ns"][kernel] + before["dur_ns"][kernel]
    gap = before["ts_ns"][same[0]] - kernel_end
    following = int(np.flatnonzero(t.gpu_start + _base(path) == before["ts_ns"][same[0]])[0])
    launch_returned = t.host_end[t.gpu_launch[following]] + _base(path)
    if launch_returned <= kernel_end and gap <= DISPATCH_GAP_NS:
        idle = 0  # it was queued behind the kernel: it starts as late as the kernel ends
    else:
        idle = min(gap, max(launch_returned - kernel_end, 0))
    assert shift[same[0]] == max(ADDED_NS - idle, 0), "the next op absorbs only its idle time"
    assert shift[same].max() > 0, "later work on the stream moved"
    _no_new_overlap(before, after)

    delays = dict(replayed.sync_delays)
    assert delays.get(sync, 0) > 0, "the blocking call waited on the slowed kernel"
    returned = t.host_end[sync] + _base(path)
    host = ~gpu & (before["tid"] == t.threads[int(t.host_thread[sync])][1])
    after_return = host & (before["ts_ns"] >= returned)
    assert after_return.any()
    assert np.all(shift[after_return] == delays[sync]), "the host moved by the delay after the call"
    before_call = host & (before["ts_ns"] + before["dur_ns"] < t.host_start[sync] + _base(path))
    assert not shift[before_call].any(), "the host does not move before the call that waited"


@pytest.mark.slow
def test_a_gpu_bound_host_blocks_in_a_full_launch_queue(tmp_path: Path) -> None:
    """ResNet on a V100 runs a full launch queue (1,022 launches ahead of the GPU), so a slower
    kernel makes later `cudaLaunchKernel` calls return later and the later steps longer."""
    path = real_trace(RESNET_NS)
    trace = load(path)
    t = trace.timeline
    spec = next(s for s in SUITE if s.path == RESNET_NS)
    variant = Planter(spec, trace, seed=19).plant("kernel:gemm:0.25")
    blocked = [call for call, late in variant.replayed.sync_delays if late > 0]
    names = {t.host_name[c] for c in blocked}
    assert "cudaLaunchKernel" in names, "launches waited for room in the queue"
    assert all(n.startswith("cudaLaunch") or n.endswith("Async") for n in names), names
    before, after = _columns(path), _columns(variant.write(tmp_path))
    steps = np.flatnonzero([str(n).startswith("ProfilerStep#") for n in before["name"]])
    growth = (after["dur_ns"] - before["dur_ns"])[steps]
    later = before["ts_ns"][steps] > t.gpu_start[t.gpu_name.index(variant.truth.kernel)] + _base(
        path
    )
    assert growth[later].sum() >= 0.9 * variant.truth.added_ns, "the host felt the slower GPU"
    assert np.all(growth >= 0)


@pytest.mark.slow
def test_an_unplanted_copy_keeps_every_nanosecond(tmp_path: Path) -> None:
    """A trace whose timestamps carry ns digits a float64 cannot hold round-trips exactly."""
    path = real_trace(RESNET_NS)
    trace = load(path)
    copy = trace.write(replay(trace.timeline), tmp_path / "copy.json")
    before, after = _columns(path), _columns(copy)
    assert np.array_equal(before["ts_ns"], after["ts_ns"])
    assert np.array_equal(before["dur_ns"], after["dur_ns"])


def test_a_kernel_slowed_in_an_nsys_export(tmp_path: Path) -> None:
    path = real_trace(FASTVIDEO)
    trace = load(path)
    t = trace.timeline
    row, sync = _gemm_waited_on_by_a_sync(t)
    replayed = replay(t, slower={row: ADDED_NS})
    before, after = _columns(path), _columns(trace.write(replayed, tmp_path / "planted.sqlite"))
    assert len(before["ts_ns"]) == len(after["ts_ns"])
    shift = after["ts_ns"] - before["ts_ns"]
    assert shift.min() >= 0
    kernel = int(
        np.flatnonzero(
            (before["ts_ns"] == t.gpu_start[row] + _base(path)) & (before["stream"] >= 0)
        )[0]
    )
    assert after["dur_ns"][kernel] - before["dur_ns"][kernel] == ADDED_NS
    _no_new_overlap(before, after)
    assert dict(replayed.sync_delays).get(sync, 0) > 0


def _base(path: Path) -> int:
    """Session clock → unix ns, as the nsys reader applies it."""
    return read_trace(path).sources[0].base_time_ns


def test_a_stalled_host_makes_its_peer_wait_in_the_collective(tmp_path: Path) -> None:
    spec = next(s for s in SUITE if s.path == FASTVIDEO)
    path = real_trace(FASTVIDEO)
    planter = Planter(spec, load(path), seed=19)
    variant = planter.plant("straggler:device1:0.01")
    truth: Planted = variant.truth
    copy = variant.write(tmp_path)
    before, after = read_trace(path).table, read_trace(copy).table
    assert after.num_rows == before.num_rows + 4, "one NCCL kernel and its launch per device"
    comm = after.filter(pc.equal(after.column("layer").cast(pa.string()), "comm"))
    assert comm.num_rows == 2 and set(comm.column("name").to_pylist()) == {COLLECTIVE_KERNEL}
    durations = dict(
        zip(comm.column("pid").to_pylist(), comm.column("dur_ns").to_pylist(), strict=True)
    )
    control = planter.plant("control:control:0")
    clean = read_trace(control.write(tmp_path / "control")).table
    clean_comm = clean.filter(pc.equal(clean.column("layer").cast(pa.string()), "comm"))
    clean_durations = dict(
        zip(
            clean_comm.column("pid").to_pylist(),
            clean_comm.column("dur_ns").to_pylist(),
            strict=True,
        )
    )
    peer = 1 - truth.device
    assert durations[truth.device] == COLLECTIVE_BASE_NS, (
        "the stalled device arrives last, waits for none"
    )
    assert durations[peer] - clean_durations[peer] == truth.peer_wait_added_ns
    assert truth.peer_wait_added_ns > 0.9 * truth.added_ns, "the peer waited out the stall"
    ends = pc.add(comm.column("ts_ns"), comm.column("dur_ns")).to_pylist()
    assert ends[0] == ends[1], "a collective ends on every device together"
    t = variant.trace.timeline
    thread = t.threads.index((truth.pid, truth.tid))
    later = (t.host_thread == thread) & (t.host_start > truth.at_ns)
    moved = variant.replayed.host_shifts(t.host_thread[later], t.host_start[later])
    assert np.all(moved >= truth.added_ns), "the stalled thread's later calls moved by the stall"


def test_scoring_credits_the_planted_kernel_and_nothing_else(tmp_path: Path) -> None:
    spec = next(s for s in SUITE if s.path == HF_QWEN)
    planter = Planter(spec, load(real_trace(HF_QWEN)), seed=19)
    variant = planter.plant("kernel:gemm:0.25")
    analysis = Analysis(variant.write(tmp_path), method="localizer")
    tree, events = analysis.tree, analysis.event_table
    truth = variant.truth
    node = locate(tree, 0, truth.anchor_name, truth.anchor_ordinal)
    assert node >= 0 and tree.dur[node] == truth.kernel_dur_ns + truth.added_ns
    step = int(tree.steps.index[tree.step[node]])
    right = {"step": step, "rank": 0, "operator": truth.kernel, "operator_node": node}
    wrong = {"step": step, "rank": 0, "operator": "aten::softmax", "operator_node": 0}
    rows = [{"rank": 0, "step": step, "name": truth.step_name, "anomalous": True}]
    hit = score(truth, {"findings": [right], "steps": rows}, tree, events)
    assert hit.step_found and hit.headline and hit.operator_hit and hit.operator_instance
    miss = score(truth, {"findings": [wrong], "steps": rows}, tree, events)
    assert miss.step_found and not miss.operator_hit and not miss.operator_instance
    nothing = score(truth, {"findings": [], "steps": []}, tree, events)
    assert not nothing.step_found and not nothing.headline and not nothing.operator_hit


@pytest.mark.slow
@pytest.mark.parametrize("spec", SUITE, ids=lambda s: Path(s.path).name)
def test_every_suite_trace_takes_its_faults(spec) -> None:
    """Each kind the suite lists for a trace is there to slow, in the step it picks."""
    trace = load(real_trace(spec.path))
    planter = Planter(spec, trace, seed=19)
    for kind in spec.kinds:
        variant = planter.plant(f"kernel:{kind}:0.05")
        assert kernel_kind(variant.truth.kernel) == kind
        t = variant.trace.timeline
        assert t.gpu_kind[np.flatnonzero(np.array(t.gpu_name) == variant.truth.kernel)[0]] == KERNEL
        assert variant.truth.added_ns == round(0.05 * variant.truth.step_dur_ns)
