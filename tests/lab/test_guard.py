"""Lab children die with their parent, however the parent ends (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from lab.lab_procs import alive

#: A parent that starts one child which asks to die with it, prints the child's pid, and sleeps.
PARENT = """
import os, subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c", "from teller.lab.guard import die_with_expected_parent; "
     "import time; die_with_expected_parent(); time.sleep(60)"],
    env={**os.environ, "TELLER_LAB_PARENT_PID": str(os.getpid())},
)
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_dies_when_its_parent_is_sigkilled() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        time.sleep(1.0)  # the child has made the setting (it imports little)
        assert alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child)
    finally:
        parent.kill()
        parent.wait()


def test_a_child_whose_parent_is_already_gone_exits_at_once() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from teller.lab.guard import die_with_expected_parent; "
            "die_with_expected_parent(); print('ran on')",
        ],
        env={**os.environ, "TELLER_LAB_PARENT_PID": "1"},  # not our parent: it "died" before
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == -signal.SIGKILL
    assert "ran on" not in done.stdout
