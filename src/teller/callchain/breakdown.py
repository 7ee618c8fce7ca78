"""Where the time went: for each rank, in each step and over its whole run, how long its GPU was
busy and on what, how long it sat idle and what the host was doing meanwhile, how much
communication compute did not hide, and which kernels and operators took the GPU time.

This is the first thing a person asks of a slow run, before any anomaly: a step that is 40% GPU
idle inside `cudaStreamSynchronize` after `aten::item` is fixed differently from one whose
all-reduce is exposed. The numbers are lengths of unions (`teller.callchain.intervals`):

* busy = the union of the rank's GPU activity over all its streams (kernels, collectives, copies
  and sets), by kind: `compute` (kernels), `communication` (collective kernels) and `memory`
  (memcpy/memset). Kinds overlap each other (streams run concurrently), so each kind is at most
  busy and together at least busy (but for `ROUNDING_GAP_NS` joins); a sum of kernel durations
  would count overlap twice.
* idle = span − busy, cut into gaps, each with the cause `teller.callchain.host_activity` gives;
  the causes' times add up to idle exactly.
* exposed communication = communication − its overlap with compute.

A step's span runs from its annotation's start to the later of its end and the end of the last
GPU work launched inside it (GPU work runs behind the host that launched it), so consecutive
steps' spans can overlap; a rank's whole run spans all of its host and GPU events.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from teller.callchain.host_activity import (
    IDLE_CAUSE_LABELS,
    IDLE_CAUSES,
    GapCauses,
    HostActivity,
    NodeContext,
    node_context,
)
from teller.callchain.intervals import Intervals, clip_to_windows
from teller.callchain.tree import CallTree
from teller.ingest.schema import LAYER_CODE, LAYERS

if TYPE_CHECKING:
    from teller.callchain.facts import RunFacts

GPU_KINDS: tuple[str, ...] = ("compute", "communication", "memory")
COMPUTE, COMMUNICATION, MEMORY = range(len(GPU_KINDS))
_KIND_OF_LAYER = {
    LAYER_CODE["kernel"]: COMPUTE,
    LAYER_CODE["comm"]: COMMUNICATION,
    LAYER_CODE["memcpy"]: MEMORY,
    LAYER_CODE["memset"]: MEMORY,
}
#: Host layers whose events say what the host was doing (requests are spans, not host work).
_HOST_CODES = tuple(LAYER_CODE[n] for n in ("engine", "python", "cpu_op", "runtime", "comm"))
#: GPU activities closer than this are one busy stretch: traces round start and duration
#: separately, so back-to-back kernels show gaps of a nanosecond or two that are not idleness.
ROUNDING_GAP_NS = 10
#: How many kernels, operators and idle contributors each breakdown keeps, largest first, and
#: how many of its longest gaps: enough to act on, few enough for a JSON of thousands of steps.
TOP_IN_RUN = 10
TOP_IN_STEP = 5
GAPS_IN_RUN = 5
GAPS_IN_STEP = 3
_NO_NAME = -1
#: The operator name of GPU work whose launch the trace does not hold (launched before the
#: profiling window, or by an untraced thread).
UNLAUNCHED = "(no launch in the trace)"


@dataclass(frozen=True)
class GpuBusy:
    """How long the GPU was busy in a span, in ns: in all and by kind (kinds overlap)."""

    busy_ns: int
    compute_ns: int
    communication_ns: int
    memory_ns: int
    #: communication while compute ran too, on any stream of the same rank
    overlapped_communication_ns: int

    @property
    def exposed_communication_ns(self) -> int:
        """Communication that no compute hid: what overlapping it better could save."""
        return self.communication_ns - self.overlapped_communication_ns


@dataclass(frozen=True)
class IdleTime:
    """How long the GPU sat idle in a span, in ns, split by what the host was doing
    (`teller.callchain.host_activity`); the parts add up to `idle_ns`."""

    sync_ns: int
    launch_ns: int
    scheduler_ns: int
    host_ns: int
    unrecorded_ns: int

    @property
    def idle_ns(self) -> int:
        return self.sync_ns + self.launch_ns + self.scheduler_ns + self.host_ns + self.unrecorded_ns

    def of(self, cause: str) -> int:
        return int(getattr(self, f"{cause}_ns"))


@dataclass(frozen=True)
class IdleGap:
    """One stretch of an idle GPU and what its host was doing meanwhile."""

    rank: int
    step: int | None  # the step whose span holds it; None outside every step
    start_ns: int
    dur_ns: int
    cause: str  # one of IDLE_CAUSES
    host_call: str | None  # the blocking call (sync) or last launch (launch)
    cpu_operator: str | None  # the CPU operator that made `host_call`


@dataclass(frozen=True)
class IdleContributor:
    """Idle time of one span that shares a cause, host call and operator: "71% of the idle time
    is a blocking cudaStreamSynchronize in aten::item"."""

    cause: str
    host_call: str | None
    cpu_operator: str | None
    idle_ns: int
    gaps: int


@dataclass(frozen=True)
class KernelTime:
    """GPU time of one kernel (or copy, or collective) by name, summed over its calls."""

    name: str
    kind: str  # one of GPU_KINDS
    calls: int
    gpu_ns: int

    @property
    def per_call_ns(self) -> float:
        return self.gpu_ns / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class OperatorTime:
    """GPU time of the work one CPU operator launched, by operator name. Work launched outside
    any operator is named after its nearest Python frame or annotation, else its runtime call
    (`layer` says which)."""

    name: str
    layer: str
    calls: int  # operator instances that launched GPU work
    kernels: int  # GPU activities they launched
    gpu_ns: int

    @property
    def per_call_ns(self) -> float:
        return self.gpu_ns / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class StepBreakdown:
    """Where one rank's time went in one step, or in its whole run (`step` None)."""

    rank: int
    step: int | None
    start_ns: int
    span_ns: int
    busy: GpuBusy
    idle: IdleTime
    idle_contributors: list[IdleContributor]  # largest first
    longest_gaps: list[IdleGap]  # longest first
    top_kernels: list[KernelTime]  # most GPU time first
    top_operators: list[OperatorTime]  # most GPU time first

    @property
    def idle_ns(self) -> int:
        return self.idle.idle_ns

    @property
    def idle_share(self) -> float:
        """The share of its span the GPU sat idle."""
        return self.idle_ns / self.span_ns if self.span_ns else 0.0

    @property
    def where(self) -> str:
        return f"step {self.step}" if self.step is not None else "the run"

    def to_json(self) -> dict:
        return {
            "rank": self.rank,
            "step": self.step,
            "start_ns": self.start_ns,
            "span_ns": self.span_ns,
            "busy_ns": self.busy.busy_ns,
            "compute_ns": self.busy.compute_ns,
            "communication_ns": self.busy.communication_ns,
            "memory_ns": self.busy.memory_ns,
            "overlapped_communication_ns": self.busy.overlapped_communication_ns,
            "exposed_communication_ns": self.busy.exposed_communication_ns,
            "idle_ns": self.idle_ns,
            "idle_by_cause_ns": {cause: self.idle.of(cause) for cause in IDLE_CAUSES},
            "idle_contributors": [_plain(c) for c in self.idle_contributors],
            "longest_gaps": [_plain(g) for g in self.longest_gaps],
            "top_kernels": [{**_plain(k), "per_call_ns": k.per_call_ns} for k in self.top_kernels],
            "top_operators": [
                {**_plain(o), "per_call_ns": o.per_call_ns} for o in self.top_operators
            ],
            "summary": idle_summary(self),
        }


def _plain(item: object) -> dict:
    return dict(item.__dict__)


@dataclass(frozen=True)
class IdleGaps:
    """Every idle gap of every rank's whole run, as columns (`to_arrow` for a notebook)."""

    rank: np.ndarray
    step: np.ndarray  # the step whose span holds the gap's start, -1 for none
    start_ns: np.ndarray
    dur_ns: np.ndarray
    cause: list[str]
    host_call: list[str | None]
    cpu_operator: list[str | None]

    def __len__(self) -> int:
        return len(self.rank)

    def to_arrow(self) -> pa.Table:
        return pa.table(
            {
                "rank": self.rank,
                "step": self.step,
                "start_ns": self.start_ns,
                "dur_ns": self.dur_ns,
                "cause": pa.array(self.cause, pa.string()),
                "host_call": pa.array(self.host_call, pa.string()),
                "cpu_operator": pa.array(self.cpu_operator, pa.string()),
            }
        )


@dataclass
class RunBreakdown:
    """Where the time went on every rank with GPU activity: its whole run and each step."""

    runs: list[StepBreakdown]  # one per rank, ascending
    steps: list[StepBreakdown]  # one per (rank, step), by rank then step; or some (`rows`)
    gaps: IdleGaps
    ranks_without_gpu: list[int] = field(default_factory=list)
    #: every (rank, step) row as JSON, where `steps` holds only some of them: a run analysed one
    #: engine at a time keeps its finding steps' and each engine's most idle step's, and the
    #: rest on disk (`teller.rca.merge.SpilledRows`)
    rows: Collection[dict] | None = None

    def run(self, rank: int) -> StepBreakdown | None:
        return next((b for b in self.runs if b.rank == rank), None)

    def step(self, rank: int, step: int) -> StepBreakdown | None:
        return next((b for b in self.steps if b.rank == rank and b.step == step), None)

    def to_arrow(self) -> pa.Table:
        """One row per (rank, step), the whole run's rows first with a null step."""
        steps = self.rows if self.rows is not None else (b.to_json() for b in self.steps)
        rows = [*(b.to_json() for b in self.runs), *steps]
        names = (
            "rank",
            "step",
            "start_ns",
            "span_ns",
            "busy_ns",
            "compute_ns",
            "communication_ns",
            "memory_ns",
            "exposed_communication_ns",
            "idle_ns",
        )
        columns: dict[str, list] = {name: [row[name] for row in rows] for name in names}
        for cause in IDLE_CAUSES:
            columns[f"idle_{cause}_ns"] = [row["idle_by_cause_ns"][cause] for row in rows]
        columns["summary"] = [row["summary"] for row in rows]
        return pa.table(
            {k: pa.array(v, pa.int64()) if k not in ("summary",) else v for k, v in columns.items()}
        )

    def to_json(self) -> dict:
        return {
            "runs": [b.to_json() for b in self.runs],
            "steps": list(self.rows)
            if self.rows is not None
            else [b.to_json() for b in self.steps],
            "ranks_without_gpu": list(self.ranks_without_gpu),
        }


def breakdown_of(facts: RunFacts) -> RunBreakdown:
    """The breakdown of the run whose facts these are, computed on first use and kept beside
    them, so a verdict's sentences and its report read one."""
    return facts.derived("breakdown", lambda: run_breakdown(facts.tree))


def run_breakdown(tree: CallTree) -> RunBreakdown:
    """Where the time went on each rank of `tree`, in each step and over its whole run."""
    context = node_context(tree)
    kind = np.full(len(tree), -1, dtype=np.int8)
    on_gpu = tree.stream >= 0
    for code, gpu_kind in _KIND_OF_LAYER.items():
        kind[on_gpu & (tree.layer == code)] = gpu_kind
    gpu = np.flatnonzero(kind >= 0)
    host = np.flatnonzero(~on_gpu & np.isin(tree.layer, _HOST_CODES))
    step_gpu_end = _step_gpu_end(tree, gpu)
    runs: list[StepBreakdown] = []
    steps: list[StepBreakdown] = []
    gap_parts: list[IdleGaps] = []
    without_gpu: list[int] = []
    gpu_of, host_of = _by_rank(tree, gpu), _by_rank(tree, host)
    empty = np.zeros(0, dtype=np.int64)
    for rank in np.unique(tree.rank).tolist():
        rank_gpu = gpu_of.get(rank, empty)
        if not len(rank_gpu):
            without_gpu.append(rank)
            continue
        rank_host = host_of.get(rank, empty)
        rank_steps = np.flatnonzero(tree.steps.rank == rank)
        built = _RankBreakdown(tree, context, kind, rank, rank_gpu, rank_host, rank_steps)
        run, rank_step_breakdowns, gaps = built.compute(step_gpu_end)
        runs.append(run)
        steps.extend(rank_step_breakdowns)
        gap_parts.append(gaps)
    return RunBreakdown(
        runs=runs, steps=steps, gaps=_concat_gaps(gap_parts), ranks_without_gpu=without_gpu
    )


def _by_rank(tree: CallTree, nodes: np.ndarray) -> dict[int, np.ndarray]:
    """`nodes` split by rank, each part in node order."""
    if not len(nodes):
        return {}
    ordered = nodes[np.argsort(tree.rank[nodes], kind="stable")]
    ranks, first = np.unique(tree.rank[ordered], return_index=True)
    parts = np.split(ordered, first[1:])
    return dict(zip(ranks.tolist(), parts, strict=True))


def _step_gpu_end(tree: CallTree, gpu: np.ndarray) -> np.ndarray:
    """Per step-table row: the end of the last GPU activity that belongs to the step."""
    end = np.full(len(tree.steps), np.iinfo(np.int64).min, dtype=np.int64)
    in_step = gpu[tree.step[gpu] >= 0]
    np.maximum.at(end, tree.step[in_step], tree.start[in_step] + tree.dur[in_step])
    return end


class _RankBreakdown:
    """The breakdowns of one rank: its whole run is window 0, its steps windows 1…"""

    def __init__(
        self,
        tree: CallTree,
        context: NodeContext,
        kind: np.ndarray,
        rank: int,
        gpu: np.ndarray,
        host: np.ndarray,
        step_rows: np.ndarray,
    ) -> None:
        self.tree, self.context, self.rank = tree, context, rank
        self.gpu, self.host, self.step_rows = gpu, host, step_rows
        self.kind = kind[gpu]

    def windows(self, step_gpu_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tree = self.tree
        nodes = np.concatenate([self.gpu, self.host])
        run_lo = int(tree.start[nodes].min())
        run_hi = int((tree.start[nodes] + tree.dur[nodes]).max())
        steps = tree.steps
        step_lo = steps.start_ns[self.step_rows]
        step_hi = np.maximum(step_lo + steps.dur_ns[self.step_rows], step_gpu_end[self.step_rows])
        # a step annotation recorded on the GPU is neither host nor GPU work: keep it inside
        run_lo, run_hi = min([run_lo, *step_lo.tolist()]), max([run_hi, *step_hi.tolist()])
        lo = np.concatenate([[run_lo], step_lo]).astype(np.int64)
        hi = np.concatenate([[run_hi], step_hi]).astype(np.int64)
        return lo, hi

    def compute(
        self, step_gpu_end: np.ndarray
    ) -> tuple[StepBreakdown, list[StepBreakdown], IdleGaps]:
        tree = self.tree
        lo, hi = self.windows(step_gpu_end)
        start = tree.start[self.gpu]
        end = start + tree.dur[self.gpu]
        join = ROUNDING_GAP_NS
        busy_union = Intervals.union_of(start, end, join)
        of_kind = [self.kind == k for k in range(len(GPU_KINDS))]
        by_kind = [Intervals.union_of(start[k], end[k], join) for k in of_kind]
        either = of_kind[COMPUTE] | of_kind[COMMUNICATION]
        compute_or_comm = Intervals.union_of(start[either], end[either], join)
        busy = busy_union.covered(lo, hi)
        kind_ns = [k.covered(lo, hi) for k in by_kind]
        overlapped = kind_ns[COMPUTE] + kind_ns[COMMUNICATION] - compute_or_comm.covered(lo, hi)
        # each union joins gaps under ROUNDING_GAP_NS, so the joint one may cover a few ns more
        # than the two apart: never less than no overlap, nor more than the smaller of the two
        overlapped = np.clip(overlapped, 0, np.minimum(kind_ns[COMPUTE], kind_ns[COMMUNICATION]))

        gaps = busy_union.complement(int(lo[0]), int(hi[0]))
        window, piece_lo, piece_hi = clip_to_windows(gaps, lo, hi)
        activity = HostActivity(tree, self.context, self.host)
        causes = activity.classify(piece_lo, piece_hi)
        piece_ns = piece_hi - piece_lo
        idle_by_cause = _sum_by(
            window * len(IDLE_CAUSES) + causes.cause, piece_ns, len(lo) * len(IDLE_CAUSES)
        )
        idle_by_cause = idle_by_cause.reshape(len(lo), len(IDLE_CAUSES))
        step_of_window = np.concatenate([[-1], tree.steps.index[self.step_rows]])
        step_of_piece = self._step_holding(piece_lo, lo[1:], hi[1:], step_of_window[1:])
        contributors = self._contributors(window, piece_ns, causes, len(lo))
        longest = self._longest_gaps(window, piece_lo, piece_ns, causes, step_of_piece, len(lo))
        kernels = self._top_kernels(len(lo))
        operators = self._top_operators(len(lo))

        def breakdown(w: int) -> StepBreakdown:
            return StepBreakdown(
                rank=self.rank,
                step=int(step_of_window[w]) if w else None,
                start_ns=int(lo[w]),
                span_ns=int(hi[w] - lo[w]),
                busy=GpuBusy(
                    busy_ns=int(busy[w]),
                    compute_ns=int(kind_ns[COMPUTE][w]),
                    communication_ns=int(kind_ns[COMMUNICATION][w]),
                    memory_ns=int(kind_ns[MEMORY][w]),
                    overlapped_communication_ns=int(overlapped[w]),
                ),
                idle=IdleTime(*(int(v) for v in idle_by_cause[w])),
                idle_contributors=contributors[w],
                longest_gaps=longest[w],
                top_kernels=kernels[w],
                top_operators=operators[w],
            )

        in_run = window == 0
        run_gaps = IdleGaps(
            rank=np.full(int(in_run.sum()), self.rank, dtype=np.int32),
            step=step_of_piece[in_run],
            start_ns=piece_lo[in_run],
            dur_ns=piece_ns[in_run],
            cause=[IDLE_CAUSES[c] for c in causes.cause[in_run].tolist()],
            host_call=self._names(causes.host_call[in_run]),
            cpu_operator=self._names(causes.cpu_operator[in_run]),
        )
        return breakdown(0), [breakdown(w) for w in range(1, len(lo))], run_gaps

    # -- pieces of the answer ---------------------------------------------------------------------
    def _names(self, nodes: np.ndarray) -> list[str | None]:
        names, name = self.tree.names, self.tree.name
        return [names[name[n]] if n >= 0 else None for n in nodes.tolist()]

    @staticmethod
    def _step_holding(
        t: np.ndarray, lo: np.ndarray, hi: np.ndarray, step: np.ndarray
    ) -> np.ndarray:
        """The step whose span holds each time `t` (the latest-starting one), -1 for none."""
        if not len(lo):
            return np.full(len(t), -1, dtype=np.int64)
        order = np.argsort(lo, kind="stable")
        k = np.searchsorted(lo[order], t, side="right") - 1
        row = order[np.maximum(k, 0)]
        return np.where((k >= 0) & (t < hi[row]), step[row], -1).astype(np.int64)

    def _contributors(
        self, window: np.ndarray, piece_ns: np.ndarray, causes: GapCauses, windows: int
    ) -> list[list[IdleContributor]]:
        tree = self.tree
        call_name = _name_or_none(tree, causes.host_call)
        operator_name = _name_or_none(tree, causes.cpu_operator)
        keys = np.stack([window, causes.cause.astype(np.int64), call_name, operator_name], axis=1)
        out: list[list[IdleContributor]] = [[] for _ in range(windows)]
        if not len(keys):
            return out
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        inverse = inverse.ravel()
        total = _sum_by(inverse, piece_ns, len(unique))
        gaps = np.bincount(inverse, minlength=len(unique))
        for row in _top_rows(unique[:, 0], total, TOP_IN_RUN, TOP_IN_STEP):
            w, cause, call, operator = unique[row].tolist()
            out[w].append(
                IdleContributor(
                    cause=IDLE_CAUSES[cause],
                    host_call=tree.names[call] if call != _NO_NAME else None,
                    cpu_operator=tree.names[operator] if operator != _NO_NAME else None,
                    idle_ns=int(total[row]),
                    gaps=int(gaps[row]),
                )
            )
        return out

    def _longest_gaps(
        self,
        window: np.ndarray,
        piece_lo: np.ndarray,
        piece_ns: np.ndarray,
        causes: GapCauses,
        step_of_piece: np.ndarray,
        windows: int,
    ) -> list[list[IdleGap]]:
        out: list[list[IdleGap]] = [[] for _ in range(windows)]
        for row in _top_rows(window, piece_ns, GAPS_IN_RUN, GAPS_IN_STEP):
            w = int(window[row])
            call, operator = int(causes.host_call[row]), int(causes.cpu_operator[row])
            out[w].append(
                IdleGap(
                    rank=self.rank,
                    step=int(step_of_piece[row]) if step_of_piece[row] >= 0 else None,
                    start_ns=int(piece_lo[row]),
                    dur_ns=int(piece_ns[row]),
                    cause=IDLE_CAUSES[int(causes.cause[row])],
                    host_call=self.tree.node_name(call) if call >= 0 else None,
                    cpu_operator=self.tree.node_name(operator) if operator >= 0 else None,
                )
            )
        return out

    def _gpu_windows(self, windows: int) -> tuple[np.ndarray, np.ndarray]:
        """(row into self.gpu, window) for every GPU activity: each is in the whole run (window 0)
        and in the window of the step it belongs to."""
        tree = self.tree
        all_rows = np.arange(len(self.gpu))
        window_of_step = np.full(len(tree.steps) + 1, -1, dtype=np.int64)  # [-1]: no step
        window_of_step[self.step_rows] = np.arange(1, windows)
        in_window = window_of_step[tree.step[self.gpu]]
        stepped = in_window >= 0
        rows = np.concatenate([all_rows, all_rows[stepped]])
        return rows, np.concatenate([np.zeros(len(all_rows), dtype=np.int64), in_window[stepped]])

    def _top_kernels(self, windows: int) -> list[list[KernelTime]]:
        tree = self.tree
        rows, window = self._gpu_windows(windows)
        nodes = self.gpu[rows]
        keys = np.stack([window, tree.name[nodes].astype(np.int64)], axis=1)
        out: list[list[KernelTime]] = [[] for _ in range(windows)]
        unique, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
        total = _sum_by(inverse, tree.dur[nodes], len(unique))
        calls = np.bincount(inverse, minlength=len(unique))
        for row in _top_rows(unique[:, 0], total, TOP_IN_RUN, TOP_IN_STEP):
            out[int(unique[row, 0])].append(
                KernelTime(
                    name=tree.names[int(unique[row, 1])],
                    kind=GPU_KINDS[int(self.kind[rows[first[row]]])],
                    calls=int(calls[row]),
                    gpu_ns=int(total[row]),
                )
            )
        return out

    def _top_operators(self, windows: int) -> list[list[OperatorTime]]:
        tree, context = self.tree, self.context
        rows, window = self._gpu_windows(windows)
        nodes = self.gpu[rows]
        launcher = np.where(
            context.innermost_operator[nodes] >= 0,
            context.innermost_operator[nodes],
            context.nearest_frame[nodes],
        )
        launcher = np.where(launcher >= 0, launcher, tree.parent[nodes])  # the runtime call
        name = np.where(launcher >= 0, tree.name[np.maximum(launcher, 0)], _NO_NAME)
        # work with no launch in the trace: each activity its own call (negative: not a node)
        launcher = np.where(launcher >= 0, launcher, -2 - nodes)
        out: list[list[OperatorTime]] = [[] for _ in range(windows)]
        # first per (window, name, launcher instance), then per (window, name)
        instances, inverse = np.unique(
            np.stack([window, name.astype(np.int64), launcher], axis=1), axis=0, return_inverse=True
        )
        inverse = inverse.ravel()
        instance_ns = _sum_by(inverse, tree.dur[nodes], len(instances))
        instance_kernels = np.bincount(inverse, minlength=len(instances))
        named, by_name = np.unique(instances[:, :2], axis=0, return_inverse=True)
        by_name = by_name.ravel()
        total = _sum_by(by_name, instance_ns, len(named))
        calls = np.bincount(by_name, minlength=len(named))
        kernels = np.bincount(by_name, weights=instance_kernels, minlength=len(named))
        example = np.zeros(len(named), dtype=np.int64)
        example[by_name] = instances[:, 2]
        for row in _top_rows(named[:, 0], total, TOP_IN_RUN, TOP_IN_STEP):
            node = int(example[row])
            out[int(named[row, 0])].append(
                OperatorTime(
                    name=tree.names[int(named[row, 1])] if node >= 0 else UNLAUNCHED,
                    layer=LAYERS[tree.layer[node]] if node >= 0 else "none",
                    calls=int(calls[row]),
                    kernels=int(kernels[row]),
                    gpu_ns=int(total[row]),
                )
            )
        return out


def _name_or_none(tree: CallTree, nodes: np.ndarray) -> np.ndarray:
    return np.where(nodes >= 0, tree.name[np.maximum(nodes, 0)], _NO_NAME).astype(np.int64)


def _sum_by(group: np.ndarray, values: np.ndarray, groups: int) -> np.ndarray:
    """Exact integer sums of `values` per group id (bincount's float64 sums are exact below
    2**53 ns, a hundred days)."""
    sums = np.bincount(group, weights=values.astype(np.float64), minlength=groups)
    return np.rint(sums).astype(np.int64)


def _top_rows(window: np.ndarray, value: np.ndarray, in_run: int, in_step: int) -> list[int]:
    """Rows with the largest `value` in each window: `in_run` of window 0, `in_step` of others;
    by window, then largest first."""
    order = np.lexsort((-value, window))
    window_sorted = window[order]
    starts = np.searchsorted(window_sorted, window_sorted, side="left")
    ordinal = np.arange(len(order)) - starts
    limit = np.where(window_sorted == 0, in_run, in_step)
    return order[ordinal < limit].tolist()


def _concat_gaps(parts: list[IdleGaps]) -> IdleGaps:
    return IdleGaps(
        rank=np.concatenate([p.rank for p in parts]) if parts else np.zeros(0, np.int32),
        step=np.concatenate([p.step for p in parts]) if parts else np.zeros(0, np.int64),
        start_ns=np.concatenate([p.start_ns for p in parts]) if parts else np.zeros(0, np.int64),
        dur_ns=np.concatenate([p.dur_ns for p in parts]) if parts else np.zeros(0, np.int64),
        cause=[c for p in parts for c in p.cause],
        host_call=[c for p in parts for c in p.host_call],
        cpu_operator=[c for p in parts for c in p.cpu_operator],
    )


# -- the sentence a verdict quotes ---------------------------------------------------------------
def share(part: float, whole: float) -> str:
    """A share as a percentage a person reads at a glance: 38%, 0.4%, <0.1%, >99.9%."""
    if whole <= 0 or part <= 0:
        return "0%"
    value = 100.0 * part / whole
    if value >= 100:
        return "100%"
    if value >= 99.95:  # rounded, it would read "100.0%", as if nothing else ran
        return ">99.9%"
    if value > 99:  # 99.6% is not "100%": an idle share of 100% would say nothing ran
        return f"{value:.1f}%"
    if value >= 10:
        return f"{value:.0f}%"
    return f"{value:.1f}%" if value >= 0.1 else "<0.1%"


def contributor_phrase(contributor: IdleContributor) -> str:
    """What the host was doing, as the end of "…% of that idle time …"."""
    call, operator = contributor.host_call, contributor.cpu_operator
    if contributor.cause == "sync":
        where = f" in {operator}" if operator else ""
        return f"comes from a blocking {call or 'synchronisation'}{where}"
    if contributor.cause == "launch":
        where = f" in {operator}" if operator else ""
        return f"the host was inside kernel launches ({call or 'launch calls'}{where})"
    if contributor.cause == "scheduler":
        return "the host was in the engine's scheduler"
    if contributor.cause == "host":
        return "the host was running Python or CPU operators between launches"
    return "nothing was recorded on the host"


def idle_summary(breakdown: StepBreakdown) -> str:
    """One sentence on a span's GPU idle time and its largest cause, for a verdict to quote:
    "the GPU sat idle 38% of step 12 on rank 0; 71% of that idle time comes from a blocking
    cudaStreamSynchronize in aten::item"."""
    where = f"{breakdown.where} on rank {breakdown.rank}"
    idle = breakdown.idle_ns
    if breakdown.span_ns <= 0 or idle <= 0:
        return f"the GPU was busy throughout {where}"
    sentence = f"the GPU sat idle {share(idle, breakdown.span_ns)} of {where}"
    if breakdown.idle_contributors:
        top = breakdown.idle_contributors[0]
        sentence += f"; {share(top.idle_ns, idle)} of that idle time {contributor_phrase(top)}"
    return sentence


__all__ = [
    "GPU_KINDS",
    "IDLE_CAUSES",
    "IDLE_CAUSE_LABELS",
    "GpuBusy",
    "IdleContributor",
    "IdleGap",
    "IdleGaps",
    "IdleTime",
    "KernelTime",
    "OperatorTime",
    "RunBreakdown",
    "StepBreakdown",
    "idle_summary",
    "run_breakdown",
]
