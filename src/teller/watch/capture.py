"""One capture: the engine's profiler on for a few seconds, its traces and log lines gathered.

The rank traces are the files that appear in the engine's profile folder during the capture
(moved out of it, so that folder does not grow with every capture); the logs are the bytes each
engine log file gained meanwhile, and host counters the engine wrote beside its traces (the lab
engine's `*.host.jsonl`) are appended to each rank's series. Everything lands under
`dest/traces/`, `dest/logs/` and `dest/host/`, the case layout `teller analyze` reads
(`teller.layout`).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from teller.layout import CaseDir
from teller.watch.profiler import CaptureError, EngineProfiler

#: Trace files an engine's profiler writes (torch's tensorboard handler, Kineto JSON).
TRACE_SUFFIXES = (".json", ".json.gz")
#: Host counters an engine writes beside a rank's trace (`teller lab serve` does).
_HOST_FILE = re.compile(r"^[^.].*rank-(\d+)\..*\.host\.jsonl$")
#: A trace is taken once no file in the folder has changed for this long: vLLM's handler writes
#: its files in place, so a size that still moves is a file still being written.
SETTLE_S = 2.0
#: How long after the stop answered the traces may take to appear.
TRACE_WAIT_S = 120.0
_POLL_S = 0.25


@dataclass
class Capture:
    """What one capture gathered, and the wall-clock interval the profiler was on."""

    start_wall_ns: int  # just before the start was asked for
    end_wall_ns: int  # when the stop was asked for (the export takes longer)
    traces: list[Path]
    logs: list[Path]


def capture(
    profiler: EngineProfiler,
    profile_dir: Path,
    log_files: list[Path],
    duration_s: float,
    dest: Path,
    trace_prefix: str = "",
) -> Capture:
    """Profile the engine for `duration_s` and gather the capture into `dest` (CaptureError when
    the engine refused or wrote nothing). On any exit the profiler is asked to stop."""
    before = _trace_files(profile_dir)
    before_host = _host_files(profile_dir)
    offsets = {path: _size(path) for path in log_files}
    start_wall_ns = time.time_ns()
    profiler.start()
    try:
        wait_while_profiling(duration_s)
    except BaseException:  # interrupted: leave the engine as it was, and say why we stopped
        with contextlib.suppress(CaptureError):
            profiler.stop()
        raise
    end_wall_ns = time.time_ns()
    profiler.stop()
    traces = _wait_for_new_traces(profile_dir, before)
    case = CaseDir(dest)
    case.traces.mkdir(parents=True, exist_ok=True)
    moved = []
    for path in traces:
        target = case.traces / f"{trace_prefix}{path.name}"
        shutil.move(str(path), target)
        moved.append(target)
    logs = [_copy_tail(path, offsets[path], case.logs, trace_prefix) for path in log_files]
    _gather_host(profile_dir, before_host, case)
    return Capture(start_wall_ns, end_wall_ns, moved, [p for p in logs if p is not None])


def _host_files(folder: Path) -> set[Path]:
    if not folder.is_dir():
        return set()
    return {p for p in folder.iterdir() if p.is_file() and _HOST_FILE.match(p.name)}


def _gather_host(profile_dir: Path, before: set[Path], case: CaseDir) -> None:
    """Host counters the engine wrote beside this capture's traces (the lab engine does; vLLM
    does not), appended to the case's `host/rankN.jsonl`: a reference capture and the incident's
    land in one series per rank."""
    for path in sorted(_host_files(profile_dir) - before):
        rank = _HOST_FILE.match(path.name).group(1)  # type: ignore[union-attr]
        case.host.mkdir(parents=True, exist_ok=True)
        with (case.host / f"rank{rank}.jsonl").open("ab") as target:
            target.write(path.read_bytes())
        path.unlink(missing_ok=True)


def wait_while_profiling(duration_s: float) -> None:
    """The capture itself: the engine runs, profiled, while the watcher waits."""
    time.sleep(duration_s)


def _trace_files(folder: Path) -> dict[Path, int]:
    if not folder.is_dir():
        return {}
    return {
        path: _size(path)
        for path in folder.iterdir()
        if path.is_file() and not path.name.startswith(".") and path.name.endswith(TRACE_SUFFIXES)
    }


def _wait_for_new_traces(folder: Path, before: dict[Path, int]) -> list[Path]:
    deadline = time.monotonic() + TRACE_WAIT_S
    seen: dict[Path, int] = {}
    steady_since = time.monotonic()
    while True:
        now = {p: s for p, s in _trace_files(folder).items() if p not in before}
        if now != seen:
            seen, steady_since = now, time.monotonic()
        elif seen and time.monotonic() - steady_since >= SETTLE_S:
            return sorted(seen)
        if time.monotonic() > deadline:
            raise CaptureError(
                f"{folder}: no trace appeared within {TRACE_WAIT_S:.0f} s of the stop; is it the "
                "engine's profile folder (VLLM_TORCH_PROFILER_DIR)?"
            )
        time.sleep(_POLL_S)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _copy_tail(path: Path, offset: int, logs_dir: Path, prefix: str) -> Path | None:
    """The bytes `path` gained since `offset` (all of it if it was rotated meanwhile)."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(offset if size >= offset else 0)
            data = handle.read()
    except OSError:
        return None
    if not data:
        return None
    logs_dir.mkdir(parents=True, exist_ok=True)
    name = path.name if path.suffix == ".log" else f"{path.name}.log"
    target = logs_dir / f"{prefix}{name}"
    target.write_bytes(data)
    return target
