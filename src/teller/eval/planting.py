"""Plant a known fault in a real trace, and move everything the fault would have moved.

The planted-fault suite (bench/planted.py) scores teller on real captures whose truth is known:
one kernel instance made slower by a set amount, a delay inserted on one host thread, one device's
host stalled before a collective. A planted trace is only a fair test if it is one the hardware
could have produced, so the fault is not painted on: `replay` re-derives every start time from the
constraints that held in the capture and lets the delay flow through them.

* A GPU op starts no earlier than its stream predecessor ends, its launching call returns, and the
  ops it waited on (cross-stream waits, where the trace shows them) end. Slack in the capture is
  slack in the replay: a kernel that sat idle 30 µs behind a late launch absorbs 30 µs of an
  upstream delay; one that ran back to back absorbs none.
* A host thread moves only after a call that waits on the GPU returns later: a blocking call
  (`cudaStreamSynchronize`, `cudaDeviceSynchronize`, `cudaEventSynchronize`, a synchronous or
  pageable device-to-host copy, as behind `aten::item` and `.cpu()`) whose GPU work now ends
  later, or a launch into a full launch queue whose oldest entry now starts later. From that
  return on, everything the thread does, and the GPU work it launches, moves by the same amount.
* A host delay moves everything after it on its thread; its GPU work moves by what the queue
  ahead of each launch does not absorb.

Each host thread's displacement is a non-decreasing step function of time, so nesting on a thread
survives (an enclosing range grows by what happened inside it) and no two ops of a stream overlap
that did not overlap before. The format readers and writers (`planting_kineto`, `planting_nsys`)
build a `Timeline` from a file and write a moved copy; nothing here knows a file format.

What the replay cannot see it leaves alone: cross-stream waits that leave no mark in the timing,
other threads that wait on a delayed one (a thread moves only on its own calls), polling loops
(`cudaEventQuery`) that spin until the GPU is done.
"""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass, field

import numpy as np

from teller.ingest.comm_names import is_comm_kernel

#: GPU op kinds (`Timeline.gpu_kind`).
KERNEL, COPY, SET = 0, 1, 2
#: Host op roles (`Timeline.host_role`): what the host event is to the replay.
OPERATOR, RUNTIME, ANNOTATION, OTHER = 0, 1, 2, 3

#: Host calls that block until the GPU work they wait on has finished.
BLOCKING_CALL = re.compile(
    r"^(?:cuda|hip)(?:StreamSynchronize|DeviceSynchronize|EventSynchronize|CtxSynchronize"
    r"|Memcpy|MemcpyWithStream|Memcpy2D|MemcpyDtoH|MemcpyHtoD|MemcpyFromSymbol)$"
)
#: A device-to-host copy into pageable memory: its asynchronous launch returns only when done.
PAGEABLE_DTOH = re.compile(r"DtoH.*Pageable", re.IGNORECASE)

#: Kernel families the suite plants in, by name, tried in this order (attention kernels carry
#: CUTLASS types in their names, so attention comes before GEMM). Attention: the attention compute
#: kernels, not the KV-cache writes beside them; norm: RMS, layer, batch and group norms; GEMM:
#: cuBLAS/cuBLASLt/CUTLASS/hipBLASLt (`Cijk_`) and Triton matmuls, not fbgemm's sparse helpers.
KERNEL_KINDS: dict[str, re.Pattern[str]] = {
    "attention": re.compile(
        r"flash_fwd|flash_bwd|fmha|attn_fwd|unified_attention|paged_?attention|attention_kernel",
        re.IGNORECASE,
    ),
    "norm": re.compile(r"rms_?norm|layer_?norm|batch_?norm|group_?norm|bn_fw|bn_bw", re.IGNORECASE),
    "gemm": re.compile(r"(?<!fb)gemm|cutlass|cublas|xmma|^Cijk_|matmul|wgmma", re.IGNORECASE),
}
#: An op that starts within this of an op on another stream ending, and not sooner although it
#: was ready, is taken to have waited on it.
WAIT_GAP_NS = 30_000
#: A gap up to this between two ops of a stream, the second already queued, is the device's
#: dispatch overhead, not idle time.
DISPATCH_GAP_NS = 10_000
#: Launched-but-not-started operations a device's launch queue holds (CUDA's default push
#: buffer), and how soon after the oldest starts a launch into a full queue returns.
LAUNCH_QUEUE_DEPTH = 1024
QUEUE_WAKE_NS = 50_000
#: Timestamp tolerance: a blocking call that returns within this of a GPU op's end waited on it.
TIE_NS = 2_000


@functools.cache
def kernel_kind(name: str) -> str | None:
    """The family of a kernel name: "gemm", "attention", "norm", "nccl" (any collective), or
    None. Cached: a trace has thousands of kernels under a few dozen long templated names."""
    if is_comm_kernel(name):
        return "nccl"
    for kind, pattern in KERNEL_KINDS.items():
        if pattern.search(name):
            return kind
    return None


@dataclass
class Timeline:
    """A trace's timed activity, as the replay sees it. Times are ns on the file's own clock.

    `gpu_launch` is the host row of the call that launched a GPU op (-1 when the trace does not
    say); `host_thread` numbers each (pid, tid) pair (`threads`). `deps` are (before, after) GPU
    rows where `after` waited on `before` across streams; `collectives` are groups of GPU rows
    that form one collective instance (all end when the last member has arrived).
    """

    gpu_start: np.ndarray
    gpu_end: np.ndarray
    gpu_device: np.ndarray
    gpu_stream: np.ndarray
    gpu_kind: np.ndarray
    gpu_name: list[str]
    gpu_launch: np.ndarray
    host_start: np.ndarray
    host_end: np.ndarray
    host_thread: np.ndarray
    host_role: np.ndarray
    host_name: list[str]
    host_sync: np.ndarray  # bool: a blocking call
    host_sync_stream: np.ndarray  # the stream a blocking call waits on, -1 the whole device
    threads: list[tuple[object, object]]  # thread number → (pid, tid) as the file writes them
    deps: list[tuple[int, int]] = field(default_factory=list)
    collectives: list[list[int]] = field(default_factory=list)
    collective_base_ns: int = 0

    @property
    def gpu_thread(self) -> np.ndarray:
        """The host thread that launched each GPU op, -1 when unknown."""
        launch = self.gpu_launch
        out = np.full(len(launch), -1, dtype=np.int64)
        linked = launch >= 0
        out[linked] = self.host_thread[launch[linked]]
        return out

    def thread_pid(self, thread: int) -> object:
        return self.threads[thread][0]

    def launching_op(self, gpu_row: int) -> int:
        """Host row of the innermost operator enclosing the call that launched `gpu_row`."""
        launch = int(self.gpu_launch[gpu_row])
        if launch < 0:
            return -1
        return self.enclosing(launch, OPERATOR)

    def enclosing(self, host_row: int, role: int) -> int:
        """Innermost host row of `role` on the same thread whose span contains `host_row`'s."""
        thread = self.host_thread[host_row]
        start, end = self.host_start[host_row], self.host_end[host_row]
        candidates = np.flatnonzero(
            (self.host_thread == thread)
            & (self.host_role == role)
            & (self.host_start <= start)
            & (self.host_end >= end)
        )
        candidates = candidates[candidates != host_row]
        if not len(candidates):
            return -1
        innermost = np.lexsort((self.host_end[candidates], -self.host_start[candidates]))[0]
        return int(candidates[innermost])

    def add_wait_deps(self) -> int:
        """Cross-stream waits the trace shows, as `deps`; returns how many were added.

        Kineto and nsys record a `cudaStreamWaitEvent` call but not which streams it joins, so a
        wait is read from timing: an op that was ready (launched, its stream predecessor done)
        more than `WAIT_GAP_NS` before it started, and started within `WAIT_GAP_NS` of an op of
        another stream of its device ending, waited on that op. This is what NCCL's streams and
        the compute stream do to each other around every collective."""
        count = len(self.gpu_start)
        if not count:
            return 0
        order = np.lexsort((np.arange(count), self.gpu_start))
        ready = np.where(
            self.gpu_launch >= 0,
            self.host_end[np.maximum(self.gpu_launch, 0)],
            np.iinfo(np.int64).max,
        )
        last_end: dict[tuple[int, int], int] = {}
        for row in order.tolist():
            key = (int(self.gpu_device[row]), int(self.gpu_stream[row]))
            if key in last_end:
                ready[row] = max(ready[row], last_end[key])
            last_end[key] = max(last_end.get(key, 0), int(self.gpu_end[row]))
        waiting = np.flatnonzero(self.gpu_start - ready > WAIT_GAP_NS)
        added = 0
        for device in np.unique(self.gpu_device[waiting]).tolist():
            rows = np.flatnonzero(self.gpu_device == device)
            rows = rows[np.argsort(self.gpu_end[rows], kind="stable")]
            ends = self.gpu_end[rows]
            for waiter in waiting[self.gpu_device[waiting] == device].tolist():
                start = int(self.gpu_start[waiter])
                first = int(np.searchsorted(ends, start - WAIT_GAP_NS, side="left"))
                last = int(np.searchsorted(ends, start, side="right"))
                for k in range(last - 1, first - 1, -1):
                    before = int(rows[k])
                    if (
                        self.gpu_stream[before] != self.gpu_stream[waiter]
                        and ends[k] > ready[waiter]
                    ):
                        self.deps.append((before, waiter))
                        added += 1
                        break
        return added


@dataclass(frozen=True)
class HostDelay:
    """The host thread `thread` does nothing for `added_ns` from `at_ns` on."""

    thread: int
    at_ns: int
    added_ns: int


@dataclass
class Replayed:
    """Where every op of a timeline lands once the faults have played out."""

    gpu_start: np.ndarray
    gpu_end: np.ndarray
    jump_times: dict[int, list[int]]  # thread → times its displacement steps up (sorted)
    jump_totals: dict[int, list[int]]  # thread → displacement from that time on
    sync_delays: list[tuple[int, int]]  # (host row of a blocking call, how much later it returned)
    notes: list[str] = field(default_factory=list)

    def host_shift(self, thread: int, at_ns: int) -> int:
        """How far the thread's activity at `at_ns` (original clock) has moved."""
        times = self.jump_times.get(thread)
        if not times:
            return 0
        position = bisect.bisect_right(times, at_ns)
        return self.jump_totals[thread][position - 1] if position else 0

    def host_shifts(self, thread: np.ndarray, at_ns: np.ndarray) -> np.ndarray:
        out = np.zeros(len(at_ns), dtype=np.int64)
        for number, times in self.jump_times.items():
            rows = np.flatnonzero(thread == number)
            if not len(rows) or not times:
                continue
            position = np.searchsorted(np.asarray(times), at_ns[rows], side="right")
            totals = np.concatenate([[0], np.asarray(self.jump_totals[number], dtype=np.int64)])
            out[rows] = totals[position]
        return out


class _Jumps:
    """One thread's displacement: a step function built as the replay resolves blocking calls."""

    def __init__(self) -> None:
        self.times: list[int] = []
        self.amounts: list[int] = []
        self.totals: list[int] = []

    def add(self, at_ns: int, amount: int) -> None:
        position = bisect.bisect_right(self.times, at_ns)
        self.times.insert(position, at_ns)
        self.amounts.insert(position, amount)
        if position == len(self.totals):  # the usual case: calls resolve in time order
            self.totals.append((self.totals[-1] if self.totals else 0) + amount)
        else:
            self.totals = np.cumsum(self.amounts).tolist()

    def at(self, at_ns: int) -> int:
        position = bisect.bisect_right(self.times, at_ns)
        return self.totals[position - 1] if position else 0


def replay(
    timeline: Timeline,
    slower: dict[int, int] | None = None,
    delays: list[HostDelay] | None = None,
    max_rounds: int = 6,
) -> Replayed:
    """New start and end of every GPU op, and each host thread's displacement, once GPU ops
    `slower` (row → added ns) run longer and the host `delays` have happened."""
    slower = slower or {}
    delays = delays or []
    t = timeline
    count = len(t.gpu_start)
    order = np.lexsort((np.arange(count), t.gpu_start))
    previous = _stream_predecessors(t, order)
    stream_slack, launch_slack = _slack(t, previous)
    launch = t.gpu_launch
    gpu_thread = t.gpu_thread
    launch_at = np.where(launch >= 0, t.host_start[np.maximum(launch, 0)], 0)
    waits_on: dict[int, list[int]] = {}
    for before, after in t.deps:
        waits_on.setdefault(after, []).append(before)
    member_of = {row: k for k, rows in enumerate(t.collectives) for row in rows}
    blocks = _blocking_calls(t, gpu_thread)
    start_shift = np.zeros(count, dtype=np.int64)
    end_shift = np.zeros(count, dtype=np.int64)
    notes: list[str] = []
    for _ in range(max_rounds):
        before = (start_shift.copy(), end_shift.copy())
        jumps = {thread: _Jumps() for thread in range(len(t.threads))}
        for delay in delays:
            jumps[delay.thread].add(delay.at_ns, delay.added_ns)
        sync_delays: list[tuple[int, int]] = []
        next_block = 0
        for row in order.tolist():
            while next_block < len(blocks) and blocks[next_block].returned < t.gpu_start[row]:
                blocks[next_block].resolve(t, start_shift, end_shift, jumps, sync_delays)
                next_block += 1
            shift = 0
            if launch[row] >= 0:
                shift = max(
                    shift, jumps[int(gpu_thread[row])].at(int(launch_at[row])) - launch_slack[row]
                )
            if previous[row] >= 0:
                shift = max(shift, int(end_shift[previous[row]] - stream_slack[row]))
            for dep in waits_on.get(row, ()):
                shift = max(shift, int(t.gpu_end[dep] + end_shift[dep] - t.gpu_start[row]))
            start_shift[row] = shift
            end = shift + slower.get(row, 0)
            if row in member_of:  # a collective ends when its last member has arrived
                last = max(
                    int(t.gpu_start[r] + start_shift[r]) for r in t.collectives[member_of[row]]
                )
                end = last + t.collective_base_ns - int(t.gpu_end[row])
            end_shift[row] = end
        while next_block < len(blocks):
            blocks[next_block].resolve(t, start_shift, end_shift, jumps, sync_delays)
            next_block += 1
        if np.array_equal(before[0], start_shift) and np.array_equal(before[1], end_shift):
            break
    else:
        notes.append(f"replay did not settle in {max_rounds} rounds")
    if not t.deps and any(kernel_kind(t.gpu_name[r]) == "nccl" for r in slower):
        notes.append("no cross-stream waits visible: work on other streams did not move")
    return Replayed(
        gpu_start=t.gpu_start + start_shift,
        gpu_end=t.gpu_end + end_shift,
        jump_times={k: j.times for k, j in jumps.items() if j.times},
        jump_totals={k: j.totals for k, j in jumps.items() if j.times},
        sync_delays=sync_delays,
        notes=notes,
    )


def _stream_predecessors(t: Timeline, order: np.ndarray) -> np.ndarray:
    previous = np.full(len(order), -1, dtype=np.int64)
    last: dict[tuple[int, int], int] = {}
    for row in order.tolist():
        key = (int(t.gpu_device[row]), int(t.gpu_stream[row]))
        previous[row] = last.get(key, -1)
        last[key] = row
    return previous


def _slack(t: Timeline, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How much later each GPU op's stream predecessor could end, and how much later its launch
    could return, without the op starting later.

    An op that was launched before its predecessor ended sat in the queue: the gap between the
    two is the device's dispatch overhead (a few µs, which a later start keeps), and the time it
    sat queued is slack for a late launch. An op launched after its predecessor ended ran as soon
    as the launch let it: the GPU's idle time before the launch is slack for a late predecessor,
    and none is left for a late launch. A gap wider than `DISPATCH_GAP_NS` in front of a queued
    op (or one of unknown launch) is a wait on something else, and slack too."""
    linked = t.gpu_launch >= 0
    ready = np.where(linked, t.host_end[np.maximum(t.gpu_launch, 0)], np.iinfo(np.int64).min)
    has_previous = previous >= 0
    previous_end = np.where(has_previous, t.gpu_end[np.maximum(previous, 0)], t.gpu_start)
    gap = np.maximum(t.gpu_start - previous_end, 0)
    queued = ready <= previous_end
    stream_slack = np.where(
        queued,
        np.where(gap > DISPATCH_GAP_NS, gap, 0),
        np.minimum(gap, np.maximum(ready - previous_end, 0)),
    )
    launch_slack = np.where(linked & queued, np.maximum(t.gpu_start - ready, 0), 0)
    return stream_slack.astype(np.int64), launch_slack.astype(np.int64)


@dataclass
class _Block:
    """A host call that cannot return before some GPU ops are done (a blocking sync) or have
    started (a launch into a full queue). `latency` is how long after that it returned."""

    call: int
    returned: int
    waited: np.ndarray
    on_start: bool
    latency: int

    def resolve(
        self,
        t: Timeline,
        start_shift: np.ndarray,
        end_shift: np.ndarray,
        jumps: dict[int, _Jumps],
        delays: list[tuple[int, int]],
    ) -> None:
        """If what the call waits on now happens later than it returned in the capture, its
        thread moves from the return on."""
        if not len(self.waited):
            return
        rows = self.waited
        done = (
            (t.gpu_start[rows] + start_shift[rows])
            if self.on_start
            else (t.gpu_end[rows] + end_shift[rows])
        )
        thread = int(t.host_thread[self.call])
        already = jumps[thread].at(int(t.host_start[self.call]))
        late = int(done.max()) + self.latency - (self.returned + already)
        if late > 0:
            jumps[thread].add(self.returned, late)
            delays.append((self.call, late))


def _blocking_calls(t: Timeline, gpu_thread: np.ndarray) -> list[_Block]:
    """Every blocking call and every launch into a full queue, in the order they returned."""
    blocks = _sync_blocks(t, gpu_thread) + _queue_blocks(t)
    blocks.sort(key=lambda b: (b.returned, b.call))
    return blocks


def _sync_blocks(t: Timeline, gpu_thread: np.ndarray) -> list[_Block]:
    """A blocking call waits on the GPU ops launched by its process before it began (ops of
    unknown launch: on a device its process drives), on its stream if the call names one, that
    ended by the time it returned. It returned `latency` after the last of them ended, or, if
    they were all done before it began, its own duration after they end."""
    pid_code: dict[object, int] = {}
    thread_pid = np.array([pid_code.setdefault(pid, len(pid_code)) for pid, _ in t.threads])
    gpu_pid = np.where(gpu_thread >= 0, thread_pid[np.maximum(gpu_thread, 0)], -1)
    launched_at = np.where(
        t.gpu_launch >= 0, t.host_start[np.maximum(t.gpu_launch, 0)], t.gpu_start
    )
    driven: dict[int, set[int]] = {}
    for pid, device in zip(
        gpu_pid[gpu_thread >= 0].tolist(), t.gpu_device[gpu_thread >= 0].tolist(), strict=True
    ):
        driven.setdefault(pid, set()).add(device)
    out = []
    for call in np.flatnonzero(t.host_sync).tolist():
        pid = int(thread_pid[t.host_thread[call]])
        began, returned = int(t.host_start[call]), int(t.host_end[call])
        ours = (gpu_pid == pid) | (
            (gpu_thread < 0) & np.isin(t.gpu_device, list(driven.get(pid, ())))
        )
        mask = ours & (launched_at < began) & (t.gpu_end <= returned + TIE_NS)
        if t.host_sync_stream[call] >= 0:
            mask &= t.gpu_stream == t.host_sync_stream[call]
        waited = np.flatnonzero(mask)
        if not len(waited):
            continue
        done = int(t.gpu_end[waited].max())
        latency = returned - done if done >= began - TIE_NS else returned - began
        out.append(_Block(call, returned, waited, False, max(latency, 0)))
    return out


def _queue_blocks(t: Timeline) -> list[_Block]:
    """Launches that must wait for room in the device's launch queue.

    CUDA queues at most about `LAUNCH_QUEUE_DEPTH` launched-but-not-started operations per
    device; a launch into a full queue returns only when the oldest one starts (the long
    `cudaLaunchKernel` calls of a GPU-bound capture). The depth taken is the larger of that and
    the deepest backlog the capture itself shows, so the capture satisfies it everywhere."""
    out = []
    linked = np.flatnonzero(t.gpu_launch >= 0)
    for device in np.unique(t.gpu_device[linked]).tolist():
        rows = linked[t.gpu_device[linked] == device]
        calls = t.gpu_launch[rows]
        order = np.lexsort((rows, t.host_start[calls]))
        rows, calls = rows[order], calls[order]
        _, first = np.unique(calls, return_index=True)
        keep = np.sort(first)
        rows, calls = rows[keep], calls[keep]
        started = np.sort(t.gpu_start[rows])
        backlog = np.arange(len(rows)) - np.searchsorted(started, t.host_start[calls], side="right")
        depth = max(LAUNCH_QUEUE_DEPTH, int(backlog.max(initial=0)) + 1)
        for k in range(depth, len(rows)):
            blocker, call = int(rows[k - depth]), int(calls[k])
            returned = int(t.host_end[call])
            waited_for = returned - int(t.gpu_start[blocker])
            latency = waited_for if 0 <= waited_for <= QUEUE_WAKE_NS else 0
            out.append(_Block(call, returned, np.array([blocker]), True, latency))
    return out


def step_windows(t: Timeline, pattern: re.Pattern[str]) -> list[tuple[int, int, int, str]]:
    """Annotated steps: (host row, start, end, name) of the outermost host annotations whose
    name matches `pattern`, in time order. The suite's own truth, independent of how teller
    finds steps."""
    rows = [
        r
        for r in np.flatnonzero(t.host_role == ANNOTATION).tolist()
        if pattern.match(t.host_name[r])
    ]
    rows.sort(key=lambda r: (t.host_start[r], -t.host_end[r]))
    outer: list[int] = []
    for row in rows:
        if (
            outer
            and t.host_thread[outer[-1]] == t.host_thread[row]
            and t.host_end[row] <= t.host_end[outer[-1]]
        ):
            continue
        outer.append(row)
    return [(r, int(t.host_start[r]), int(t.host_end[r]), t.host_name[r]) for r in outer]
