"""`teller lab run` refuses what it cannot do and leaves nothing behind when stopped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.lab_procs import alive, descendants
from teller.cli import main
from teller.errors import TellerError
from teller.faults import FAULTS
from teller.lab import netns
from teller.lab.acted import fault_counter
from teller.lab.cgroups import cgroup_version
from teller.lab.run import CaseSpec, _check_fault_acted, parse_window, run_case
from teller.labels import CaseLabels


def test_faults_needing_root_are_refused_with_a_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(netns, "is_root", lambda: False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for fault in ("net_throttle", "memory_pressure"):
        with pytest.raises(TellerError, match="needs root"):
            run_case(CaseSpec(fault=fault), tmp_path / fault)
        assert not (tmp_path / fault).exists()


def _host_file(case_dir: Path, rank: int, counts: list[int], counter: str, t0_ns: int) -> None:
    host = case_dir / "host"
    host.mkdir(parents=True, exist_ok=True)
    lines = []
    for k, count in enumerate(counts):
        sample = {"t_ns": t0_ns + k * 10**8, "cpu_ns": k * 10**7, "run_delay_ns": 0}
        sample |= {"throttled_ns": -1, "memory_stall_ns": -1, "major_faults": 0}
        lines.append(json.dumps(sample | {counter: count, "stopped": False}))
    (host / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")


def _labels(spec: CaseSpec, window_ns: tuple[int, int], steps: list[int]) -> CaseLabels:
    return CaseLabels(
        case_id="c",
        source="lab",
        fault=spec.fault,
        view=FAULTS[spec.fault],
        guilty_rank=spec.rank,
        guilty_operator=None,
        window_ns=window_ns,
        steps=steps,
        intensity=spec.intensity,
        seed=0,
        explanation="",
    )


def test_a_fault_whose_counter_did_not_rise_in_its_window_is_refused(tmp_path):
    t0_ns = 10**18
    window_ns = (t0_ns + 2 * 10**8, t0_ns + 6 * 10**8)
    # a counter that stays flat on a healthy rank names the steps it rose in: none, refused
    memory = CaseSpec("memory_pressure", rank=2, intensity=0.8, window_s=(0.2, 0.6), tp=3)
    _host_file(tmp_path / "faults", 2, [0, 0, 0, 4, 9, 9, 9, 9], "major_faults", t0_ns)
    kept = tmp_path / "case.failed"

    def check(spec: CaseSpec, case_dir: Path, labels: CaseLabels) -> None:
        counter = fault_counter(case_dir, spec.fault, spec.rank)
        _check_fault_acted(spec, counter, labels, kept)

    with pytest.raises(
        TellerError,
        match=rf"memory_pressure on rank 2 did not act: its major_faults .*\({kept}/host/rank2",
    ):
        check(memory, tmp_path / "faults", _labels(memory, window_ns, []))
    check(memory, tmp_path / "faults", _labels(memory, window_ns, [3]))
    # run delay rises on every rank of a machine with fewer cores than ranks: the window as a
    # whole must see it rise
    busy = CaseSpec("cpu_contention", rank=2, intensity=0.8, window_s=(0.2, 0.6), tp=3)
    busy_labels = _labels(busy, window_ns, [3, 4])
    _host_file(tmp_path / "late", 2, [0, 0, 0, 0, 0, 0, 0, 3], "run_delay_ns", t0_ns)
    with pytest.raises(TellerError, match=r"cpu_contention on rank 2 did not act: its run_delay"):
        check(busy, tmp_path / "late", busy_labels)
    _host_file(tmp_path / "rose", 2, [0, 0, 0, 4, 9, 9, 9, 9], "run_delay_ns", t0_ns)
    check(busy, tmp_path / "rose", busy_labels)
    # a counter that was not readable (-1: no cgroup quota file) gives nothing to check against
    quota = CaseSpec("straggler", rank=2, intensity=0.8, window_s=(0.2, 0.6), tp=3)
    check(quota, tmp_path / "faults", _labels(quota, window_ns, []))
    # a capped scheduler whose lowered limits kept nothing out in any window step
    capped = CaseSpec("scheduler_misconfig", rank=0, intensity=0.8, window_s=(0.2, 0.6), tp=2)
    idle = _labels(capped, window_ns, [])
    idle.params["steps_from"] = "held_back"
    with pytest.raises(
        TellerError,
        match=rf"scheduler_misconfig did not act: .*\({kept}/ground_truth/steps.jsonl\)",
    ):
        check(capped, tmp_path / "nothing", idle)
    acted = _labels(capped, window_ns, [3])
    acted.params["steps_from"] = "held_back"
    check(capped, tmp_path / "nothing", acted)
    # nor do faults without a counter of their own, nor a run without host counters
    slow = CaseSpec("slow_operator", rank=2, tp=3)
    check(slow, tmp_path / "faults", _labels(slow, window_ns, []))
    check(memory, tmp_path / "nothing", _labels(memory, window_ns, []))


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    assert main(["lab", "run", "--rank", "2", "--tp", "2", "--out", str(tmp_path / "c")]) == 2
    assert "--rank 2 is not a rank of --tp 2" in capsys.readouterr().err
    with pytest.raises(TellerError, match="expected A:B"):
        parse_window("3-7")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert main(["lab", "run", "--out", str(tmp_path / "full")]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err


@pytest.mark.lab
@pytest.mark.skipif(not netns.is_root(), reason="needs root: namespaces and cgroups to clean up")
@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_an_interrupted_run_removes_namespaces_cgroups_and_helpers(tmp_path, signal_number):
    out = tmp_path / "case"
    teller = [sys.executable, "-c", "import sys; from teller.cli import main; sys.exit(main())"]
    arguments = ["--fault", "cpu_contention", "--rank", "1", "--intensity", "0.5"]
    arguments += ["--window", "0:60", "--duration", "60", "--out", str(out)]
    runner = subprocess.Popen(
        [*teller, "lab", "run", *arguments],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    tag = f"tl{runner.pid % 100000}"
    partial = tmp_path / f".case.partial-{runner.pid}"
    deadline = time.monotonic() + 240
    while not (partial / "run" / "t0_ns").exists():  # serving, fault applied from t0
        assert runner.poll() is None, runner.stderr.read()
        assert time.monotonic() < deadline, "ranks did not start"
        time.sleep(0.2)
    time.sleep(1.0)
    helpers = descendants(runner.pid)
    assert len(helpers) >= 4  # launcher, two ranks, the CPU hogs (and log tees)
    assert netns.leftovers(tag)
    runner.send_signal(signal_number)
    try:
        _, stderr = runner.communicate(timeout=300)  # ranks export their traces first
    except subprocess.TimeoutExpired:
        for pid in helpers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        runner.kill()
        pytest.fail("the interrupted run did not exit within 300 s")
    assert runner.returncode != 0
    assert "teller: error" in stderr or "interrupted" in stderr
    assert netns.leftovers(tag) == []
    if cgroup_version() == 1:
        for controller in ("cpu", "memory"):
            assert not list(Path("/sys/fs/cgroup", controller).rglob(f"teller-{tag}-*"))
    assert [pid for pid in helpers if alive(pid)] == []
    assert not out.exists() and not partial.exists()
    assert (tmp_path / "case.failed").is_dir()  # what was recorded stays inspectable


@pytest.mark.lab
@pytest.mark.skipif(not netns.is_root(), reason="needs root: a per-rank CPU cgroup to read")
def test_a_recorded_fault_that_never_acted_leaves_no_case(tmp_path):
    # a quota of a whole CPU never throttles a rank that runs one thread of work at a time
    spec = CaseSpec("straggler", rank=1, intensity=0.0, window_s=(1.0, 3.0), duration_s=3.0)
    # the error names the counter's file in the folder the refused recording is kept in
    kept = tmp_path / "case.failed" / "host" / "rank1.jsonl"
    with pytest.raises(
        TellerError, match=rf"straggler on rank 1 did not act: its throttled_ns .*\({kept}\)"
    ):
        run_case(spec, tmp_path / "case")
    assert not (tmp_path / "case").exists()
    assert kept.exists()
