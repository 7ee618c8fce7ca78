"""Host counters of the traced processes: `host/rankN.jsonl`, as `teller collect` samples them.

One JSON object per line (`teller.collect.host.HostSample`): the wall-clock time of the sample
and cumulative counters in ns (CPU time, time runnable but waiting for a CPU, time the CPU
cgroup was throttled, memory stall time), major page faults, and whether the process was
stopped; -1 where the counter could not be read (no cgroup controller, no schedstat). A
counter is read back as its rises since the first sample (one that falls was reset). A run that
was killed leaves a cut-off last line: the samples before it are kept, with a warning.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from teller.errors import TellerError

#: The counters a sample holds, each cumulative since the process started.
COUNTERS = ("cpu_ns", "run_delay_ns", "throttled_ns", "memory_stall_ns", "major_faults")
#: Counters the kernel adds a stretch to when the stretch ends: a CPU quota's throttled time on
#: unthrottle, the time a task waited runnable when it next runs (`sched_info_arrive`). A rise of
#: d at a sample is time that ran up to it, not time spread since the sample before.
ADDED_WHEN_ENDED = frozenset({"throttled_ns", "run_delay_ns"})
_RANK_FILE = re.compile(r"^rank(\d+)\.jsonl$")


@dataclass(frozen=True)
class HostSeries:
    """One rank's samples, in time order; a counter that was never readable is all NaN."""

    rank: int
    path: Path
    t_ns: np.ndarray  # int64, wall clock
    counters: dict[str, np.ndarray]  # COUNTERS → float64, NaN where unreadable
    stopped_ns: np.ndarray  # float64, cumulative time seen stopped (state T) up to each sample

    def __len__(self) -> int:
        return len(self.t_ns)


def _cumulative(raw: list[float]) -> np.ndarray:
    """A counter as the sum of its rises since the first sample: a counter that falls was reset
    (the process moved to another cgroup, its quota group was removed), and the fall is not
    time given back. NaN where it was not readable."""
    values = np.array(raw, dtype=np.float64)
    values[values < 0] = np.nan
    rises = np.diff(values)
    rises = np.where(np.isnan(rises) | (rises < 0), 0.0, rises)
    out = np.concatenate([[0.0], np.cumsum(rises)]) if len(values) else values
    out[np.isnan(values)] = np.nan
    return out


def cumulative_at(name: str, t_ns: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Counter `name` (cumulative samples `values` at `t_ns`, NaN where unreadable) as it stood at
    the times `at`. Between samples a counter is taken to grow evenly, except the ones the kernel
    adds a stretch to when it ends (`ADDED_WHEN_ENDED`): a rise of d at a sample is placed on the
    d before that sample, so a throttled stretch that ended just after a step is that step's,
    not the next one's. Why it matters: a quota's throttled stretches are tens of ms, as long as
    a decode step; spread over the sample interval after them, they land on the wrong step."""
    known = ~np.isnan(values)
    t, v = t_ns[known].astype(np.float64), values[known]
    at = np.asarray(at, dtype=np.float64)
    if len(t) < 2:
        return np.full(at.shape, np.nan)
    if name not in ADDED_WHEN_ENDED:
        return np.interp(at, t, v)
    rises = np.diff(v)
    rose = rises > 0
    ends, lengths = t[1:][rose], rises[rose]
    begins = ends - lengths
    # accrued(x) = sum over stretches of clip(x - begin, 0, length)
    #            = sum_{begin < x} (x - begin) - sum_{end < x} (x - end)
    begins_sorted, ends_sorted = np.sort(begins), np.sort(ends)
    begun = np.searchsorted(begins_sorted, at, side="left")
    ended = np.searchsorted(ends_sorted, at, side="left")
    begun_sum = np.concatenate([[0.0], np.cumsum(begins_sorted)])[begun]
    ended_sum = np.concatenate([[0.0], np.cumsum(ends_sorted)])[ended]
    accrued = (begun * at - begun_sum) - (ended * at - ended_sum)
    return v[0] + accrued


def read_host_files(paths: list[Path]) -> tuple[list[HostSeries], list[str]]:
    """Every rank's series, and warnings about what was cut off or left out. The counters only
    sharpen a verdict the traces already give, so a file that cannot be read is left out with a
    warning naming it and what is wrong, and the run is analysed without it."""
    series, warnings = [], []
    for path in paths:
        match = _RANK_FILE.match(path.name)
        if match is None:
            warnings.append(f"{path}: not a rank's host counters (rankN.jsonl); left out")
            continue
        try:
            one, warning = read_host_file(path, int(match.group(1)))
        except TellerError as error:
            warnings.append(f"{error}; its host counters are left out")
            continue
        if warning:
            warnings.append(warning)
        if len(one) >= 2:
            series.append(one)
    return series, warnings


def read_host_file(path: Path, rank: int) -> tuple[HostSeries, str | None]:
    """One rank's samples; a `TellerError` naming the file and line when a line other than the
    last is not a sample, and a warning when the last one is cut off."""
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise TellerError(f"{path}: cannot read host counters: {error.strerror or error}") from None
    rows: list[dict] = []
    warning = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            sample = (int(row["t_ns"]), *(float(row[c]) for c in COUNTERS), bool(row["stopped"]))
        except (ValueError, KeyError, TypeError):
            if number == len(lines):
                warning = f"{path}: the last host sample (line {number}) is cut off; left out"
                break
            raise TellerError(
                f"{path}: line {number} is not a host sample (t_ns, {', '.join(COUNTERS)}, stopped)"
            ) from None
        rows.append(dict(zip(("t_ns", *COUNTERS, "stopped"), sample, strict=True)))
    rows.sort(key=lambda r: r["t_ns"])
    t_ns = np.array([r["t_ns"] for r in rows], dtype=np.int64)
    counters = {name: _cumulative([r[name] for r in rows]) for name in COUNTERS}
    stopped = np.array([r["stopped"] for r in rows], dtype=bool)
    # a process seen stopped at a sample is taken to stay stopped until the next one
    held = np.diff(t_ns).astype(np.float64) * stopped[:-1] if len(rows) > 1 else np.zeros(0)
    stopped_ns = np.concatenate([[0.0], np.cumsum(held)]) if len(rows) else np.zeros(0)
    return HostSeries(rank, path, t_ns, counters, stopped_ns), warning
