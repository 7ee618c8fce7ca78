"""Attach every log record to the tree node it describes, with a confidence; keep the rest.

A log line helps a diagnosis only once it sits next to the step it talks about: a preemption
warning inside the slow step, a JIT-compilation warning on the rank whose kernel stretched. Records
are first put on the trace clock (`teller.align.logtime`: exact, anchored, bracketed by file order,
or to the second), then placed by the strongest evidence each has:

1. *collective*: an NCCL watchdog line names its rank, process group and `SeqNum`: the node of
   that collective instance on that rank (confidence 1), in its step; a hung collective's step
   never closed (so is not in the trace) and is the one after the rank's last closed step.
2. *request*: it names a request (`Added`/`Finished`/preempted/resumed …) that the request trees
   placed in steps: admission-side lines go to the request's first step, `Finished` to its last,
   others to the request's step nearest the line; confidence is that membership's.
3. *iteration*: an iteration-details line is the anchor of the step it reports; confidence falls
   as the elapsed time it prints drifts from the step's traced duration.
4. *window* / *order*: an exact time (or a file-order bracket) inside a step on the record's rank,
   else the reference rank: confidence 1 on its own rank, 0.8 when the rank was assumed, 0.5 just
   outside a step (within GAP_NS); a bracket is scaled by the share of it inside the step.
5. *second*: a time known only to the second: the steps it overlaps share the confidence.

A line about a request that no traced step admitted (still queued when the trace ended) stays at
step -1 as `queued`. Anything else is kept with step -1 (`unmatched`), so nothing disappears.
`align_run` reads a run, puts every rank on rank 0's clock from collectives, and aligns. With
several data-parallel engines in one trace folder (`teller.callchain.engines`), a line that names
its engine is placed on that engine's steps (`logtime`), and so are its requests (`requests`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from teller.align.clock import AnchorOffsets, ClockOffsets, estimate_rank_offsets, shift_tree
from teller.align.logtime import LogTimes, engine_reference, place_log_times
from teller.align.requests import RequestTrees, build_request_trees, held_back_requests
from teller.callchain.per_rank import RunTree, read_tree
from teller.callchain.tree import CallTree
from teller.ingest.logs.table import LogTable

#: A log clock offset beyond printing delays by more than this is reported (another host's clock
#: or a time zone); below it the engine's printing delay explains it.
CLOCK_WARNING_NS = 50_000_000
#: An exact-time line this close to a step (but outside it) is attached with confidence 0.5.
GAP_NS = 5_000_000
#: How many unmatched records the per-step listing prints (then how many more there are).
UNMATCHED_SHOWN = 20
_ADMISSION_EVENTS = frozenset({"request_received", "request_added"})
_LAST_STEP_EVENTS = frozenset({"request_finished", "request_aborted"})
_RANK_PROCESS = re.compile(r"(?:TP|rank=)(\d+)")
METHODS = (
    "collective",
    "request",
    "queued",
    "iteration",
    "window",
    "order",
    "second",
    "unmatched",
)


@dataclass
class Alignment:
    """One entry per log record (same order as the log table): where it landed and how surely."""

    step: np.ndarray  # step ordinal, -1 unmatched
    rank: np.ndarray  # rank whose step node it joined, -1 unmatched
    node: np.ndarray  # tree node (the step annotation on that rank), -1 unmatched
    confidence: np.ndarray
    method: list[str]
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.step)

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.method))

    def to_arrow(self, logs: LogTable) -> pa.Table:
        """The log table with the alignment columns added."""
        return (
            logs.table.append_column("step", pa.array(self.step, pa.int64()))
            .append_column("step_rank", pa.array(self.rank, pa.int32()))
            .append_column("node", pa.array(self.node, pa.int64()))
            .append_column("confidence", pa.array(self.confidence, pa.float64()))
            .append_column("method", pa.array(self.method, pa.string()))
        )


def align_logs(
    tree: CallTree,
    logs: LogTable,
    requests: RequestTrees | None = None,
    times: LogTimes | None = None,
    reference_rank: int | None = None,
) -> Alignment:
    """Place each log record on a step node of `tree`.

    `times` puts the records on the trace clock (default: `place_log_times`); `requests` (from
    the same times) lets request lines follow their request's steps.
    """
    steps = tree.steps
    count = len(logs)
    step = np.full(count, -1, dtype=np.int64)
    rank_out = np.full(count, -1, dtype=np.int32)
    node = np.full(count, -1, dtype=np.int64)
    confidence = np.zeros(count, dtype=np.float64)
    method = ["unmatched"] * count
    if count == 0:
        return Alignment(step, rank_out, node, confidence, method, [])
    record_rank = logs.table.column("rank").to_numpy()
    events = logs.table.column("event").to_pylist()
    seqs = logs.table.column("collective_seq").to_pylist()
    groups = logs.table.column("process_group").to_pylist()
    group_descs = logs.table.column("process_group_desc").to_pylist()
    collectives = _Collectives(tree)
    for i in range(count):
        if events[i] != "nccl_timeout":
            continue
        if found := collectives.find(record_rank[i], seqs[i], (groups[i], group_descs[i])):
            comm_node, comm_rank = found
            step[i] = _step_at(tree, comm_node)
            rank_out[i], node[i] = comm_rank, comm_node
            confidence[i], method[i] = 1.0, "collective"
    if len(steps) == 0:
        unplaced = method.count("unmatched")
        warnings = [f"the trace has no steps: {unplaced} log records stay unmatched"]
        return Alignment(step, rank_out, node, confidence, method, warnings)
    ranks = sorted(set(steps.rank.tolist()))
    if reference_rank is None:
        reference_rank = requests.reference_rank if requests is not None else ranks[0]
    if times is None:
        times = place_log_times(tree, logs, reference_rank)
    timeline = {r: _Timeline(tree, r) for r in ranks}
    reference = timeline.get(reference_rank, timeline[ranks[0]])
    # a line that names its engine (runs of several) is placed on that engine's lowest rank
    engine = times.engine if times.engine is not None else np.full(count, -1, dtype=np.int64)
    engine_line = {e: timeline[engine_reference(tree, e)] for e in set(engine.tolist()) - {-1}}
    anchor_position = {int(o): (reference, p) for p, o in enumerate(reference.index.tolist())}
    for line in engine_line.values():
        anchor_position.update({int(o): (line, p) for p, o in enumerate(line.index.tolist())})

    table = logs.table
    keys = table.column("request_key").to_pylist()
    processes = table.column("process").to_pylist()
    elapsed_ns = table.column("iteration_elapsed_ns").to_pylist()
    membership = _membership(requests, anchor_position)
    queued = frozenset(requests.queued) if requests is not None else frozenset()

    def place(i: int, line: _Timeline, pos: int, how: str, sure: float) -> None:
        step[i], rank_out[i] = line.index[pos], line.rank
        node[i], confidence[i], method[i] = line.node[pos], sure, how

    for i in range(count):
        lo, hi, how = int(times.lo_ns[i]), int(times.hi_ns[i]), times.how[i]
        if how == "none":
            continue
        key, event = keys[i], events[i]
        if key is not None and key in queued:
            confidence[i], method[i] = 1.0, "queued"  # about a request no traced step ran
            continue
        if key is not None and key in membership:
            positions = membership[key]
            if event in _ADMISSION_EVENTS:
                line, pos, sure = positions[0]
            elif event in _LAST_STEP_EVENTS:
                line, pos, sure = positions[-1]
            else:  # preempted, resumed, …: the request's step nearest the line
                middle = (lo + hi) // 2
                line, pos, sure = min(positions, key=lambda p: abs(int(p[0].start[p[1]]) - middle))
            place(i, line, pos, "request", sure)
            continue
        if method[i] == "collective":
            continue
        if how == "anchor":
            anchored = anchor_position.get(int(times.anchor_step[i]))
            if anchored is not None:
                line, pos = anchored
                sure = _iteration_confidence(elapsed_ns[i], int(line.dur[pos]))
                place(i, line, pos, "iteration", sure)
                continue
        rank = int(record_rank[i])
        if rank < 0 and (match := _RANK_PROCESS.search(processes[i] or "")):
            rank = int(match.group(1))
        line = timeline.get(rank, engine_line.get(int(engine[i]), reference))
        assumed = rank not in timeline
        if how in ("exact", "order"):
            pos, inside = line.containing((lo + hi) // 2)
            if pos >= 0:
                sure = (0.8 if assumed else 1.0) if inside else 0.5
                if how == "order":
                    sure *= line.share_inside(pos, lo, hi)
                place(i, line, pos, "window" if how == "exact" else "order", sure)
        else:
            candidates = line.overlapping(lo, hi)
            if len(candidates):
                place(i, line, int(candidates[0]), "second", 1.0 / len(candidates))
    warnings = list(times.warnings)
    unmatched = method.count("unmatched")
    if unmatched:
        warnings.append(f"{unmatched} of {count} log records match no step (kept, step -1)")
    return Alignment(step, rank_out, node, confidence, method, warnings)


def kv_fill_by_step(step: np.ndarray, fill: np.ndarray) -> dict[int, float]:
    """Step ordinal → the KV cache's fill (0-1) its aligned log lines state (the last one, where
    several do); `fill`: the log table's typed `kv_cache_fill`, NaN where a line states none.

    Why: a full cache (preemptions) and a scheduler capped too low both leave requests waiting
    while batches shrink; only the cache's fill tells them apart, and the engine prints it."""
    stated = (step >= 0) & ~np.isnan(fill)
    pairs = zip(step[stated].tolist(), fill[stated].tolist(), strict=True)
    return {int(s): float(v) for s, v in pairs}


#: The log event of a request the engine preempted (`teller.ingest.logs.table.EVENTS`).
PREEMPTED_EVENT = "request_preempted"
#: The field in which SGLang's retract line states how many requests it sent back.
RETRACTED_FIELD = "retracted_reqs"
#: The least placement confidence at which a preemption line names its step: a line known only
#: to the second shares 1/n among the n steps of that second (`align_logs`, "second").
PREEMPTION_PLACED = 0.5


@dataclass
class AlignResult:
    """Everything `teller align` shows: the run on one clock, its logs placed on its steps."""

    tree: CallTree
    logs: LogTable
    requests: RequestTrees
    alignment: Alignment
    rank_offsets: ClockOffsets
    log_offsets: AnchorOffsets | None
    warnings: list[str]

    @cached_property
    def waiting(self) -> dict[int, int]:
        """Step ordinal → requests waiting at its start (`RequestTrees.waiting`)."""
        return self.requests.waiting(self.tree)

    @cached_property
    def preempted(self) -> dict[int, int]:
        """Step ordinal → requests the engine's logs say it preempted in that step (their KV
        blocks freed for others, their prefill to be run again): the engine's own word that
        its KV cache was full, which a step's time need not show. A line counts its requests
        (SGLang's `#retracted_reqs`, else one), and only where it is placed surely enough
        (`PREEMPTION_PLACED`): a line known only to the second, among several steps of that
        second, does not say which of them preempted."""
        events = np.array(self.logs.column("event"), dtype=object)
        rows = np.flatnonzero(
            (events == PREEMPTED_EVENT)
            & (self.alignment.step >= 0)
            & (self.alignment.confidence >= PREEMPTION_PLACED)
        )
        if not len(rows):
            return {}
        fields = self.logs.table.column("fields").take(rows).to_pylist()
        counts: dict[int, int] = {}
        for row, text in zip(rows.tolist(), fields, strict=True):
            stated = json.loads(text).get(RETRACTED_FIELD) if text else None
            many = int(stated) if isinstance(stated, int | float) and stated > 0 else 1
            step = int(self.alignment.step[row])
            counts[step] = counts.get(step, 0) + many
        return dict(sorted(counts.items()))

    @cached_property
    def kv_fill(self) -> dict[int, float]:
        """Step ordinal → the KV cache's fill (0-1) that a log line aligned to the step states
        (the last, where several do): the engine's word on how full its cache was then, which
        a line from seconds before cannot give."""
        return kv_fill_by_step(self.alignment.step, self.logs.kv_cache_fill())

    @cached_property
    def held_back(self) -> dict[int, int]:
        """Step ordinal → waiting requests the step had room for (`held_back_requests`): what
        the model reads and what a capped scheduler's finding states."""
        return held_back_requests(self.tree, self.waiting)


def align_run(
    trace_paths: Iterable[str | Path],
    log_paths: Sequence[str | Path],
    span_paths: Sequence[str | Path] = (),
    year: int | None = None,
) -> AlignResult:
    """Read a run's traces, logs (and OTLP spans), put them on one clock and align them."""
    run, rank_offsets = read_on_one_clock(trace_paths)
    return align_tree(run.tree, log_paths, span_paths, year, rank_offsets, run.traced_pids)


def read_on_one_clock(
    trace_paths: Iterable[str | Path], **map_options: Any
) -> tuple[RunTree, ClockOffsets | None]:
    """A run's rank files read and built one at a time (`teller.callchain.per_rank.read_tree`,
    which takes `map_options`: `step_regex`, `progress`, `jobs`, `engine`, `ray_address`), its
    tree put on one clock (`on_one_clock`), and the offsets."""
    run = read_tree(trace_paths, **map_options)
    run.tree, rank_offsets = on_one_clock(run.tree)
    return run, rank_offsets


def on_one_clock(tree: CallTree) -> tuple[CallTree, ClockOffsets | None]:
    """The run's tree with every rank on the reference rank's clock (offsets from collectives),
    and the offsets; None where the tree has one rank or no collective to estimate them from.

    `teller analyze`, `teller eval` and the model's training data all put their trees on one
    clock here, so the scoreboard and the training see the clock a user's verdict is reached
    on."""
    if len(np.unique(tree.rank)) < 2 or not len(tree.comm):
        return tree, None
    rank_offsets = estimate_rank_offsets(tree)
    if np.any(rank_offsets.offset_ns != 0):
        tree = shift_tree(tree, rank_offsets)
    return tree, rank_offsets


def align_tree(
    tree: CallTree,
    log_paths: Sequence[str | Path],
    span_paths: Sequence[str | Path] = (),
    year: int | None = None,
    rank_offsets: ClockOffsets | None = None,
    trace_pids: frozenset[int] | None = None,
    keep_span: Callable[[str], bool] | None = None,
    within: tuple[int, int] | None = None,
) -> AlignResult:
    """Align logs (and OTLP spans) to a tree already on one clock.

    `keep_span`: which spans, by request id, are this tree's where it is one engine of a run
    analysed one engine at a time (the others' requests ran on their engines' steps). `within`:
    the tree is one time window of a run (`teller.callchain.windows`), and only the records
    that may lie in it (ns, trace clock) are aligned, once placed.

    With `trace_pids` (`teller.ingest.schema.traced_pids`), a log file that states process ids
    none of which the traces recorded, and whose times all fall outside the traced span, is
    from another run: it is set aside with a warning instead of aligned (its lines never become
    evidence)."""
    from teller.ingest.logs import read_logs
    from teller.ingest.otlp import read_spans

    if rank_offsets is None:
        rank_offsets = estimate_rank_offsets(tree)
    logs = read_logs(log_paths, year=year)
    foreign: list[str] = []
    if trace_pids is not None:
        logs, foreign = set_aside_foreign_logs(tree, logs, trace_pids)
    spans = read_spans(span_paths) if span_paths else None
    if spans is not None and keep_span is not None:
        kept = pa.array([keep_span(key) for key in spans.column("request_key")], pa.bool_())
        spans = replace(spans, table=spans.table.filter(kept))
    times = place_log_times(tree, logs)
    if within is not None:
        inside = times.within(*within)
        logs = replace(logs, table=logs.table.filter(pa.array(inside)))
        times = times.kept(inside)
    log_offsets = times.log_offset
    warnings = list(rank_offsets.warnings) + logs.warnings + foreign
    if log_offsets is not None:
        several = len(log_offsets.key) > 1
        for key, offset, residual, anchors in zip(
            log_offsets.key,
            log_offsets.offset_ns.tolist(),
            log_offsets.residual_ns.tolist(),
            log_offsets.anchors.tolist(),
            strict=True,
        ):  # an offset clearly beyond printing delays: another host's clock, or a time zone
            if abs(offset) - residual > CLOCK_WARNING_NS:
                named = f" ({Path(key).name})" if several else ""
                warnings.append(
                    f"log clock{named} is {offset / 1e6:+.1f} ms off the trace clock "
                    f"(± {residual / 1e6:.1f} ms over {anchors} anchors)"
                )
    requests = build_request_trees(tree, logs=logs, spans=spans, times=times)
    alignment = align_logs(tree, logs, requests, times)
    warnings += requests.warnings + alignment.warnings
    return AlignResult(tree, logs, requests, alignment, rank_offsets, log_offsets, warnings)


#: Trace times above this are unix ns (after 2001); below, the profiler's own clock, which says
#: nothing about when a log line was printed.
_UNIX_NS = 10**18


def set_aside_foreign_logs(
    tree: CallTree, logs: LogTable, trace_pids: frozenset[int]
) -> tuple[LogTable, list[str]]:
    """The logs without the files from another run, and a warning naming each one set aside.

    A file is another run's when both facts say so: the process ids it prints match no traced
    process, and its times fall wholly outside the traced span (on a unix clock). Either alone
    is common in a good run: an API server's log names only its own process; a log in another
    time zone sits hours off."""
    if not len(logs) or not len(tree.start):
        return logs, []
    trace_lo = int(tree.start.min())
    trace_hi = int((tree.start + tree.dur).max())
    if trace_lo < _UNIX_NS:
        return logs, []
    files = logs.table.column("file").to_pylist()
    pids = logs.table.column("pid").to_numpy()
    ts = logs.table.column("ts_ns").to_numpy()
    names = np.asarray(files, dtype=object)
    keep = np.ones(len(files), dtype=bool)
    warnings = []
    for file in dict.fromkeys(files):
        rows = names == file
        stated = set(pids[rows & (pids >= 0)].tolist())
        times = ts[rows & (ts >= 0)]
        if not stated or stated & trace_pids or not times.size:
            continue
        if times.min() <= trace_hi and times.max() >= trace_lo:
            continue
        keep &= ~rows
        shown = ", ".join(map(str, sorted(stated)[:4]))
        warnings.append(
            f"{Path(file).name}: set aside, not aligned: its processes ({shown}) match no traced "
            f"process and its times lie {_distance_s(times, trace_lo, trace_hi)} outside the "
            "traces (a log of another run?)"
        )
    if keep.all():
        return logs, []
    kept_files = set(names[keep].tolist())
    sources = [source for source in logs.sources if source.path in kept_files]
    return LogTable(logs.table.filter(pa.array(keep)), sources), warnings


def _distance_s(times: np.ndarray, lo: int, hi: int) -> str:
    gap_ns = lo - int(times.max()) if times.max() < lo else int(times.min()) - hi
    return f"{gap_ns / 1e9:,.0f} s"


def render_by_step(result: AlignResult, steps: range | None = None, width: int = 160) -> str:
    """Per-step listing: each step on the reference rank, then the log lines placed in it; with
    no step range, the unmatched lines last (the first UNMATCHED_SHOWN, with their file:line)."""
    table = result.logs.table
    alignment = result.alignment
    tree = result.tree
    raw = table.column("raw").to_pylist()
    level = table.column("level").to_pylist()
    by_step: dict[int, list[int]] = {}
    for i, s in enumerate(alignment.step.tolist()):
        by_step.setdefault(s, []).append(i)
    reference = result.requests.reference_rank
    rows = np.flatnonzero(tree.steps.rank == reference)
    rows = rows[np.argsort(tree.steps.index[rows])]
    lines = []
    for row in rows.tolist():
        ordinal = int(tree.steps.index[row])
        if steps is not None and ordinal not in steps:
            continue
        members = int(np.count_nonzero(result.requests.step == ordinal))
        lines.append(
            f"step {ordinal}  {tree.steps.name[row][:60]}  {tree.steps.dur_ns[row] / 1e6:.2f} ms"
            f"  requests {members}"
        )
        for i in by_step.get(ordinal, []):
            text = raw[i].split("\n", 1)[0]
            tag = f"  [{alignment.method[i]} {alignment.confidence[i]:.2f} r{alignment.rank[i]}]"
            lines.append(f"    {level[i] or '-':7} {text[: width - 40]}{tag}")
    off_steps = by_step.get(-1, [])
    unmatched = [i for i in off_steps if alignment.method[i] != "queued"]
    if len(unmatched) < len(off_steps) and steps is None:
        lines.append(
            f"queued: {len(off_steps) - len(unmatched)} records about requests no traced step "
            "admitted"
        )
    if unmatched and steps is None:
        lines.append(
            f"unmatched: {len(unmatched)} of {len(table)} records "
            "(outside every step or without a time)"
        )
        files = table.column("file").to_pylist()
        numbers = table.column("line").to_pylist()
        for i in unmatched[:UNMATCHED_SHOWN]:
            text = raw[i].split("\n", 1)[0]
            where = f"  [{Path(files[i]).name}:{numbers[i]}]"
            lines.append(f"    {level[i] or '-':7} {text[: width - 40]}{where}")
        if len(unmatched) > UNMATCHED_SHOWN:
            lines.append(f"    … and {len(unmatched) - UNMATCHED_SHOWN} more")
    return "\n".join(lines)


class _Timeline:
    """One rank's steps in time order, for the lookups alignment makes."""

    def __init__(self, tree: CallTree, rank: int) -> None:
        steps = tree.steps
        rows = np.flatnonzero(steps.rank == rank)
        rows = rows[np.argsort(steps.start_ns[rows], kind="stable")]
        self.rank = rank
        self.index = steps.index[rows]
        self.node = steps.node[rows]
        self.start = steps.start_ns[rows]
        self.dur = steps.dur_ns[rows]
        self.end = self.start + self.dur
        self._end_order = np.argsort(self.end, kind="stable")
        self._sorted_end = self.end[self._end_order]

    def containing(self, t: int) -> tuple[int, bool]:
        """(position, inside) of the step containing t, else the nearest within GAP_NS, else -1."""
        pos = int(np.searchsorted(self.start, t, side="right")) - 1
        if pos >= 0 and t <= self.end[pos]:
            return pos, True
        best, gap = -1, GAP_NS + 1
        for candidate in (pos, pos + 1):
            if 0 <= candidate < len(self.start):
                distance = max(self.start[candidate] - t, t - self.end[candidate], 0)
                if distance < gap:
                    best, gap = candidate, distance
        return best, False

    def share_inside(self, pos: int, lo: int, hi: int) -> float:
        """Share of the interval [lo, hi] that lies inside step `pos` (1 for a point inside)."""
        if hi <= lo:
            return 1.0
        inside = min(hi, int(self.end[pos])) - max(lo, int(self.start[pos]))
        return float(min(max(inside / (hi - lo), 0.0), 1.0))

    def overlapping(self, lo: int, hi: int) -> np.ndarray:
        """Positions of the steps that overlap [lo, hi]."""
        return np.flatnonzero((self.end >= lo) & (self.start <= hi))


class _Collectives:
    """Collective instances by (rank, sequence number), for the NCCL watchdog's `SeqNum`."""

    def __init__(self, tree: CallTree) -> None:
        comm = tree.comm
        self._by_rank_seq: dict[tuple[int, int], list[tuple[str, int]]] = {}
        for rank, seq, group, node in zip(
            comm.rank.tolist(), comm.seq.tolist(), comm.group, comm.node.tolist(), strict=True
        ):
            if seq >= 0:
                self._by_rank_seq.setdefault((rank, seq), []).append((group, node))

    def find(
        self, rank: int, seq: int | None, groups: tuple[str | None, ...]
    ) -> tuple[int, int] | None:
        """(node, rank) of the collective a watchdog line names by its rank, sequence number and
        process group (name or description, either may match the trace's); None if not in it."""
        if rank < 0 or seq is None:
            return None
        candidates = self._by_rank_seq.get((int(rank), seq), [])
        named = [node for group, node in candidates if group in groups]
        if named or len(candidates) == 1:
            return (named or [candidates[0][1]])[0], int(rank)
        return None


def _step_at(tree: CallTree, node: int) -> int:
    """Step ordinal of a node: its step's, else its rank's step still open at its start.

    A collective that hangs never lets its step's annotation close, and Kineto drops ranges that
    never closed, so the hung step is missing from the trace: a node past the rank's last closed
    step belongs to the step after it (the first, when none closed). A node in a gap between
    two closed steps belongs to neither (-1).
    """
    row = int(tree.step[node])
    if row >= 0:
        return int(tree.steps.index[row])
    steps = tree.steps
    mine = np.flatnonzero(steps.rank == tree.rank[node])
    start = int(tree.start[node])
    if len(mine) == 0:
        return 0
    ends = steps.start_ns[mine] + steps.dur_ns[mine]
    containing = mine[(steps.start_ns[mine] <= start) & (start <= ends)]
    if len(containing):
        return int(steps.index[containing[0]])
    if start > ends.max():
        return int(steps.index[mine].max()) + 1
    return -1


def _membership(
    requests: RequestTrees | None, position: dict[int, tuple[_Timeline, int]]
) -> dict[str, list[tuple[_Timeline, int, float]]]:
    """request key → [(timeline, position on it, confidence)], in step order: the reference
    rank's steps, or its engine's lowest rank's in a run of several engines (`position`)."""
    if requests is None or len(requests) == 0:
        return {}
    out: dict[str, list[tuple[_Timeline, int, float]]] = {}
    for k in np.argsort(requests.step, kind="stable").tolist():
        placed = position.get(int(requests.step[k]))
        if placed is not None:
            key = requests.requests.key[int(requests.request[k])]
            out.setdefault(key, []).append((*placed, float(requests.confidence[k])))
    return out


def _iteration_confidence(elapsed_ns: int | None, step_dur_ns: int) -> float:
    """1 when the printed elapsed time matches the step's duration, less as they drift apart."""
    if elapsed_ns is None or step_dur_ns <= 0:
        return 0.5
    ratio = elapsed_ns / step_dur_ns
    return float(max(0.0, 1.0 - abs(np.log(max(ratio, 1e-9)))))
