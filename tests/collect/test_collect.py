"""`teller collect` on real small torch programs, read back with teller's own reader and tree.

Each program is real: it imports torch, runs matmuls inside step annotations, and (in the
distributed case) two processes all-reduce over gloo. Nothing in a program knows it is collected.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from teller.callchain.tree import build_tree
from teller.cli import main
from teller.collect import CollectError, collect, nsys_command
from teller.collect.logs import read_log
from teller.ingest import read_run

CRASHING_PROGRAM = """
import sys
import torch
print("starting", flush=True)
sys.stdout.buffer.write(b"raw \\xff bytes\\n")
sys.stdout.flush()
a = torch.randn(64, 64)
for step in range(5):
    with torch.profiler.record_function(f"ProfilerStep#{step}"):
        (a @ a).relu_()
    print(f"step {step} done")
raise RuntimeError("boom")
"""

VLLM_STEPS_PROGRAM = """
import subprocess
import sys
import torch
a = torch.randn(32, 32)
for k in range(6):
    with torch.profiler.record_function(f"execute_context_0(0)_generation_{k + 1}({k + 1})"):
        a = torch.tanh(a @ a)
if len(sys.argv) > 1:  # then run a helper that stops after one step
    subprocess.run([sys.executable, sys.argv[1]], check=True)
"""

ONE_STEP_PROGRAM = """
import torch
with torch.profiler.record_function("ProfilerStep#0"):
    torch.ones(4).sum()
"""

ENDLESS_PROGRAM = """
import itertools
import time
import torch
a = torch.randn(64, 64)
for step in itertools.count():
    with torch.profiler.record_function(f"ProfilerStep#{step}"):
        (a @ a).sum()
    print(f"step {step}", flush=True)
    time.sleep(0.005)  # a service's pace, not a hot loop: the trace stays small
"""

DISTRIBUTED_PROGRAM = """
import sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank, port):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    x = torch.ones(4096)
    for step in range(3):
        with torch.profiler.record_function(f"ProfilerStep#{step}"):
            y = torch.relu(x * (rank + 1))
            dist.all_reduce(y)
    print(f"rank {rank} sum {float(y[0])}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(work, args=(int(sys.argv[1]),), nprocs=2)
"""


def _program(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _cli(*args: str) -> list[str]:
    """`teller` as a separate process, so its stdout and signals can be checked from outside."""
    return [
        sys.executable,
        "-c",
        "import sys; from teller.cli import main; sys.exit(main())",
        *args,
    ]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("crash")
    program = _program(tmp, "crash.py", CRASHING_PROGRAM)
    out = tmp / "run"
    done = subprocess.run(
        _cli(
            "collect",
            *("--out", str(out), "--with-stack", "--no-shapes"),
            *("--", sys.executable, str(program)),
        ),
        capture_output=True,
        timeout=120,
    )
    return out, done


def test_crash_exit_status_and_stdout_are_the_commands(crashed):
    _, done = crashed
    assert done.returncode == 1, done.stderr.decode(errors="replace")
    assert done.stdout == (
        b"starting\nraw \xff bytes\n" + b"".join(b"step %d done\n" % k for k in range(5))
    )
    assert b"RuntimeError: boom" in done.stderr
    assert b"teller collect: exit 1" in done.stderr


def test_crash_still_leaves_a_readable_trace_with_every_step(crashed):
    out, _ = crashed
    traces = sorted((out / "traces").iterdir())
    assert len(traces) == 1 and traces[0].name.endswith(".pt.trace.json.gz")
    events = read_run([out / "traces"])
    tree = build_tree(events)
    assert tree.steps.name == [f"ProfilerStep#{k}" for k in range(5)]
    ops = {tree.node_name(n) for n in range(len(tree)) if tree.layer_name(n) == "cpu_op"}
    assert {"aten::mm", "aten::relu_"} <= ops
    assert events.layer_counts().get("python", 0) > 0  # --with-stack asked for Python frames
    args = " ".join(a for a in events.table.column("args").to_pylist() if a)
    assert "Input Dims" not in args  # --no-shapes


def test_trace_lands_on_unix_ns_inside_the_run(crashed):
    """Kineto's baseTimeNanoseconds puts the trace on wall clock; the manifest's clocks agree."""
    out, _ = crashed
    manifest = json.loads((out / "manifest.json").read_text())
    events = read_run([out / "traces"])
    assert events.sources[0].clock == "unix"
    tree = build_tree(events)
    (process,) = manifest["processes"]
    clock = process["clock_at_profiler_start"]
    assert set(clock) == {"time_ns", "monotonic_ns", "perf_counter_ns"}
    starts = tree.steps.start_ns
    assert clock["time_ns"] <= starts.min()
    assert (starts + tree.steps.dur_ns).max() <= manifest["end_wall_ns"]
    log_lines = list(read_log(out / process["log"]))
    step_lines = [line for line in log_lines if line.raw.startswith(b"step ")]
    # each "step k done" is printed right after step k closes: the two clocks agree within 1 s
    ends = starts + tree.steps.dur_ns
    for k, line in enumerate(step_lines):
        assert ends[k] <= line.wall_ns + 1_000 and line.wall_ns - ends[k] < 1_000_000_000


def test_logs_have_timestamps_and_the_exact_bytes(crashed):
    out, _ = crashed
    manifest = json.loads((out / "manifest.json").read_text())
    launcher = list(read_log(out / "logs" / "launcher.log"))
    (process,) = manifest["processes"]
    own = [line.raw for line in read_log(out / process["log"])]
    for lines in ([line.raw for line in launcher], own):
        assert b"raw \xff bytes" in lines
        assert b"step 4 done" in lines
        assert b"RuntimeError: boom" in lines
    stamps = [line.wall_ns for line in launcher]
    assert manifest["start_wall_ns"] <= min(stamps) and max(stamps) <= manifest["end_wall_ns"]


def test_manifest_describes_the_run(crashed):
    out, _ = crashed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["exit_code"] == 1
    assert manifest["command"][-1].endswith("crash.py")
    assert manifest["cwd"] == os.getcwd()
    assert manifest["hosts"] == [socket.gethostname()]
    assert manifest["start_wall_ns"] < manifest["end_wall_ns"]
    (key,) = manifest["ranks"]
    rank = manifest["ranks"][key]
    assert key == f"pid{rank['pid']}"  # a lone process has no rank
    assert (out / rank["trace"]).is_file() and (out / rank["log"]).is_file()
    assert rank["exit_reason"] == "exit" and rank["finished"]


@pytest.mark.slow
def test_steps_window_keeps_only_those_steps(tmp_path: Path):
    """The engine's steps 2 and 3 only; a helper process with one step writes no trace, and says so."""
    program = _program(tmp_path, "vllm_like.py", VLLM_STEPS_PROGRAM)
    helper = _program(tmp_path, "one_step.py", ONE_STEP_PROGRAM)
    result = collect([sys.executable, str(program), str(helper)], tmp_path / "run", steps=(2, 3))
    assert result.exit_code == 0
    tree = build_tree(read_run(result.traces))
    # step k is named ..._generation_{k+1}(..): steps 2 and 3 carry 3 and 4 generation requests
    assert tree.steps.generation_requests.tolist() == [3, 4]
    assert set(tree.steps.kind) == {"decode"}
    events = read_run(result.traces)
    assert "python" not in events.layer_counts()  # no stacks by default
    mm_args = [
        arg
        for name, arg in zip(
            events.table.column("name").to_pylist(),
            events.table.column("args").to_pylist(),
            strict=True,
        )
        if name == "aten::mm"
    ]
    assert mm_args and all('"Input Dims": [[32, 32], [32, 32]]' in arg for arg in mm_args)
    manifest = json.loads(result.manifest.read_text())
    engine, one_step = manifest["processes"]
    assert engine["steps_profiled"] == [2, 3]
    assert manifest["steps"] == [2, 3]
    assert len(result.traces) == 1 and one_step["trace"] is None
    assert manifest["notes"] == [
        f"{one_step['name']}: no trace: the process saw 1 steps, window 2:3 never began"
    ]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sent", "reason", "started_ignoring"),
    [
        (signal.SIGTERM, "SIGTERM", False),
        (signal.SIGINT, "exit after SIGINT", False),
        # a shell without job control starts background jobs with SIGINT ignored (`make test &`)
        (signal.SIGINT, "exit after SIGINT", True),
    ],
)
def test_a_signal_mid_run_leaves_a_readable_trace(
    tmp_path: Path, sent: int, reason: str, started_ignoring: bool
):
    """SIGTERM kills by default (the agent exports first); SIGINT raises KeyboardInterrupt, also
    when `teller collect` itself was started with SIGINT ignored."""
    program = _program(tmp_path, "endless.py", ENDLESS_PROGRAM)
    out = tmp_path / "run"
    runner = subprocess.Popen(
        _cli("collect", "--out", str(out), "--", sys.executable, str(program)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_ignore_sigint if started_ignoring else None,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        logs = list((out / "logs").glob("rankpid*.log"))
        if logs and b"step 3\n" in logs[0].read_bytes():
            break
        time.sleep(0.2)
    else:
        runner.kill()
        pytest.fail("the program never reached step 3")
    runner.send_signal(sent)  # to the runner: it forwards to the command's process group
    try:
        _, stderr = runner.communicate(timeout=240)  # exporting a trace is slow on a loaded host
    except subprocess.TimeoutExpired:
        subprocess.run(["pkill", "-9", "-f", str(program)], check=False)  # leave nothing behind
        runner.kill()
        pytest.fail("the interrupted run did not exit within 240 s")
    assert runner.returncode == 128 + sent, stderr.decode(errors="replace")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["exit_code"] == 128 + sent
    (process,) = manifest["processes"]
    assert process["exit_reason"] == reason
    tree = build_tree(read_run([out / "traces"]))
    assert len(tree.steps) >= 4
    assert tree.steps.name[:4] == [f"ProfilerStep#{k}" for k in range(4)]


KILLED_PROGRAM = """
import os
import signal
import torch

for _ in range(3):
    torch.mm(torch.ones(64, 64), torch.ones(64, 64))
print("about to die", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_process_killed_before_exporting_is_named_in_the_manifest(tmp_path: Path):
    """SIGKILL (like a native crash or os._exit) runs no Python: no trace can be written, and
    the manifest and the console say so instead of leaving an unexplained gap."""
    program = _program(tmp_path, "killed.py", KILLED_PROGRAM)
    out = tmp_path / "run"
    done = subprocess.run(
        _cli("collect", "--out", str(out), "--", sys.executable, str(program)),
        capture_output=True,
        timeout=240,
    )
    assert done.returncode == 128 + signal.SIGKILL
    manifest = json.loads((out / "manifest.json").read_text())
    (process,) = manifest["processes"]
    assert process["finished"] is False and process["trace"] is None
    (note,) = [n for n in manifest["notes"] if "no trace" in n]
    assert note.startswith(process["name"]) and "SIGKILL" in note
    assert b"no trace" in done.stderr
    assert not [p for p in (out / "traces").iterdir() if not p.name.startswith(".")]


@pytest.mark.slow
def test_two_rank_gloo_run_joins_collectives_across_ranks(tmp_path: Path):
    program = _program(tmp_path, "allreduce.py", DISTRIBUTED_PROGRAM)
    result = collect(
        [sys.executable, str(program), str(_free_port())],
        tmp_path / "run",
        env={"OMP_NUM_THREADS": "1"},
    )
    assert result.exit_code == 0
    assert [p.name for p in result.traces] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    events = read_run([result.out_dir / "traces"])
    assert events.ranks == [0, 1]
    assert {s.rank_source for s in events.sources} == {"distributedInfo"}
    tree = build_tree(events)
    assert np.bincount(tree.steps.rank).tolist() == [3, 3]
    comm = tree.comm
    assert comm.num_instances >= 3
    for instance in range(comm.num_instances):  # every collective seen from both ranks
        assert sorted(comm.rank[comm.instance == instance].tolist()) == [0, 1]
    assert set(comm.kind) == {"allreduce"}
    manifest = json.loads(result.manifest.read_text())
    for rank in ("0", "1"):
        entry = manifest["ranks"][rank]
        assert entry["trace"] == f"traces/rank{rank}.pt.trace.json.gz"
        assert entry["log"] == f"logs/rank{rank}.log"
        assert entry["world_size"] == 2 and entry["rank_source"] == "init_process_group"
        lines = [line.raw for line in read_log(result.out_dir / entry["log"])]
        assert f"rank {rank} sum 3.0".encode() in lines
    assert manifest["ranks"]["0"]["pid"] != manifest["ranks"]["1"]["pid"]


def test_exit_status_of_a_torch_free_command_and_chained_sitecustomize(tmp_path: Path):
    """A process that never imports torch gets no agent; the target's own sitecustomize still runs."""
    own_hook = tmp_path / "hooks"
    own_hook.mkdir()
    marker = tmp_path / "marker"
    (own_hook / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    result = collect(
        [sys.executable, "-c", "import sys; print('no torch here'); sys.exit(3)"],
        tmp_path / "run",
        env={"PYTHONPATH": str(own_hook)},
    )
    assert result.exit_code == 3
    assert marker.read_text() == "ran"
    assert result.traces == []
    assert list((tmp_path / "run" / "procs").iterdir()) == []
    assert [p.name for p in result.logs] == ["launcher.log"]
    assert [line.raw for line in read_log(result.logs[0])] == [b"no torch here"]
    assert json.loads(result.manifest.read_text())["exit_code"] == 3


def test_nsys_backend_without_nsys_is_a_clear_error(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys here
    with pytest.raises(CollectError, match="nsys"):
        collect(["true"], tmp_path / "run", backend="nsys")
    assert main(["collect", "--out", str(tmp_path / "run"), "--backend", "nsys", "--", "true"]) == 2
    assert "`nsys` (Nsight Systems) is not on PATH" in capsys.readouterr().err
    assert nsys_command(["python", "serve.py"], Path("/out")) == [
        "nsys",
        "profile",
        "-t",
        "cuda,nvtx,osrt",
        "--force-overwrite",
        "true",
        "-o",
        "/out/traces/nsys",
        "python",
        "serve.py",
    ]


def test_refuses_an_occupied_output_folder_and_bad_arguments(tmp_path: Path):
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(CollectError, match="already holds a collection"):
        collect(["true"], tmp_path)
    with pytest.raises(CollectError, match="no command"):
        collect([], tmp_path / "new")
    with pytest.raises(CollectError, match="0 <= A <= B"):
        collect(["true"], tmp_path / "new", steps=(3, 2))
    with pytest.raises(CollectError, match="cannot start"):
        collect(["/nonexistent/binary"], tmp_path / "other")
    with pytest.raises(CollectError, match="step regex"):
        collect(["true"], tmp_path / "third", env={"TELLER_COLLECT_STEP_REGEX": "step[("})


TORCHRUN_PROGRAM = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(256)
for step in range(2):
    with torch.profiler.record_function(f"ProfilerStep#{step}"):
        dist.all_reduce(x * (rank + 1))
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_ranks_are_named_by_rank_and_the_launcher_adds_no_trace(tmp_path: Path):
    """torchrun imports torch but runs no operator: it gets a log, not a fake rank-0 trace."""
    program = _program(tmp_path, "ranks.py", TORCHRUN_PROGRAM)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["--master-port", str(_free_port()), str(program)]
    result = collect(command, tmp_path / "run", env={"OMP_NUM_THREADS": "1"})
    assert result.exit_code == 0
    assert [p.name for p in result.traces] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    manifest = json.loads(result.manifest.read_text())
    launcher = [key for key in manifest["ranks"] if key.startswith("pid")]
    assert len(launcher) == 1 and manifest["ranks"][launcher[0]]["trace"] is None
    assert manifest["ranks"][launcher[0]]["trace_note"].startswith("torchrun launcher")
    for rank in ("0", "1"):
        assert manifest["ranks"][rank]["rank_source"] == "RANK"
        lines = [line.raw for line in read_log(result.out_dir / manifest["ranks"][rank]["log"])]
        assert f"rank {rank} done".encode() in lines
    tree = build_tree(read_run([result.out_dir / "traces"]))
    assert np.bincount(tree.steps.rank).tolist() == [2, 2]
    assert tree.comm.num_instances >= 2


PARENT_AND_CHILD_PROGRAM = """
import subprocess
import sys
import torch
torch.ones(8).sum()
child = "import torch; torch.ones(4).mul(2).sum(); print('child done', flush=True)"
subprocess.run([sys.executable, "-c", child], check=True)
"""


@pytest.mark.slow
def test_a_child_that_inherits_rank_gets_its_own_files(tmp_path: Path):
    """RANK=0 in both processes: the child's trace sits beside the parent's instead of over it."""
    program = _program(tmp_path, "parent.py", PARENT_AND_CHILD_PROGRAM)
    result = collect([sys.executable, str(program)], tmp_path / "run", env={"RANK": "0"})
    assert result.exit_code == 0
    manifest = json.loads(result.manifest.read_text())
    parent, child = manifest["processes"]
    assert parent["name"] == "rank0" and child["name"] == f"rank0.pid{child['pid']}"
    assert sorted(p.name for p in result.traces) == sorted(
        ["rank0.pt.trace.json.gz", f"rank0.pid{child['pid']}.pt.trace.json.gz"]
    )
    assert set(manifest["ranks"]) == {"0", f"pid{child['pid']}"}
    child_lines = [line.raw for line in read_log(result.out_dir / child["log"])]
    assert b"child done" in child_lines
    events = read_run(result.traces)
    assert [s.rank for s in events.sources] == [0, 0]
    ops = events.table.column("name").to_pylist()
    assert "aten::mul" in ops and "aten::ones" in ops


def test_nsys_mode_agent_asks_for_nvtx_and_says_when_torch_has_none(tmp_path: Path):
    """What the agent does under `--backend nsys`, run without nsys: on this CPU-only torch,
    emit_nvtx is refused, and the record says so instead of failing the target."""
    from teller.collect.runner import INJECT_DIR

    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(INJECT_DIR))
    env.update(TELLER_COLLECT_DIR=str(out), TELLER_COLLECT_PROFILE="nvtx")
    program = "import torch; print(torch.ones(3).sum().item())"
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout == b"3.0\n"
    (record,) = [json.loads(p.read_text()) for p in (out / "procs").glob("*.json")]
    assert record["trace"] is None and record["clock_at_profiler_start"] is None
    if not torch_has_cuda():
        assert record["trace_note"].startswith("NVTX ranges off: AssertionError")


def torch_has_cuda() -> bool:
    import torch

    return torch.backends.cuda.is_built()
