"""One step's collectives rank by rank: when each rank arrived, how long it waited for the last
one, and what it ran between them. The HTML report draws this as a Gantt chart and a table.

A collective ends on every rank together, once the last rank has arrived: the time an early rank
spends inside it before then is waiting, not transfer. Laid out per rank on one clock, the
straggler is the row whose collectives start last and wait least. The rows come from the run's
`Arrivals` (computed once, for the localizer), sliced to one step; nothing else is scanned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from teller.callchain.facts import Arrivals
from teller.callchain.tree import CallTree

#: What a stretch of a rank's step was spent on, in the order a legend lists them.
WORK = "compute and other work"
WAITING = "collective: waiting for the last rank"
TRANSFER = "collective: after the last rank arrived"
ALONE = "collective (no peer recorded)"
PARTS = (WORK, WAITING, TRANSFER, ALONE)


@dataclass(frozen=True)
class CollectiveVisit:
    """One rank's time inside one collective instance."""

    rank: int
    instance: int
    name: str
    start_ns: int
    end_ns: int
    #: from this rank's arrival to the last rank's, within the collective's own time
    wait_ns: int
    is_last: bool  # this rank arrived last (where at least two ranks ran the instance)
    peers: int  # ranks that ran the instance, this one included


@dataclass(frozen=True)
class Segment:
    """A stretch of one rank's step: `part` is one of `PARTS`; `visit` the collective, if any."""

    rank: int
    part: str
    start_ns: int
    end_ns: int
    visit: CollectiveVisit | None = None


@dataclass(frozen=True)
class StepCollectives:
    """The collectives of one step on every rank that ran it, and each rank's step window."""

    step: int
    windows: dict[int, tuple[int, int]]  # rank -> (start, end) of its step, ns
    visits: list[CollectiveVisit]  # by instance (first reached first), then by arrival

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self.windows) | {v.rank for v in self.visits})

    @property
    def origin_ns(self) -> int:
        """The earliest moment of the step on any rank: zero on the chart's time axis."""
        starts = [start for start, _ in self.windows.values()]
        starts += [v.start_ns for v in self.visits]
        return min(starts)

    @property
    def shared(self) -> bool:
        """Whether any collective was seen on two ranks or more (else waits are unknowable)."""
        return any(v.peers > 1 for v in self.visits)

    def instances(self) -> list[list[CollectiveVisit]]:
        """The visits grouped by collective instance, in the order ranks first reached them."""
        groups: dict[int, list[CollectiveVisit]] = {}
        for visit in self.visits:
            groups.setdefault(visit.instance, []).append(visit)
        return list(groups.values())

    def last_arrivals(self) -> dict[int, int]:
        """rank -> how many of the step's shared collectives it reached last."""
        counts = dict.fromkeys(self.ranks, 0)
        for visit in self.visits:
            if visit.is_last:
                counts[visit.rank] += 1
        return counts

    def segments(self) -> list[Segment]:
        """Each rank's step cut into work between collectives, and each collective split into
        its wait for the last rank and the rest."""
        out: list[Segment] = []
        for rank in self.ranks:
            mine = sorted((v for v in self.visits if v.rank == rank), key=lambda v: v.start_ns)
            start, end = self.windows.get(
                rank, (min(v.start_ns for v in mine), max(v.end_ns for v in mine))
            )
            cursor = start
            for visit in mine:
                if visit.start_ns > cursor:
                    out.append(Segment(rank, WORK, cursor, visit.start_ns))
                out.extend(_visit_segments(visit))
                cursor = max(cursor, visit.end_ns)
            if end > cursor:
                out.append(Segment(rank, WORK, cursor, end))
        return out


def _visit_segments(visit: CollectiveVisit) -> list[Segment]:
    if visit.peers < 2:
        return [Segment(visit.rank, ALONE, visit.start_ns, visit.end_ns, visit)]
    waited = visit.start_ns + visit.wait_ns
    parts = [(WAITING, visit.start_ns, waited), (TRANSFER, waited, visit.end_ns)]
    return [
        Segment(visit.rank, part, start, end, visit) for part, start, end in parts if end > start
    ]


def step_collectives(tree: CallTree, arrivals: Arrivals | None, step: int) -> StepCollectives:
    """The collectives of iteration `step` on every rank (`arrivals`: the run's, from
    `RunFacts.arrivals`), with each rank's step window from the step table."""
    steps = tree.steps
    windows = {
        int(rank): (int(start), int(start + dur))
        for rank, index, start, dur in zip(
            steps.rank, steps.index, steps.start_ns, steps.dur_ns, strict=True
        )
        if index == step
    }
    if arrivals is None or not len(arrivals):
        return StepCollectives(step, windows, [])
    rows = np.flatnonzero(arrivals.iteration == step)
    instance = arrivals.instance[rows]
    start = arrivals.start_ns[rows]
    end = arrivals.end_ns[rows]
    visits = []
    for group in _by_instance(instance, start):
        last_start = int(start[group].max())
        for k in group.tolist():
            row = int(rows[k])
            own = int(end[k] - start[k])
            visits.append(
                CollectiveVisit(
                    rank=int(arrivals.rank[row]),
                    instance=int(instance[k]),
                    name=tree.names[int(arrivals.name[row])],
                    start_ns=int(start[k]),
                    end_ns=int(end[k]),
                    wait_ns=min(own, max(0, last_start - int(start[k]))),
                    is_last=bool(arrivals.is_last[row]),
                    peers=len(group),
                )
            )
    return StepCollectives(step, windows, visits)


def _by_instance(instance: np.ndarray, start: np.ndarray) -> list[np.ndarray]:
    """Positions grouped by instance, groups in order of first arrival, ranks by arrival."""
    order = np.lexsort((start, instance))
    bounds = np.flatnonzero(np.diff(instance[order])) + 1
    groups = np.split(order, bounds) if len(order) else []
    return sorted(groups, key=lambda g: int(start[g].min()))
