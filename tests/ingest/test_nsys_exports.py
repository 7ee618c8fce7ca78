"""Nsight Systems inputs beyond one process per GPU in today's schema: an older export without
`globalPid`, several devices (per process, or one process driving them all) with NCCL kernels
between them, and `.nsys-rep` reports, exported with `nsys` when it is there.

Where no real export has the shape, a copy of a real one (its own schema) is emptied of activity
and given rows written out here, so every expected number is in the test.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import real_trace
from teller.callchain.tree import EDGE_LAUNCH, build_tree
from teller.cli import main
from teller.errors import TraceError
from teller.ingest import find_trace_files, nsys, read_run, read_trace
from teller.ingest.schema import LAYER_CODE

TINY = "nsys_ai/mock_tiny_real_export.sqlite"
HEALTHY = "nsys_ai/healthy_1pct.sqlite"
KERNEL, RUNTIME = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"
GEMM = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
MS = 1_000_000


def column(events, name: str) -> np.ndarray:
    return events.table.column(name).to_numpy(zero_copy_only=False)


@dataclass
class Launch:
    """One cudaLaunchKernel on a host thread and the kernel it ran."""

    pid: int
    tid: int
    device: int
    correlation: int
    kernel: str
    launch_ns: int
    start_ns: int
    end_ns: int


def export_with(tmp_path: Path, name: str, launches: list[Launch]) -> Path:
    """A copy of a real export whose only activity is `launches` (in the export's own schema)."""
    path = tmp_path / name
    shutil.copy(real_trace(TINY), path)
    with sqlite3.connect(path) as con:
        con.row_factory = sqlite3.Row
        kernel_row = dict(con.execute(f"SELECT * FROM {KERNEL} LIMIT 1").fetchone())
        runtime_row = dict(con.execute(f"SELECT * FROM {RUNTIME} LIMIT 1").fetchone())
        for table in nsys.READ_TABLES:
            if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
                con.execute(f"DELETE FROM {table}")
        (top,) = con.execute("SELECT max(id) FROM StringIds").fetchone()
        ids: dict[str, int] = {}
        for text in ("cudaLaunchKernel_v7000", GEMM, ALLREDUCE):
            ids[text] = top + 1 + len(ids)
            con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (ids[text], text))
        for launch in launches:
            global_pid = launch.pid << 24
            kernel = kernel_row | {
                "start": launch.start_ns,
                "end": launch.end_ns,
                "deviceId": launch.device,
                "streamId": 7,
                "correlationId": launch.correlation,
                "globalPid": global_pid,
                "demangledName": ids[launch.kernel],
                "shortName": ids[launch.kernel],
            }
            runtime = runtime_row | {
                "start": launch.launch_ns,
                "end": launch.launch_ns + 5_000,
                "globalTid": global_pid | launch.tid,
                "correlationId": launch.correlation,
                "nameId": ids["cudaLaunchKernel_v7000"],
            }
            for table, row in ((KERNEL, kernel), (RUNTIME, runtime)):
                marks = ", ".join("?" for _ in row)
                con.execute(
                    f"INSERT INTO {table} ({', '.join(row)}) VALUES ({marks})", tuple(row.values())
                )
    return path


def allreduce_loop(
    devices: list[tuple[int, int, int]], late_device: int, late_ns: int
) -> list[Launch]:
    """Three iterations of a GEMM then an all-reduce on each (pid, tid, device). In iteration 1
    the host of `late_device` launches its all-reduce `late_ns` late, so the peers' NCCL kernels
    wait for it: every copy of one all-reduce ends when the last device has arrived."""
    launches: list[Launch] = []
    correlation = 100
    for iteration in range(3):
        base = iteration * 20 * MS
        arrivals = {}
        for pid, tid, device in devices:
            correlation += 1
            launches.append(
                Launch(pid, tid, device, correlation, GEMM, base, base + MS // 10, base + 4 * MS)
            )
            delay = late_ns if (iteration == 1 and device == late_device) else 0
            arrivals[device] = base + 5 * MS + delay
        finish = max(arrivals.values()) + MS // 2
        for pid, tid, device in devices:
            correlation += 1
            launch = arrivals[device] - MS // 2
            launches.append(
                Launch(pid, tid, device, correlation, ALLREDUCE, launch, arrivals[device], finish)
            )
    return launches


def allreduce_durations(tree) -> dict[int, dict[int, int]]:
    """Per collective instance, each rank's NCCL kernel duration in ns."""
    comm = tree.comm
    out: dict[int, dict[int, int]] = {}
    for k in range(len(comm)):
        out.setdefault(int(comm.instance[k]), {})[int(comm.rank[k])] = int(
            comm.end_ns[k] - comm.start_ns[k]
        )
    return out


# -- the older schema: no globalPid in the activity tables ---------------------------------------


def test_an_export_without_global_pid_is_read() -> None:
    """nsys-ai's healthy_1pct: KERNEL has no globalPid (nor contextId) column."""
    path = real_trace(HEALTHY)
    events = nsys.read(path)
    layer = column(events, "layer")
    assert (int((layer == "kernel").sum()), int((layer == "runtime").sum())) == (400, 400)
    assert events.ranks == [0]
    tree = build_tree(events)
    kernels = np.flatnonzero(tree.layer == LAYER_CODE["kernel"])
    assert len(kernels) == 400
    assert (tree.edge[kernels] == EDGE_LAUNCH).all()  # each under the runtime call that launched it
    assert {tree.node_name(int(tree.parent[k])) for k in kernels} == {"cudaLaunchKernel"}


def test_without_global_pid_two_processes_keep_their_kernels(tmp_path: Path) -> None:
    launches = allreduce_loop([(100, 1, 0), (200, 1, 1)], late_device=1, late_ns=0)
    path = export_with(tmp_path, "two_old.sqlite", launches)
    with sqlite3.connect(path) as con:
        con.execute(f"ALTER TABLE {KERNEL} DROP COLUMN globalPid")
    events = nsys.read(path)
    device, rank = column(events, "device"), column(events, "rank")
    on_gpu = device >= 0
    # each kernel is in the process whose correlation id it carries: device 0 → pid 100 → rank 0
    assert dict(zip(device[on_gpu].tolist(), rank[on_gpu].tolist(), strict=True)) == {0: 0, 1: 1}
    assert not any("carry no process" in w for w in events.warnings)

    with sqlite3.connect(path) as con:  # pid 200 also uses pid 100's first id: it says nothing
        con.execute(
            f"INSERT INTO {RUNTIME} (start, end, eventClass, globalTid, correlationId, nameId, "
            "returnValue) SELECT start + 1000, end + 1000, eventClass, ?, correlationId, nameId, "
            f"returnValue FROM {RUNTIME} WHERE correlationId = 101",
            ((200 << 24) | 1,),
        )
    events = nsys.read(path)
    assert any("1 GPU activities carry no process" in w for w in events.warnings)


# -- several devices, NCCL between them --------------------------------------------------------


def test_a_straggler_device_shows_as_its_peers_long_nccl_kernel(tmp_path: Path) -> None:
    """torchrun under one nsys: two processes, one GPU each; rank 1's host is 6 ms late once."""
    launches = allreduce_loop([(100, 1, 0), (200, 1, 1)], late_device=1, late_ns=6 * MS)
    tree = build_tree(nsys.read(export_with(tmp_path, "two_ranks.sqlite", launches)))
    durations = allreduce_durations(tree)

    assert len(durations) == 3 and all(set(d) == {0, 1} for d in durations.values())
    assert durations[0] == {0: MS // 2, 1: MS // 2}
    assert durations[1] == {0: 6 * MS + MS // 2, 1: MS // 2}  # rank 0 waited in NCCL
    comm_kernels = np.flatnonzero((tree.layer == LAYER_CODE["comm"]) & (tree.stream >= 0))
    assert (tree.edge[comm_kernels] == EDGE_LAUNCH).all()


def test_one_process_driving_two_devices_is_one_rank_per_device(tmp_path: Path) -> None:
    """A single process launching to both GPUs from one thread: each device is a rank, so the
    two copies of each all-reduce are one collective across two ranks, as with two processes."""
    launches = allreduce_loop([(300, 7, 0), (300, 7, 1)], late_device=0, late_ns=3 * MS)
    events = nsys.read(export_with(tmp_path, "one_process.sqlite", launches))

    assert events.ranks == [0, 1]
    rank, device = column(events, "rank"), column(events, "device")
    on_gpu = device >= 0
    assert dict(zip(device[on_gpu].tolist(), rank[on_gpu].tolist(), strict=True)) == {0: 0, 1: 1}
    assert any("pid 300 drives devices 0, 1: each device is a rank" in w for w in events.warnings)

    tree = build_tree(events)
    gpu = np.flatnonzero(tree.stream >= 0)
    assert (tree.edge[gpu] == EDGE_LAUNCH).all()  # each launch is in its kernel's rank
    assert (tree.rank[tree.parent[gpu]] == tree.rank[gpu]).all()
    durations = allreduce_durations(tree)
    assert len(durations) == 3
    assert durations[1] == {0: MS // 2, 1: 3 * MS + MS // 2}  # device 0 was late: 1 waited


# -- .nsys-rep reports ---------------------------------------------------------------------------


def fake_nsys(folder: Path, body: str) -> None:
    script = folder / "nsys"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_a_report_without_nsys_says_how_to_export_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "capture.nsys-rep"
    report.write_bytes(b"not a real report, and no nsys to read it")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(TraceError) as error:
        read_trace(report)
    message = str(error.value)
    assert message.startswith(f"{report}: ")
    assert "`nsys` is not on PATH" in message
    assert "`nsys export --type sqlite -o capture.sqlite capture.nsys-rep`" in message

    assert main(["-q", "info", str(report)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "capture.nsys-rep" in err and "nsys export" in err


def test_a_report_is_exported_with_nsys_to_a_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in `nsys` that writes a real export where `--output` says, and logs its arguments."""
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    log = tmp_path / "nsys.log"
    fake_nsys(
        bin_folder,
        f'echo "$@" > {log}\n'
        'while [ $# -gt 1 ]; do [ "$1" = --output ] && out="$2"; shift; done\n'
        f'cp "{real_trace(TINY)}" "$out"\n',
    )
    monkeypatch.setenv("PATH", f"{bin_folder}{os.pathsep}{os.environ['PATH']}")
    run = tmp_path / "run"
    run.mkdir()
    report = run / "capture_rank3.nsys-rep"
    report.write_bytes(b"report bytes")

    events = read_trace(report)
    direct = nsys.read(real_trace(TINY))
    assert len(events) == len(direct)
    assert [s.path for s in events.sources] == [str(report)]
    assert events.ranks == [3]  # the rank in the report's name
    arguments = log.read_text().split()
    assert arguments[:6] == ["export", "--type", "sqlite", "--force-overwrite", "true", "--output"]
    assert arguments[-1] == str(report)
    exported = Path(arguments[6])
    assert exported.name == "capture_rank3.sqlite"
    assert not exported.exists() and not exported.parent.exists()  # the temporary folder is gone

    assert find_trace_files([run]) == [report]
    assert len(read_run([run])) == len(direct)


def test_a_failing_export_is_one_line_naming_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nsys(
        tmp_path, 'echo "Processing..." ; echo "ERROR: report file is corrupted" >&2\nexit 3\n'
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    report = tmp_path / "broken.nsys-rep"
    report.write_bytes(b"\x00" * 16)
    with pytest.raises(TraceError, match=r"broken\.nsys-rep: .*failed \(exit 3\): ERROR: report"):
        read_trace(report)
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "missing.nsys-rep")
