"""Run a command with the profiler injected from outside it, and gather what it left behind.

The command is not edited. Its environment gets `inject/` prepended to PYTHONPATH (so every Python
process it starts runs our `sitecustomize`) and TELLER_COLLECT_* variables that tell the agent where
to write. The runner itself only starts the command in its own process group, forwards Ctrl-C /
SIGTERM / SIGHUP to that group, copies the command's console to `logs/launcher.log` (passing it
through to our stdout/stderr unchanged), samples the traced processes' host counters into `host/`
(`teller.collect.host`), waits, and writes `manifest.json`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from teller.collect.host import HostSampler, name_host_files
from teller.collect.inject import _teller_collect_agent as agent
from teller.collect.inject._teller_collect_tee import tee
from teller.collect.manifest import (
    Manifest,
    ranks_from_records,
    read_process_records,
    write_manifest,
)
from teller.errors import TellerError
from teller.layout import CaseDir

INJECT_DIR = Path(__file__).resolve().parent / "inject"
BACKENDS = ("torch", "nsys")
#: After the command exits, how long to keep reading output that its orphans still write.
DRAIN_TIMEOUT_S = 10.0
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class CollectError(TellerError):
    """The collection could not start (bad arguments, missing tool, occupied output folder)."""


@dataclass
class CollectResult:
    exit_code: int
    out_dir: Path
    traces: list[Path]
    logs: list[Path]
    manifest: Path


def collect(
    command: list[str],
    out_dir: Path,
    steps: tuple[int, int] | None = None,
    env: dict[str, str] | None = None,
    backend: str = "torch",
) -> CollectResult:
    """Run `command` under collection into `out_dir`; returns the command's exit status and files.

    `steps=(A, B)` profiles only steps A..B of each process (0-based, inclusive; see
    `StepWindow`). `env` adds to (and overrides) the inherited environment. `backend="nsys"` wraps
    the command in Nsight Systems instead of injecting torch.profiler (logs and manifest as usual).
    A command killed by signal N exits 128+N, as in a shell.
    """
    out_dir = Path(out_dir)
    command = [str(part) for part in command]
    _check_arguments(command, out_dir, steps, backend)
    child_env = _child_env(out_dir, steps, env, backend)
    _check_step_regex(child_env.get(agent.ENV_STEP_REGEX))
    case = CaseDir(out_dir)
    for folder in (case.traces, case.logs, out_dir / "procs"):
        folder.mkdir(parents=True, exist_ok=True)
    argv = nsys_command(command, out_dir) if backend == "nsys" else command
    launcher_log = case.logs / "launcher.log"
    _status(f"collecting into {out_dir}: {' '.join(command)}")
    start_wall_ns = time.time_ns()
    sampler = HostSampler(out_dir / "procs", case.host)
    sampler.start()
    try:
        with _interrupt_reaches_the_command():
            child = subprocess.Popen(
                argv,
                env=child_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                process_group=0,
            )
    except OSError as error:
        sampler.stop()
        raise CollectError(f"cannot start {argv[0]!r}: {error.strerror or error}") from None
    reader = threading.Thread(
        target=tee,
        args=(
            [
                (child.stdout.fileno(), _console_fd(sys.stdout, 1)),
                (child.stderr.fileno(), _console_fd(sys.stderr, 2)),
            ],
            str(launcher_log),
        ),
        name="teller-collect-launcher-log",
        daemon=True,
    )
    reader.start()
    with _forward_signals(child) as forwarded_at:
        try:
            returncode = _wait_escalating(child, forwarded_at)
        finally:
            sampler.stop()
    reader.join(DRAIN_TIMEOUT_S)
    end_wall_ns = time.time_ns()
    notes = []
    if reader.is_alive():
        notes.append(
            f"launcher output still open {DRAIN_TIMEOUT_S:.0f} s after the command exited "
            "(a background child holds it); log may be incomplete"
        )
    exit_code = returncode if returncode >= 0 else 128 - returncode
    if backend == "nsys":
        notes.extend(_export_nsys(out_dir))
    manifest_path = case.manifest
    records = read_process_records(out_dir / "procs", out_dir)
    name_host_files(case.host, records)
    manifest = Manifest(
        command=command,
        cwd=os.getcwd(),
        backend=backend,
        steps=list(steps) if steps else None,
        start_wall_ns=start_wall_ns,
        end_wall_ns=end_wall_ns,
        exit_code=exit_code,
        launcher_log=os.path.relpath(launcher_log, out_dir),
        hosts=sorted({socket.gethostname(), *(r["host"] for r in records)}),
        ranks=ranks_from_records(records),
        processes=records,
        notes=notes
        + [f"{r['name']}: {r['trace_note']}" for r in records if r.get("trace_note")]
        + _lost_traces(records, backend),
    )
    write_manifest(manifest, manifest_path)
    traces = sorted(p for p in case.traces.iterdir() if not p.name.startswith("."))
    logs = case.log_files()
    _status(f"exit {exit_code}; {len(traces)} trace(s), {len(logs)} log(s); {manifest_path}")
    return CollectResult(exit_code, out_dir, traces, logs, manifest_path)


def _lost_traces(records: list[dict], backend: str) -> list[str]:
    """Name every process that died before its agent could export, and say why nothing is left.

    SIGKILL, a native crash (SIGSEGV, abort) or `os._exit` end a process without running any
    Python code, so the profiler's buffer dies with it; the record the agent wrote at start-up is
    all that remains. Saying so keeps a missing trace from reading like a process that never ran.
    """
    if backend != "torch":
        return []
    lost = []
    for record in records:
        if record.get("finished") or record.get("trace"):
            continue
        message = (
            f"{record['name']}: no trace: the process ended without exporting (killed by SIGKILL, "
            "a native crash such as SIGSEGV or abort, or os._exit); what it ran is lost"
        )
        _status(f"warning: {message}")
        lost.append(message)
    return lost


def _check_arguments(
    command: list[str], out_dir: Path, steps: tuple[int, int] | None, backend: str
) -> None:
    if not command:
        raise CollectError("no command to run (put it after `--`)")
    if backend not in BACKENDS:
        raise CollectError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "nsys" and shutil.which("nsys") is None:
        raise CollectError("--backend nsys: `nsys` (Nsight Systems) is not on PATH")
    if steps is not None:
        first, last = steps
        if first < 0 or last < first:
            raise CollectError(f"steps {first}:{last}: need 0 <= A <= B")
    if CaseDir(out_dir).manifest.exists() or any(CaseDir(out_dir).traces.glob("*")):
        raise CollectError(f"{out_dir}: already holds a collection; choose a new --out folder")


def _check_step_regex(pattern: str | None) -> None:
    """Fail here, not silently inside every rank, on a step regex that does not compile."""
    if pattern is None:
        return
    try:
        re.compile(pattern)
    except re.error as error:
        raise CollectError(f"step regex {pattern!r}: {error}") from None


def _child_env(
    out_dir: Path, steps: tuple[int, int] | None, env: dict[str, str] | None, backend: str
) -> dict[str, str]:
    child_env = dict(os.environ)
    child_env.update(env or {})
    python_path = child_env.get("PYTHONPATH", "")
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(INJECT_DIR), python_path) if p)
    child_env[agent.ENV_DIR] = str(out_dir.resolve())
    child_env[agent.ENV_PROFILE] = "nvtx" if backend == "nsys" else "torch"
    if steps is not None:
        child_env[agent.ENV_STEPS] = f"{steps[0]}:{steps[1]}"
    else:
        child_env.pop(agent.ENV_STEPS, None)
    return child_env


def nsys_command(command: list[str], out_dir: Path) -> list[str]:
    """The Nsight Systems command line that wraps `command` (CUDA, NVTX and OS-runtime tracing)."""
    return [
        "nsys",
        "profile",
        "-t",
        "cuda,nvtx,osrt",
        "--force-overwrite",
        "true",
        "-o",
        str(out_dir / "traces" / "nsys"),
        *command,
    ]


def nsys_export_command(out_dir: Path) -> list[str]:
    report = out_dir / "traces" / "nsys.nsys-rep"
    return [
        "nsys",
        "export",
        "--type",
        "sqlite",
        "--force-overwrite",
        "true",
        "--output",
        str(out_dir / "traces" / "nsys.sqlite"),
        str(report),
    ]


def _export_nsys(out_dir: Path) -> list[str]:
    if not (out_dir / "traces" / "nsys.nsys-rep").exists():
        return ["nsys wrote no report (nsys.nsys-rep missing)"]
    done = subprocess.run(nsys_export_command(out_dir), capture_output=True, text=True)
    if done.returncode != 0:
        return [f"nsys export failed ({done.returncode}): {done.stderr.strip()[-500:]}"]
    return []


#: After a forwarded Ctrl-C/SIGTERM, how long the command may take to write its traces and exit
#: before it gets SIGTERM, and then SIGKILL (a target that swallows SIGINT must not run forever).
ESCALATE_AFTER_S = 90.0


def _wait_escalating(child: subprocess.Popen, forwarded_at: list[float]) -> int:
    escalated: list[int] = []
    while True:
        try:
            return child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        if not forwarded_at:
            continue
        waited = time.monotonic() - forwarded_at[0]
        step = int(waited // ESCALATE_AFTER_S)
        if step >= 1 and len(escalated) < min(step, 2):
            number = signal.SIGTERM if not escalated else signal.SIGKILL
            _status(
                f"the command did not exit {waited:.0f} s after the signal: sending {number.name}"
            )
            escalated.append(number)
            with suppress(ProcessLookupError):
                os.killpg(child.pid, number)


@contextmanager
def _interrupt_reaches_the_command():
    """Start the command with SIGINT at its default action even where we were started ignoring it.

    A shell without job control starts background commands with SIGINT ignored, and an ignored
    signal stays ignored across exec: the command (and Python's KeyboardInterrupt in it) would never
    see the SIGINT this runner forwards, and would run on until the SIGTERM that follows. A signal
    with a handler is reset to its default action by exec, so a handler is set for the spawn."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def _forward_signals(child: subprocess.Popen):
    """Pass Ctrl-C / SIGTERM / SIGHUP to the command's process group, then keep waiting for it."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return

    forwarded_at: list[float] = []

    def forward(number: int, frame) -> None:
        _status(f"forwarding {signal.Signals(number).name} to the command; waiting for it")
        forwarded_at.append(time.monotonic())
        with suppress(ProcessLookupError):
            os.killpg(child.pid, number)

    previous = {number: signal.signal(number, forward) for number in _FORWARDED_SIGNALS}
    try:
        yield forwarded_at
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _console_fd(stream, default: int) -> int:
    try:
        stream.flush()
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return default


def _status(message: str) -> None:
    print(f"teller collect: {message}", file=sys.stderr, flush=True)
