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
* A host thread moves only after a blocking call (`cudaStreamSynchronize`, `cudaDeviceSynchronize`,
  `cudaEventSynchronize`, a synchronous or pageable device-to-host copy, as behind `aten::item`
  and `.cpu()`) that returns later because the GPU work it waited on now ends later; from that
  return on, everything the thread does, and the GPU work it launches, moves by the same amount.
* A host delay moves everything after it on its thread; its GPU work moves by what the queue
  ahead of each launch does not absorb.

Each host thread's displacement is a non-decreasing step function of time, so nesting on a thread
survives (an enclosing range grows by what happened inside it) and no two ops of a stream overlap
that did not overlap before. The format readers and writers (`planting_kineto`, `planting_nsys`)
build a `Timeline` from a file and write a moved copy; nothing here knows a file format.

What the replay cannot see it leaves alone, and says so in `Replayed.notes`: cross-stream waits the
trace does not record, a launch queue that fills and blocks the host, polling loops
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
WAIT_GAP_NS = 10_000
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
    gap_before = np.where(previous >= 0, t.gpu_start - t.gpu_end[np.maximum(previous, 0)], 0)
    gap_before = np.maximum(gap_before, 0)
    launch = t.gpu_launch
    gpu_thread = t.gpu_thread
    launch_at = np.where(launch >= 0, t.host_start[np.maximum(launch, 0)], 0)
    queued = np.where(
        launch >= 0, np.maximum(t.gpu_start - t.host_end[np.maximum(launch, 0)], 0), 0
    )
    waits_on: dict[int, list[int]] = {}
    for before, after in t.deps:
        waits_on.setdefault(after, []).append(before)
    member_of = {row: k for k, rows in enumerate(t.collectives) for row in rows}
    syncs = _blocking_calls(t)
    waited = _waited_sets(t, syncs, gpu_thread)
    start_shift = np.zeros(count, dtype=np.int64)
    end_shift = np.zeros(count, dtype=np.int64)
    notes: list[str] = []
    for _ in range(max_rounds):
        before = (start_shift.copy(), end_shift.copy())
        jumps = {thread: _Jumps() for thread in range(len(t.threads))}
        for delay in delays:
            jumps[delay.thread].add(delay.at_ns, delay.added_ns)
        sync_delays: list[tuple[int, int]] = []
        next_sync = 0
        for row in order.tolist():
            while next_sync < len(syncs) and t.host_end[syncs[next_sync]] < t.gpu_start[row]:
                _resolve(t, syncs[next_sync], waited[next_sync], end_shift, jumps, sync_delays)
                next_sync += 1
            shift = 0
            if launch[row] >= 0:
                shift = max(
                    shift, jumps[int(gpu_thread[row])].at(int(launch_at[row])) - queued[row]
                )
            if previous[row] >= 0:
                shift = max(shift, int(end_shift[previous[row]] - gap_before[row]))
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
        while next_sync < len(syncs):
            _resolve(t, syncs[next_sync], waited[next_sync], end_shift, jumps, sync_delays)
            next_sync += 1
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


def _blocking_calls(t: Timeline) -> list[int]:
    rows = np.flatnonzero(t.host_sync)
    return rows[np.lexsort((rows, t.host_end[rows]))].tolist()


def _waited_sets(t: Timeline, syncs: list[int], gpu_thread: np.ndarray) -> list[np.ndarray]:
    """For each blocking call, the GPU ops it can have waited on: launched by its process before
    it began (ops of unknown launch: on a device its process drives), on its stream if the call
    names one, ended by the time it returned."""
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
    for sync in syncs:
        pid = int(thread_pid[t.host_thread[sync]])
        ours = (gpu_pid == pid) | (
            (gpu_thread < 0) & np.isin(t.gpu_device, list(driven.get(pid, ())))
        )
        mask = ours & (launched_at < t.host_start[sync]) & (t.gpu_end <= t.host_end[sync] + TIE_NS)
        if t.host_sync_stream[sync] >= 0:
            mask &= t.gpu_stream == t.host_sync_stream[sync]
        out.append(np.flatnonzero(mask))
    return out


def _resolve(
    t: Timeline,
    sync: int,
    waited: np.ndarray,
    end_shift: np.ndarray,
    jumps: dict[int, _Jumps],
    sync_delays: list[tuple[int, int]],
) -> None:
    """A blocking call returns when the work it waited on is done: if that is now later than it
    returned in the capture, its thread moves from the return on."""
    if not len(waited):
        return
    thread = int(t.host_thread[sync])
    began, returned = int(t.host_start[sync]), int(t.host_end[sync])
    done_before = int(t.gpu_end[waited].max())
    done_now = int((t.gpu_end[waited] + end_shift[waited]).max())
    wake = returned - done_before if done_before >= began - TIE_NS else returned - began
    already = jumps[thread].at(began)
    late = max(returned + already, done_now + max(wake, 0)) - (returned + already)
    if late > 0:
        jumps[thread].add(returned, late)
        sync_delays.append((sync, late))


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
