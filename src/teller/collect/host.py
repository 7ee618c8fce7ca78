"""Host counters of every traced process, sampled from outside it while the command runs.

A trace says that a rank's host work ran late, not why: a CPU quota, another process on its
core, page faults and a pause inside the process all stretch the same operators. The kernel
counts each of them per process, so the runner samples those counters beside the trace
(nothing runs inside the traced process, which may itself be the one stopped or throttled):

- CPU time used (`/proc/PID/stat` utime + stime) and major page faults (majflt);
- time spent runnable but waiting for a CPU (`/proc/PID/schedstat`, run_delay);
- time its CPU cgroup was throttled by its quota (`cpu.stat`: v2 throttled_usec, v1
  throttled_time) and, on cgroup v2, time its tasks stalled on memory (`memory.pressure`);
- whether it is stopped (state T, as SIGSTOP leaves it).

One JSON line per sample in `host/<pid>.jsonl`, cumulative counters in ns on the wall clock
(`time.time_ns`, the clock the traces are placed on); the runner renames each file after the
process's name (`rank0.jsonl`) when the command has exited. Processes are found through the
records the injected agents write in `procs/` at start-up.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

#: How often every traced process is sampled: a step of a few ms still gets several samples,
#: and one sample of a few processes costs well under a millisecond of the runner's CPU.
SAMPLE_INTERVAL_S = 0.01
#: How often `procs/` is looked at for new processes.
DISCOVER_INTERVAL_S = 0.2
_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")
_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class HostSample:
    """One reading of one process's counters (cumulative since it started; -1: not readable)."""

    t_ns: int
    cpu_ns: int
    run_delay_ns: int
    throttled_ns: int
    memory_stall_ns: int
    major_faults: int
    stopped: bool


@dataclass(frozen=True)
class _Sources:
    """Where one process's counters are read from, found once when it is first seen."""

    pid: int
    cpu_stat: Path | None  # its CPU cgroup's cpu.stat
    cgroup_v2: bool
    memory_pressure: Path | None  # its cgroup's memory.pressure (v2 only)


def read_sample(sources: _Sources) -> HostSample | None:
    """The process's counters now; None once it has exited."""
    pid = sources.pid
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ")"
    fields = stat[stat.rindex(")") + 2 :].split()
    state = fields[0]
    major_faults = int(fields[9])
    cpu_ns = int((int(fields[11]) + int(fields[12])) * _TICK_NS)
    run_delay_ns = -1
    with contextlib.suppress(OSError, ValueError, IndexError):
        run_delay_ns = int(Path(f"/proc/{pid}/schedstat").read_text().split()[1])
    return HostSample(
        t_ns=time.time_ns(),
        cpu_ns=cpu_ns,
        run_delay_ns=run_delay_ns,
        throttled_ns=_throttled_ns(sources),
        memory_stall_ns=_memory_stall_ns(sources.memory_pressure),
        major_faults=major_faults,
        stopped=state in ("T", "t"),
    )


def _throttled_ns(sources: _Sources) -> int:
    if sources.cpu_stat is None:
        return -1
    try:
        counters = dict(
            line.split() for line in sources.cpu_stat.read_text().splitlines() if " " in line
        )
    except (OSError, ValueError):
        return -1
    if sources.cgroup_v2 and "throttled_usec" in counters:
        return int(counters["throttled_usec"]) * 1000
    if "throttled_time" in counters:  # v1 counts ns
        return int(counters["throttled_time"])
    return -1


def _memory_stall_ns(path: Path | None) -> int:
    """The cgroup's "some" memory stall total (µs in the file)."""
    if path is None:
        return -1
    try:
        for line in path.read_text().splitlines():
            if line.startswith("some "):
                total = dict(part.split("=") for part in line.split()[1:])["total"]
                return int(total) * 1000
    except (OSError, ValueError, KeyError):
        return -1
    return -1


def sources_of(pid: int) -> _Sources:
    """Find the process's CPU cgroup (v2 unified or v1 cpu controller) from /proc/PID/cgroup."""
    cpu_stat = memory_pressure = None
    v2 = False
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "" and (_CGROUP_ROOT / "cgroup.controllers").exists():
            group = _CGROUP_ROOT / relative
            if (group / "cpu.stat").exists():
                cpu_stat, v2 = group / "cpu.stat", True
            if (group / "memory.pressure").exists():
                memory_pressure = group / "memory.pressure"
        elif "cpu" in controllers.split(","):
            group = _CGROUP_ROOT / controllers / relative
            if (group / "cpu.stat").exists():
                cpu_stat = group / "cpu.stat"
    return _Sources(pid, cpu_stat, v2, memory_pressure)


class HostSampler:
    """Samples every process that registers in `procs/` into `host/<pid>.jsonl`, on a thread of
    the runner, until `stop`. A rank moved into another cgroup after it started (the lab's
    per-rank groups) is followed: its cgroup is looked up again at every discovery."""

    def __init__(self, procs_dir: Path, host_dir: Path, interval_s: float = SAMPLE_INTERVAL_S):
        self.procs_dir = Path(procs_dir)
        self.host_dir = Path(host_dir)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._sources: dict[int, _Sources] = {}
        self._files: dict[int, object] = {}
        self._gone: set[int] = set()
        self._thread = threading.Thread(target=self._run, name="teller-host-sampler", daemon=True)

    def start(self) -> None:
        self.host_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for handle in self._files.values():
            handle.close()  # type: ignore[attr-defined]
        self._files.clear()

    def _run(self) -> None:
        next_discovery = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_discovery:
                self._discover()
                next_discovery = now + DISCOVER_INTERVAL_S
            for pid, sources in list(self._sources.items()):
                sample = read_sample(sources)
                if sample is None:
                    self._gone.add(pid)
                    del self._sources[pid]
                    continue
                self._write(pid, sample)
            self._stop.wait(self.interval_s)

    def _discover(self) -> None:
        for path in self.procs_dir.glob("*.json"):
            try:
                pid = int(path.stem)
            except ValueError:
                continue
            if pid not in self._gone:
                self._sources[pid] = sources_of(pid)

    def _write(self, pid: int, sample: HostSample) -> None:
        handle = self._files.get(pid)
        if handle is None:
            handle = self._files[pid] = open(self.host_dir / f"{pid}.jsonl", "a")  # noqa: SIM115
        handle.write(_line(sample))  # type: ignore[attr-defined]
        handle.flush()  # type: ignore[attr-defined]


def name_host_files(host_dir: Path, records: list[dict]) -> None:
    """Rename `host/<pid>.jsonl` after each process's name (`rank0.jsonl`), as its trace is."""
    for record in records:
        source = host_dir / f"{record['pid']}.jsonl"
        name = record.get("name")
        if source.exists() and name:
            os.replace(source, host_dir / f"{name}.jsonl")


class ProcessSampler:
    """One process's counters sampled on a thread until `stop`, kept in memory and written as
    one `host/` file: what an engine's own profiler runs beside a capture (`teller lab serve`
    between `/start_profile` and `/stop_profile`), where no runner is outside it. Sampling from
    inside sees a CPU quota, a co-tenant's run-queue wait and page faults (the counters are the
    kernel's), not a stop: a stopped process samples nothing."""

    def __init__(self, pid: int, interval_s: float = SAMPLE_INTERVAL_S):
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[HostSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="teller-self-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[HostSample]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        return self.samples

    def _run(self) -> None:
        sources = sources_of(self.pid)
        while not self._stop.is_set():
            sample = read_sample(sources)
            if sample is None:
                return
            self.samples.append(sample)
            self._stop.wait(self.interval_s)


def write_samples(samples: list[HostSample], path: Path) -> None:
    """`samples` as a `host/` file, appearing whole (written aside, then renamed)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with partial.open("w") as handle:
        handle.writelines(_line(sample) for sample in samples)
    os.replace(partial, path)


def _line(sample: HostSample) -> str:
    """One sample as its `host/` file line."""
    return json.dumps(asdict(sample)) + "\n"
