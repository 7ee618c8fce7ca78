"""One clock: per-rank offsets from collectives (and log↔trace anchors), applied to event tables.

Each rank's trace is stamped by its own host's clock, and hosts disagree by micro- to milliseconds,
which is as long as the operators being compared. Collectives give a free reference: every rank of
a group leaves a synchronising collective (allreduce, allgather, alltoall, reduce-scatter, barrier)
at nearly the same instant, because none can finish before the last one arrives. So the difference
of end times between a rank and a reference rank, over many instances, is that rank's clock offset
plus noise.

The noise is not symmetric around zero per instance: whichever rank waited has to be woken, so it
leaves late. Over a run both ranks take turns waiting, and the end differences form two modes either
side of the true offset; the median lands in whichever mode has more samples, the midhinge (mean of
the quartiles) sits between them. The estimate is that midhinge; the residual reported is half the
interquartile range of the differences, i.e. how far a typical instance sits from it.

Only instances that mark *completion* are used: the GPU-stream comm kernels when the trace has
them, else host comm work that is not an asynchronous enqueue (`c10d::…`, `record_param_comms` and
`nccl:…` return as soon as the work is queued; gloo's `gloo:…` ranges run until it completes).
Ranks that share no instance with the reference are reached through ranks that do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from teller.callchain.tree import CallTree
from teller.ingest.schema import EventTable

#: Collectives every member leaves together (one-to-many kinds like broadcast let the root leave
#: before the others arrive, so their end times do not synchronise).
SYNCHRONISING_KINDS: frozenset[str] = frozenset(
    {"allreduce", "allgather", "alltoall", "reduce_scatter", "barrier"}
)
#: Host ops whose range ends when the collective is queued, not when it completes.
ASYNC_ENQUEUE = re.compile(r"^(?:c10d::|record_param_comms$|nccl:)")
#: Fewer joined instances than this and the offset is reported but flagged.
MIN_INSTANCES = 5
#: Residuals above this mean the instances were probably mis-joined (sampled or partial traces).
SUSPECT_RESIDUAL_NS = 1_000_000


@dataclass
class ClockOffsets:
    """Per-rank clock offsets against a reference rank: subtract `offset_ns` to get its clock.

    `method` says where each offset came from: "reference", "collectives", "group reference" (the
    lowest rank of a group that shares no collective with the reference: another engine replica,
    whose ranks are aligned to it), or "none" (no shared instance; offset 0). `residual_ns` is half the interquartile range of the per-instance
    differences after correction; `instances` how many joined instances the estimate used.
    """

    reference_rank: int
    rank: np.ndarray
    offset_ns: np.ndarray
    residual_ns: np.ndarray
    instances: np.ndarray
    method: list[str]
    warnings: list[str] = field(default_factory=list)

    def offset_of(self, rank: int) -> int:
        hits = np.flatnonzero(self.rank == rank)
        return int(self.offset_ns[hits[0]]) if len(hits) else 0

    def to_arrow(self) -> pa.Table:
        return pa.table(
            {
                "rank": self.rank,
                "offset_ns": self.offset_ns,
                "residual_ns": self.residual_ns,
                "instances": self.instances,
                "method": self.method,
            }
        )


def estimate_rank_offsets(tree: CallTree, reference_rank: int | None = None) -> ClockOffsets:
    """Clock offset of every rank in `tree` against `reference_rank` (default: the lowest)."""
    comm = tree.comm
    ranks = sorted({int(r) for r in np.unique(tree.rank)})
    if reference_rank is None:
        reference_rank = ranks[0] if ranks else 0
    warnings: list[str] = []
    rows, ends = _completion_ends(tree, warnings)
    by_instance: dict[int, dict[int, int]] = {}
    for i, end in zip(rows.tolist(), ends.tolist(), strict=True):
        by_instance.setdefault(int(comm.instance[i]), {})[int(comm.rank[i])] = end
    shared = [ends for ends in by_instance.values() if len(ends) > 1]

    known: dict[int, tuple[int, int, int, str]] = {reference_rank: (0, 0, 0, "reference")}
    _propagate(shared, known, warnings)
    in_collectives = sorted({r for ends in shared for r in ends})
    apart = [r for r in in_collectives if r not in known]
    while True:  # another engine replica or process group: its ranks aligned among themselves
        anchor = min((r for r in in_collectives if r not in known), default=None)
        if anchor is None:
            break
        known[anchor] = (0, 0, 0, "group reference")
        _propagate(shared, known, warnings)
    if apart:
        warnings.append(
            f"ranks {_listed(apart)} share no collective with rank {reference_rank} (another "
            "engine replica or process group): their clocks are aligned among themselves, "
            f"not to rank {reference_rank}'s"
        )
    alone = [r for r in ranks if r not in known]
    for r in alone:
        known[r] = (0, 0, 0, "none")
    if alone:
        warnings.append(f"ranks {_listed(alone)} share no collective with any rank: offset 0")
    order = sorted(known)
    return ClockOffsets(
        reference_rank=reference_rank,
        rank=np.asarray(order, dtype=np.int32),
        offset_ns=np.asarray([known[r][0] for r in order], dtype=np.int64),
        residual_ns=np.asarray([known[r][1] for r in order], dtype=np.int64),
        instances=np.asarray([known[r][2] for r in order], dtype=np.int64),
        method=[known[r][3] for r in order],
        warnings=warnings,
    )


def _propagate(
    shared: list[dict[int, int]],
    known: dict[int, tuple[int, int, int, str]],
    warnings: list[str],
) -> None:
    """Extend `known` offsets to every rank that meets a known one at collective instances,
    nearest first (a rank two hops away is placed through the one between)."""
    while True:
        samples: dict[int, list[int]] = {}
        for ends in shared:
            anchor = min((r for r in ends if r in known), default=None)
            if anchor is None:
                continue
            anchor_end = ends[anchor] - known[anchor][0]
            for r, end in ends.items():
                if r not in known:
                    samples.setdefault(r, []).append(end - anchor_end)
        if not samples:
            return
        for r, values in samples.items():
            offset, residual = midhinge(np.asarray(values, dtype=np.int64))
            known[r] = (offset, residual, len(values), "collectives")
            if len(values) < MIN_INSTANCES:
                warnings.append(f"rank {r}: offset from only {len(values)} collective instances")
            if residual > SUSPECT_RESIDUAL_NS:
                warnings.append(
                    f"rank {r}: collective end times disagree by ±{residual / 1e6:.1f} ms around "
                    "the offset; instances are probably mis-joined (sampled or partial traces)"
                )


def _listed(ranks: list[int]) -> str:
    """Ranks as a person reads them: consecutive ones as a range (0–3, 8, 12–15)."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(f"{start}–{r}" if r > start else f"{r}")
            start = None
    return ", ".join(parts)


def midhinge(values: np.ndarray) -> tuple[int, int]:
    """(mean of the quartiles, half the interquartile range), rounded to ns."""
    q25, q75 = np.percentile(values, [25, 75])
    return round((q25 + q75) / 2), round((q75 - q25) / 2)


def shift_tree(tree: CallTree, offsets: ClockOffsets) -> CallTree:
    """The tree on the reference rank's clock: each rank's times minus its offset.

    A per-rank constant moves no node relative to another of its rank, so nesting, launches,
    steps and collective instances, all found within a rank, stand as built; only the times
    move, and the tree is not built again."""
    correction = np.zeros(int(max(tree.rank.max(initial=0), offsets.rank.max(initial=0))) + 1)
    correction = correction.astype(np.int64)
    correction[offsets.rank] = offsets.offset_ns
    steps = replace(tree.steps, start_ns=tree.steps.start_ns - correction[tree.steps.rank])
    comm = replace(
        tree.comm,
        start_ns=tree.comm.start_ns - correction[tree.comm.rank],
        end_ns=tree.comm.end_ns - correction[tree.comm.rank],
    )
    return replace(tree, start=tree.start - correction[tree.rank], steps=steps, comm=comm)


def apply_offsets(events: EventTable, offsets: ClockOffsets) -> EventTable:
    """A new event table on the reference rank's clock (ts_ns minus each rank's offset)."""
    table = events.table
    rank = table.column("rank").to_numpy()
    correction = np.zeros(len(rank), dtype=np.int64)
    for r, offset in zip(offsets.rank.tolist(), offsets.offset_ns.tolist(), strict=True):
        if offset:
            correction[rank == r] = offset
    ts = table.column("ts_ns").to_numpy() - correction
    index = table.schema.get_field_index("ts_ns")
    corrected = table.set_column(index, "ts_ns", pa.array(ts, pa.int64()))
    return EventTable(table=corrected, sources=list(events.sources))


def host_offsets(events: EventTable, offsets: ClockOffsets) -> dict[str, tuple[int, int]]:
    """Per host: (median offset of its ranks, half their spread), from the files' host names.

    Ranks on one host read one clock, so their offsets should agree to within the estimate's
    residual; a spread much larger than that means the host names or the instances are wrong.
    Logs from a host are put on the trace clock with its offset.
    """
    rank_host = {source.rank: source.host for source in events.sources}
    by_host: dict[str, list[int]] = {}
    for rank, offset in zip(offsets.rank.tolist(), offsets.offset_ns.tolist(), strict=True):
        by_host.setdefault(rank_host.get(rank, ""), []).append(offset)
    return {
        host: (int(np.median(values)), int((max(values) - min(values)) // 2))
        for host, values in sorted(by_host.items())
    }


@dataclass
class AnchorOffsets:
    """Offsets of log clocks (per host or process key) against the trace clock, from anchors."""

    key: list[str]
    offset_ns: np.ndarray  # log time minus trace time: subtract from the log's ts_ns
    residual_ns: np.ndarray
    anchors: np.ndarray

    def offset_of(self, key: str) -> int | None:
        """The offset of one key's clock; None when it had no anchors."""
        return int(self.offset_ns[self.key.index(key)]) if key in self.key else None


def estimate_anchor_offsets(
    keys: Sequence[str], log_ts_ns: Sequence[int], trace_ts_ns: Sequence[int]
) -> AnchorOffsets:
    """Per-key offset of log time against trace time from pairs known to be the same moment.

    An anchor is a log record and a trace event that mark one instant (an iteration line and the
    end of the step it reports, the lab's step line and its step annotation). Whole-second log
    times make each anchor uncertain by up to a second; many anchors shrink that, and the
    residual says how much is left.
    """
    log = np.asarray(log_ts_ns, dtype=np.int64)
    trace = np.asarray(trace_ts_ns, dtype=np.int64)
    key_array = np.asarray(list(keys), dtype=object)
    names = sorted(set(key_array.tolist()))
    offsets, residuals, counts = [], [], []
    for name in names:
        mask = key_array == name
        offset, residual = midhinge(log[mask] - trace[mask])
        offsets.append(offset)
        residuals.append(residual)
        counts.append(int(mask.sum()))
    return AnchorOffsets(
        key=names,
        offset_ns=np.asarray(offsets, dtype=np.int64),
        residual_ns=np.asarray(residuals, dtype=np.int64),
        anchors=np.asarray(counts, dtype=np.int64),
    )


def _completion_ends(tree: CallTree, warnings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(rows of `tree.comm`, their completion end ns) for the synchronising collectives.

    A collective's root is often the host op that enqueued it; its GPU kernel hangs below it by a
    launch edge, and that kernel's end is the completion. Without GPU work, host ranges that are
    not asynchronous enqueues (gloo's) are used.
    """
    comm = tree.comm
    if len(comm) == 0:
        warnings.append("no collectives in the trace: clock offsets cannot be estimated")
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    synchronising = np.array([k in SYNCHRONISING_KINDS for k in comm.kind], dtype=bool)
    gpu_end = np.array([_gpu_end(tree, int(n)) for n in comm.node.tolist()], dtype=np.int64)
    on_gpu = synchronising & (gpu_end >= 0)
    if on_gpu.any():
        rows = np.flatnonzero(on_gpu)
        return rows, gpu_end[rows]
    names = [tree.names[tree.name[n]] for n in comm.node.tolist()]
    completing = np.array([ASYNC_ENQUEUE.match(n) is None for n in names], dtype=bool)
    rows = np.flatnonzero(synchronising & completing)
    if len(rows) == 0:
        warnings.append(
            "only asynchronous collective enqueues in the trace (no GPU comm kernels or gloo "
            "ranges): offsets come from enqueue times and are rough"
        )
        rows = np.flatnonzero(synchronising)
    return rows, comm.end_ns[rows]


def _gpu_end(tree: CallTree, node: int) -> int:
    """Latest end of GPU work at or below `node`, -1 if none."""
    end = -1
    stack = [node]
    while stack:
        current = stack.pop()
        if tree.stream[current] >= 0:
            end = max(end, int(tree.start[current] + tree.dur[current]))
        stack.extend(tree.children(current).tolist())
    return end
