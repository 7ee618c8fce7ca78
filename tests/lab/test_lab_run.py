"""`teller lab run` refuses what it cannot do and leaves nothing behind when stopped."""

from __future__ import annotations

import contextlib
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
from teller.lab import netns
from teller.lab.cgroups import cgroup_version
from teller.lab.run import CaseSpec, parse_window, run_case


def test_faults_needing_root_are_refused_with_a_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(netns, "is_root", lambda: False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for fault in ("net_throttle", "memory_pressure"):
        with pytest.raises(TellerError, match="needs root"):
            run_case(CaseSpec(fault=fault), tmp_path / fault)
        assert not (tmp_path / fault).exists()


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
