"""A guard process that outlives a lab run and removes what the run made if the run is killed.

SIGINT and SIGTERM end a run through its own clean-up; SIGKILL (or the OOM killer) ends it at
once, leaving namespaces, links, qdiscs, cgroups and ranks behind. So before a run makes any of
them it starts this guard: `python -m teller.lab.guard TAG [PARTIAL FAILED]`, in its own session
(a Ctrl-C to the terminal's process group does not reach it), holding the read end of a pipe whose
only write end is the run's. The guard blocks on that pipe. A run that finishes writes `done` and
closes it, and the guard exits without touching anything; any other end of the run (the kernel
closes the pipe of a killed process) reads as end-of-file, and the guard sweeps the run's tag
(`teller.lab.sweep`) until nothing of it is left, then moves the run's partial case folder to its
`.failed` name, as the run's own clean-up would have.

Children die with their parent as well (`die_with_parent`, PR_SET_PDEATHSIG), so the launcher and
the ranks do not run on orphaned; the sweep catches whatever is still there (a rank stalled at its
memory limit, a process in a namespace).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

#: The pid a lab child expects as its parent (the run, or the launcher for a rank), for
#: `die_with_parent`'s check that the parent did not die before the setting was made.
PARENT_PID_ENV = "TELLER_LAB_PARENT_PID"
#: What a run that ended through its own clean-up writes before closing the pipe.
DONE = b"done"
#: How long the guard keeps sweeping a killed run's tag (ranks take a moment to exit).
SWEEP_DEADLINE_S = 20.0
_SWEEP_PAUSE_S = 0.2
_PR_SET_PDEATHSIG = 1


def die_with_parent(number: int = signal.SIGKILL, parent_pid: int | None = None) -> None:
    """Ask the kernel to send `number` to this process when the thread that started it exits.

    If that parent is already gone (it died between our fork and this call), exit now: the
    setting would never fire. `parent_pid` is the parent we expect; without it, being re-parented
    to init counts as gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(number), 0, 0, 0) != 0:
        return  # not Linux or refused: the guard's sweep still removes what is left
    parent = os.getppid()
    if (parent_pid is not None and parent != parent_pid) or parent == 1:
        os.kill(os.getpid(), number)


def die_with_expected_parent() -> None:
    """`die_with_parent` for a lab child started with PARENT_PID_ENV set (a no-op without it)."""
    parent = os.environ.get(PARENT_PID_ENV, "")
    if parent.isdigit():
        die_with_parent(signal.SIGKILL, int(parent))


@contextlib.contextmanager
def guarded(tag: str, partial: Path | None = None, failed: Path | None = None) -> Iterator[int]:
    """Run the body with a guard watching this process; yields the guard's pid.

    Leaving the body normally or by an exception (the run's own clean-up has run by then) tells
    the guard to stand down and waits for it, so a later run in this process, which has the same
    tag, never meets a late sweep."""
    read_end, write_end = os.pipe()  # both close-on-exec: no child of the run holds the write end
    command = [sys.executable, "-m", "teller.lab.guard", tag]
    if partial is not None and failed is not None:
        command += [str(partial), str(failed)]
    try:
        guard = subprocess.Popen(
            command,
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": _package_path()},
        )
    finally:
        os.close(read_end)
    try:
        yield guard.pid
    finally:
        with contextlib.suppress(BrokenPipeError):
            os.write(write_end, DONE)
        os.close(write_end)
        guard.wait()


def _package_path() -> str:
    """PYTHONPATH for the guard: where this `teller` was imported from comes first."""
    here = str(Path(__file__).resolve().parents[2])
    rest = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(p for p in (here, rest) if p)


def watch(tag: str, partial: Path | None, failed: Path | None) -> int:
    """Wait for the run to end; if it did not say `done`, sweep its tag and keep its partial case."""
    received = b""
    while chunk := os.read(0, 64):
        received += chunk
    if received == DONE:
        return 0
    leftovers = sweep_until_clean(tag)
    if partial is not None and failed is not None and partial.exists():
        import shutil

        shutil.rmtree(failed, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.replace(partial, failed)
    for item in leftovers:
        print(f"teller lab guard: could not remove {item}", file=sys.stderr)
    return 1 if leftovers else 0


def sweep_until_clean(tag: str, deadline_s: float = SWEEP_DEADLINE_S) -> list[str]:
    """Sweep `tag` (its run is dead, so no liveness check) until a sweep finds nothing left;
    what still could not be removed at the deadline."""
    from teller.lab.sweep import sweep

    deadline = time.monotonic() + deadline_s
    while True:
        swept = sweep(live=set(), tags={tag})
        if swept.removed == 0 and not swept.failed and not swept.killed:
            return []
        if time.monotonic() > deadline:
            return swept.failed
        time.sleep(_SWEEP_PAUSE_S)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe ends the watch
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    tag = argv[0]
    partial = Path(argv[1]) if len(argv) > 2 else None
    failed = Path(argv[2]) if len(argv) > 2 else None
    return watch(tag, partial, failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
