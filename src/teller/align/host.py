"""Host counters placed on the tree's steps: what each counter added over a step, on its rank.

The counters are sampled on the host's wall clock (`teller.ingest.host`), the clock each rank's
trace was recorded on; the tree may have moved a rank onto the reference rank's clock
(`teller.align.clock`), so a step's window is moved back by that rank's offset before the
counters are read at its ends (`teller.ingest.host.cumulative_at`: between samples, which are
10 ms apart, linear, or for the times the kernel adds when they end, placed before the sample that
shows them). A step outside
the sampled span, or a counter the host could not read, is NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from teller.align.clock import ClockOffsets
from teller.callchain.tree import CallTree
from teller.ingest.host import COUNTERS, HostSeries, cumulative_at, read_host_files

#: What a step is measured by: the sampled counters and the time the process was seen stopped.
MEASURES = (*COUNTERS, "stopped_ns")


@dataclass(frozen=True)
class HostSteps:
    """Per step row of the tree, what each measure added over the step on its rank."""

    added: dict[str, np.ndarray]  # MEASURES → float64 per step row, NaN where unknown
    ranks: frozenset[int]  # the ranks with host counters


def host_steps(
    tree: CallTree, series: list[HostSeries], offsets: ClockOffsets | None = None
) -> HostSteps:
    steps = tree.steps
    correction = {}
    if offsets is not None:
        correction = dict(zip(offsets.rank.tolist(), offsets.offset_ns.tolist(), strict=True))
    added = {name: np.full(len(steps), np.nan) for name in MEASURES}
    by_rank = {s.rank: s for s in series}
    for rank, one in by_rank.items():
        rows = np.flatnonzero(steps.rank == rank)
        if not len(rows):
            continue
        start = steps.start_ns[rows].astype(np.int64) + int(correction.get(rank, 0))
        end = start + steps.dur_ns[rows].astype(np.int64)
        inside = (start >= one.t_ns[0]) & (end <= one.t_ns[-1])
        rows, start, end = rows[inside], start[inside], end[inside]
        if not len(rows):
            continue
        cumulative = {**one.counters, "stopped_ns": one.stopped_ns}
        for name, values in cumulative.items():
            if (~np.isnan(values)).sum() < 2:
                continue
            at = cumulative_at(name, one.t_ns, values, np.concatenate([start, end]))
            added[name][rows] = np.maximum(at[len(start) :] - at[: len(start)], 0.0)
    return HostSteps(added, frozenset(by_rank))


def read_host_steps(
    tree: CallTree, files: list[Path], offsets: ClockOffsets | None = None
) -> tuple[HostSteps | None, list[str]]:
    """The host counters in `files` (`teller collect`'s DIR/host/rankN.jsonl) over `tree`'s
    steps, with what the files could not give; None where they hold no series."""
    series, warnings = read_host_files(files)
    return (host_steps(tree, series, offsets) if series else None), warnings
