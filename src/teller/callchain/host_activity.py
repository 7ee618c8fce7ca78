"""What a rank's host was doing while its GPU sat idle: the cause of each idle gap.

An idle GPU is waiting for its host. Which host activity overlaps the gap says why, and each
cause has a different fix:

* `sync`: the host was blocked in a synchronising call (`cudaStreamSynchronize`,
  `cudaDeviceSynchronize`, `cudaEventSynchronize`, `cudaFree`, a blocking `cudaMemcpy`, or a `cudaMemcpyAsync`
  into pageable memory, which blocks too). While blocked it queues nothing, so the GPU drains and
  stays idle until the host has run on to the next launch: a gap that opens while the host is in
  such a call is the sync's, whatever follows it. The CPU operator that made the call
  (`aten::item`, `aten::to` …) is what to change.
* `launch`: the host was inside kernel launches (`cudaLaunchKernel`, `cuLaunchKernel`,
  `cudaGraphLaunch`, async copies …): the GPU ran out of work as fast as it was launched.
* `scheduler`: the host was in the serving engine's scheduler, outside the model's forward.
* `host`: the host was in CPU operators or Python with no runtime call at that moment.
* `unrecorded`: no host event overlaps the gap (the host was off-CPU, or not traced).

The rank's host is all its CPU threads; where they differ at one instant the first cause above
wins (a blocked thread explains an idle GPU better than a busy one beside it). A gap's cause is
the one covering most of it, except that a gap opened inside a blocking call is always `sync`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from teller.callchain.intervals import Intervals
from teller.callchain.tree import NESTING_TOLERANCE_NS, CallTree
from teller.ingest.schema import LAYER_CODE

IDLE_CAUSES: tuple[str, ...] = ("sync", "launch", "scheduler", "host", "unrecorded")
IDLE_CAUSE_LABELS: dict[str, str] = {
    "sync": "blocking sync",
    "launch": "launch-bound",
    "scheduler": "scheduler",
    "host": "Python/host ops",
    "unrecorded": "nothing recorded",
}
SYNC, LAUNCH, SCHEDULER, HOST, UNRECORDED = range(len(IDLE_CAUSES))

#: Runtime calls that block the host until the GPU (or a copy) is done. Asynchronous copies are
#: not in it: they block only into pageable memory, which the copy's own name tells (`PAGEABLE`).
#: Freeing device memory (`cudaFree`, `cuMemFree`, not the stream-ordered `…FreeAsync`)
#: synchronises the whole device, and the first one in a process sets up the CUDA context.
BLOCKING_CALL = re.compile(
    r"^(?:cuda|hip|cu)(?:(?:Stream|Device|Event|Ctx)Synchronize|Memcpy(?!\w*Async)"
    r"|(?:Mem)?Free(?!\w*Async))"
)
#: Runtime calls that enqueue GPU work without waiting for it.
LAUNCH_CALL = re.compile(r"^(?:cuda|hip|cu)(?:\w*Launch|(?:Memcpy|Memset)\w*Async)")
#: A copy into pageable host memory: its launching call returns only when the copy is done.
PAGEABLE = re.compile(r"Pageable", re.IGNORECASE)
#: Python frames and engine annotations of a serving engine's scheduler (vLLM `…/sched/
#: scheduler.py`, SGLang `managers/scheduler.py`, `schedule_policy.py`, a `schedule` range).
SCHEDULER_CONTEXT = re.compile(r"schedul", re.IGNORECASE)
#: Frames of the model's forward (`model_runner.py(…): forward`, `nn.Module: …`); a step
#: annotation's subtree counts as forward too. Scheduler frames enclose the forward they call,
#: so only scheduler time outside any forward is the scheduler's.
FORWARD_CONTEXT = re.compile(r"forward|nn\.Module", re.IGNORECASE)

_OPERATOR_CODES = (LAYER_CODE["cpu_op"], LAYER_CODE["comm"])
_CONTEXT_CODES = (*_OPERATOR_CODES, LAYER_CODE["python"], LAYER_CODE["engine"])
_FRAME_CODES = (LAYER_CODE["python"], LAYER_CODE["engine"])


@dataclass(frozen=True)
class NodeContext:
    """Per tree node: the host operators and frames around it (node ids, -1 for none)."""

    innermost_operator: np.ndarray  # nearest CPU operator at or above the node
    outermost_operator: np.ndarray  # the operator the user called (`aten::item`, not its parts)
    nearest_frame: np.ndarray  # nearest CPU operator, Python frame or annotation at or above
    in_forward: np.ndarray  # bool: inside a step annotation or a forward frame
    in_scheduler: np.ndarray  # bool: inside a scheduler frame or annotation
    blocking: np.ndarray  # bool: a runtime call that blocks the host (`BLOCKING_CALL`, pageable)
    launching: np.ndarray  # bool: a runtime call that enqueues GPU work and does not block


def node_context(tree: CallTree) -> NodeContext:
    """Each node's `NodeContext`, one vectorised pass per tree depth (parents come first)."""
    count = len(tree)
    on_cpu = tree.stream < 0
    is_operator = on_cpu & np.isin(tree.layer, _OPERATOR_CODES)
    is_context = on_cpu & np.isin(tree.layer, _CONTEXT_CODES)
    is_frame = on_cpu & np.isin(tree.layer, _FRAME_CODES)
    scheduler_name = _names_matching(tree.names, SCHEDULER_CONTEXT)
    forward_name = _names_matching(tree.names, FORWARD_CONTEXT)
    is_step = np.zeros(count, dtype=bool)
    is_step[tree.steps.node] = True
    starts_forward = is_step | (is_frame & forward_name[tree.name])
    starts_scheduler = is_frame & scheduler_name[tree.name]

    innermost = np.full(count, -1, dtype=np.int64)
    outermost = np.full(count, -1, dtype=np.int64)
    frame = np.full(count, -1, dtype=np.int64)
    in_forward = np.zeros(count, dtype=bool)
    in_scheduler = np.zeros(count, dtype=bool)
    order = np.argsort(tree.depth, kind="stable")
    bounds = np.searchsorted(tree.depth[order], np.arange(int(tree.depth.max(initial=0)) + 2))
    for level in range(len(bounds) - 1):
        nodes = order[bounds[level] : bounds[level + 1]]
        parent = tree.parent[nodes]
        has_parent = parent >= 0
        up = np.where(has_parent, parent, 0)  # read only where has_parent
        own = np.where(is_operator[nodes], nodes, -1)
        innermost[nodes] = np.where(own >= 0, own, np.where(has_parent, innermost[up], -1))
        above = np.where(has_parent, outermost[up], -1)
        outermost[nodes] = np.where(above >= 0, above, own)
        own_frame = np.where(is_context[nodes], nodes, -1)
        frame[nodes] = np.where(own_frame >= 0, own_frame, np.where(has_parent, frame[up], -1))
        in_forward[nodes] = starts_forward[nodes] | (has_parent & in_forward[up])
        in_scheduler[nodes] = starts_scheduler[nodes] | (has_parent & in_scheduler[up])

    is_runtime = on_cpu & (tree.layer == LAYER_CODE["runtime"])
    blocking = is_runtime & _names_matching(tree.names, BLOCKING_CALL)[tree.name]
    pageable_copy = (
        (tree.stream >= 0)
        & (tree.layer == LAYER_CODE["memcpy"])
        & _names_matching(tree.names, PAGEABLE)[tree.name]
        & (tree.parent >= 0)
    )
    blocking[tree.parent[pageable_copy]] = True
    launching = is_runtime & ~blocking & _names_matching(tree.names, LAUNCH_CALL)[tree.name]
    return NodeContext(innermost, outermost, frame, in_forward, in_scheduler, blocking, launching)


def _names_matching(names: list[str], pattern: re.Pattern[str]) -> np.ndarray:
    return np.fromiter((bool(pattern.search(n)) for n in names), dtype=bool, count=len(names))


@dataclass(frozen=True)
class GapCauses:
    """One row per classified idle piece: its cause, and the host call and CPU operator behind it
    (node ids, -1 for none: only `sync` and `launch` pieces name them)."""

    cause: np.ndarray  # int8 index into IDLE_CAUSES
    host_call: np.ndarray  # the blocking call (sync) or the last launch (launch)
    cpu_operator: np.ndarray  # the operator that made that call


class HostActivity:
    """One rank's host activity as nested unions, one per cause in priority order, so the time
    of each cause inside any window is a difference of two measured unions."""

    def __init__(self, tree: CallTree, context: NodeContext, cpu_nodes: np.ndarray) -> None:
        self.context = context
        start, end = tree.start[cpu_nodes], tree.start[cpu_nodes] + tree.dur[cpu_nodes]
        layer = tree.layer[cpu_nodes]
        blocking = context.blocking[cpu_nodes]
        launching = context.launching[cpu_nodes]
        operator_or_call = np.isin(layer, (*_OPERATOR_CODES, LAYER_CODE["runtime"]))
        frame = np.isin(layer, _FRAME_CODES)
        forward = frame & context.in_forward[cpu_nodes]
        scheduler = frame & context.in_scheduler[cpu_nodes] & ~forward
        # cumulative unions: each holds its cause and every cause ranked above it
        self.sync = Intervals.union_of(start[blocking], end[blocking])
        self.up_to_launch = self.sync.union(Intervals.union_of(start[launching], end[launching]))
        up_to_operators = self.up_to_launch.union(
            Intervals.union_of(start[operator_or_call], end[operator_or_call])
        )
        self.up_to_forward = up_to_operators.union(Intervals.union_of(start[forward], end[forward]))
        self.up_to_scheduler = self.up_to_forward.union(
            Intervals.union_of(start[scheduler], end[scheduler])
        )
        self.anything = self.up_to_scheduler.union(Intervals.union_of(start[frame], end[frame]))
        self.blocking_calls = _by_start(cpu_nodes[blocking], tree)
        self.launch_calls = _by_start(cpu_nodes[launching], tree)
        self.tree = tree

    def time_by_cause(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """(windows, causes) ns of each cause's host activity inside each window `[lo, hi)`."""
        sync = self.sync.covered(lo, hi)
        up_to_launch = self.up_to_launch.covered(lo, hi)
        up_to_forward = self.up_to_forward.covered(lo, hi)
        up_to_scheduler = self.up_to_scheduler.covered(lo, hi)
        anything = self.anything.covered(lo, hi)
        out = np.zeros((len(lo), len(IDLE_CAUSES)), dtype=np.int64)
        out[:, SYNC] = sync
        out[:, LAUNCH] = up_to_launch - sync
        out[:, SCHEDULER] = up_to_scheduler - up_to_forward
        out[:, HOST] = (up_to_forward - up_to_launch) + (anything - up_to_scheduler)
        out[:, UNRECORDED] = (hi - lo) - anything
        return out

    def classify(self, lo: np.ndarray, hi: np.ndarray) -> GapCauses:
        """The cause of each idle piece `[lo, hi)` (module docstring)."""
        lo = np.asarray(lo, dtype=np.int64)
        hi = np.asarray(hi, dtype=np.int64)
        time = self.time_by_cause(lo, hi)
        cause = np.argmax(time, axis=1).astype(np.int8)  # ties go to the cause ranked first
        tolerance = NESTING_TOLERANCE_NS
        opened_in_sync = self.sync.covered(lo - tolerance, np.minimum(lo + tolerance, hi)) > 0
        cause[opened_in_sync] = SYNC
        host_call = np.full(len(lo), -1, dtype=np.int64)
        is_sync = cause == SYNC
        at_open = _call_overlapping(self.blocking_calls, self.tree, lo - tolerance, lo + tolerance)
        latest = _call_overlapping(self.blocking_calls, self.tree, lo, hi)
        host_call[is_sync] = np.where(at_open >= 0, at_open, latest)[is_sync]
        is_launch = cause == LAUNCH
        host_call[is_launch] = _call_overlapping(self.launch_calls, self.tree, lo, hi)[is_launch]
        call = np.maximum(host_call, 0)  # read only where host_call >= 0
        operator = np.where(
            is_sync, self.context.outermost_operator[call], self.context.innermost_operator[call]
        )
        operator[host_call < 0] = -1
        return GapCauses(cause=cause, host_call=host_call, cpu_operator=operator)


def _by_start(nodes: np.ndarray, tree: CallTree) -> np.ndarray:
    return nodes[np.argsort(tree.start[nodes], kind="stable")]


def _call_overlapping(
    calls: np.ndarray, tree: CallTree, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """For each window, the last of `calls` (sorted by start) starting before `hi` if it is still
    running at `lo`, else -1."""
    if not len(calls):
        return np.full(len(lo), -1, dtype=np.int64)
    k = np.searchsorted(tree.start[calls], hi, side="left") - 1
    candidate = calls[np.maximum(k, 0)]
    running = (k >= 0) & (tree.start[candidate] + tree.dur[candidate] > lo)
    return np.where(running, candidate, -1)
