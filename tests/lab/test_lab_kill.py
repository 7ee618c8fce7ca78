"""A lab run stopped by any signal, SIGKILL included, leaves nothing of its own behind.

Each test starts `teller lab run` in a subprocess with an OS fault switched on from t0, waits
until the fault is in force (the tc throttle on the guilty rank's links, or the memory limit on
its cgroup with the OOM killer off), sends the signal, and polls until no namespace, link, qdisc
(they live on the links), cgroup or process of that run is left. A SIGKILLed run cannot clean up
itself: its guard process does, and the launcher and ranks die with their parents.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lab.lab_procs import alive, descendants, describe
from teller.lab import netns
from teller.lab.cgroups import CGROUP_ROOT, cgroup_version

#: How long the ranks may take to warm up, and a killed run's leftovers to disappear.
STARTUP_LIMIT_S = 120.0
CLEANUP_LIMIT_S = 30.0

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        not netns.is_root() or shutil.which("ip") is None or shutil.which("tc") is None,
        reason="needs root, ip and tc: network namespaces, links and qdiscs to clean up",
    ),
]


def _can_make_namespaces() -> bool:
    probe = "teller-tl99997-0"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return made


def _cgroups(tag: str) -> list[Path]:
    return [p for p in CGROUP_ROOT.rglob(f"teller-{tag}-*") if p.is_dir()]


def _wait_for(
    condition: Callable[[], bool], limit_s: float, what: Callable[[], str], runner=None
) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if runner is not None and runner.poll() is not None:
            pytest.fail(f"the run ended early, waiting for {what()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what()}: not within {limit_s:.0f} s")
        time.sleep(0.2)


def _throttled(tag: str, rank: int) -> bool:
    shown = subprocess.run(
        ["tc", "qdisc", "show", "dev", f"{tag}h{rank}"], capture_output=True, text=True
    ).stdout
    return "tbf" in shown


def _memory_limited(tag: str, rank: int) -> bool:
    group = CGROUP_ROOT / "memory"
    for directory in group.rglob(f"teller-{tag}-{rank}"):
        with contextlib.suppress(OSError, ValueError):
            limited = int((directory / "memory.limit_in_bytes").read_text()) < 1 << 40
            oom_off = "oom_kill_disable 1" in (directory / "memory.oom_control").read_text()
            return limited and oom_off
    return False


def _start(tmp_path: Path, fault: str) -> subprocess.Popen:
    teller = [sys.executable, "-c", "import sys; from teller.cli import main; sys.exit(main())"]
    arguments = ["--fault", fault, "--rank", "1", "--intensity", "0.8"]
    arguments += ["--window", "0:120", "--duration", "120", "--out", str(tmp_path / "case")]
    with open(tmp_path / "stderr.txt", "w") as stderr:  # a pipe left unread would fill up
        return subprocess.Popen(
            [*teller, "lab", "run", *arguments],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # stacks on SIGABRT, for `_stuck`
        )


def _stuck(runner: subprocess.Popen, tmp_path: Path) -> str:
    """What a run that did not exit was doing: its processes, then every thread's Python stack
    (faulthandler prints them on the SIGABRT sent here) at the end of its stderr."""
    processes = describe({runner.pid, *descendants(runner.pid)})
    with contextlib.suppress(ProcessLookupError):
        os.kill(runner.pid, signal.SIGABRT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        runner.wait(timeout=5)
    stderr = (tmp_path / "stderr.txt").read_text(errors="replace")[-6000:]
    return f"the run's exit; its processes:\n{processes}\nits stderr:\n{stderr}"


def _launcher(runner_pid: int) -> int:
    for pid in descendants(runner_pid):
        with contextlib.suppress(OSError):
            if b"teller.lab.serve.launch" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError("no launcher among the run's processes")


CASES = [
    ("net_throttle", signal.SIGKILL),
    ("memory_pressure", signal.SIGKILL),
    ("net_throttle", signal.SIGTERM),
    ("memory_pressure", signal.SIGINT),
    ("net_throttle", "launcher-SIGKILL"),  # a child killed: its ranks die, the run cleans up
]


@pytest.mark.parametrize(("fault", "signal_number"), CASES, ids=lambda c: getattr(c, "name", c))
def test_a_signalled_run_leaves_no_namespace_link_qdisc_cgroup_or_process(
    tmp_path: Path, fault: str, signal_number: signal.Signals | str
) -> None:
    if not _can_make_namespaces():
        pytest.skip("this machine refuses `ip netns add` (no network namespaces)")
    if fault == "memory_pressure" and cgroup_version() != 1:
        pytest.skip("the stalled-at-its-limit check reads cgroup v1's memory.oom_control")
    runner = _start(tmp_path, fault)
    tag = f"tl{runner.pid % 100000}"
    helpers: set[int] = set()
    try:
        in_force = _throttled if fault == "net_throttle" else _memory_limited
        _wait_for(
            lambda: in_force(tag, 1),
            STARTUP_LIMIT_S,
            lambda: f"{fault} in force ({(tmp_path / 'stderr.txt').read_text()[-1500:]})",
            runner,
        )
        helpers = descendants(runner.pid)
        assert len(helpers) >= 4  # guard, launcher, two ranks
        assert netns.leftovers(tag) and _cgroups(tag)
        if signal_number == "launcher-SIGKILL":
            os.kill(_launcher(runner.pid), signal.SIGKILL)
        else:
            runner.send_signal(signal_number)
        _wait_for(
            lambda: runner.poll() is not None,
            CLEANUP_LIMIT_S,
            lambda: _stuck(runner, tmp_path),
        )
        _wait_for(
            lambda: not netns.leftovers(tag) and not _cgroups(tag),
            CLEANUP_LIMIT_S,
            lambda: (
                f"{tag}'s namespaces, links, cgroups gone ({netns.leftovers(tag)}, {_cgroups(tag)})"
            ),
        )
        _wait_for(
            lambda: not [pid for pid in helpers if alive(pid)],
            CLEANUP_LIMIT_S,
            lambda: f"every process of the run gone ({[p for p in helpers if alive(p)]} alive)",
        )
        assert not _throttled(tag, 1)
        assert (tmp_path / "case.failed").is_dir()  # the guard keeps what was recorded
        assert not list(tmp_path.glob(".case.partial-*"))
    finally:
        for pid in [runner.pid, *helpers]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        runner.wait()
        from teller.lab.sweep import sweep

        sweep(live=set(), tags={tag})
