"""The planted-fault suite: which faults go into which real traces, their truth, and the scoring.

Every variant is one real trace from the shared folder with one fault planted by
`teller.eval.planting.replay` and a record of what was planted (`Planted`): the trace, the step
(by its annotation, or the whole capture where the trace annotates none), the device, the kernel
and the operator that launched it, and the fault's size as a fraction of that step. Choices are
drawn from a generator seeded by the suite seed and the variant's own key, so a variant is the
same whichever subset of the suite is run.

Families:
* `kernel`: one kernel instance of a kind (GEMM, attention, norm, NCCL) runs longer;
* `host_gap`: the launching thread stops between two top-level operators of the step;
* `straggler`: in a multi-process nsys export, one process's host stalls after a blocking sync,
  before a collective that the suite adds to every device, so its peers wait in NCCL;
* `control`: the straggler's collective with no stall (nothing should be flagged).

Scoring (`score`) reads a verdict's JSON and the call tree it came from: the planted op is found in
the tree by name and ordinal on its rank, so the planted step is the step teller put it in.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from teller.eval.planting import (
    KERNEL,
    OPERATOR,
    HostDelay,
    Replayed,
    Timeline,
    kernel_kind,
    replay,
    step_windows,
)
from teller.eval.planting_kineto import KinetoTrace
from teller.eval.planting_nsys import COLLECTIVE_KERNEL, NsysTrace
from teller.ingest.schema import LAYER_CODE

#: Step annotations the suite's truth is measured in (the engines' and PyTorch's own names).
STEP_ANNOTATION = re.compile(
    r"^(?:ProfilerStep#\d+|execute_(?:\d+_)?context_\d+\(.*\)_generation_\d+\(.*\)|step\[.*\])$"
)
#: Fault sizes, as fractions of the step they are planted in.
SIZES = (0.01, 0.02, 0.05, 0.10, 0.25, 0.50, 1.00)
#: Size buckets the report groups by: [low, high) as fractions of the step.
BUCKETS = (("1-5%", 0.01, 0.05), ("5-25%", 0.05, 0.25), (">=25%", 0.25, float("inf")))
#: The straggler family's collective: this many kernels after the blocking sync, this long.
COLLECTIVE_AFTER_LAUNCHES = 3
COLLECTIVE_BASE_NS = 20_000


@dataclass(frozen=True)
class TraceSpec:
    """One real trace of the suite and what is planted in it."""

    path: str  # relative to the traces folder
    kinds: tuple[str, ...]
    host_gaps: bool = True
    stragglers: bool = False


#: Multi-step Kineto captures (training loops with ProfilerStep), single-step serving captures
#: (vLLM, SGLang, HF), and the 2-GPU nsys export.
SUITE = (
    TraceSpec("hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz", ("gemm", "norm")),
    TraceSpec("hta/queue_len_rank0_of16.json.gz", ("gemm", "nccl")),
    TraceSpec("hta/sampled_rank0_of128.json.gz", ("gemm", "norm", "nccl")),
    TraceSpec("tracelens/more/mi300_resnet_act_checkpoint.json.gz", ("gemm", "norm", "nccl")),
    TraceSpec(
        "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz",
        ("gemm", "attention", "norm"),
    ),
    TraceSpec("tracelens/sglang_Qwen3-8B_prefilldecode.json.gz", ("gemm", "attention", "norm")),
    TraceSpec("tracelens/hf_qwen1.5-0.5b_h100.json.gz", ("gemm", "attention")),
    TraceSpec("tracelens/more/h100_timesformer_k400.json.gz", ("gemm", "norm")),
    TraceSpec("nsys_ai/fastvideo_h100_sp2_1s.sqlite", ("gemm",), stragglers=True),
)


@dataclass
class Planted:
    """What one variant planted: the truth a verdict is scored against. Times are ns on the
    file's clock; `anchor_*` name one GPU op of the planted device (the slowed kernel itself, for
    the kernel family) by name and ordinal, to find it again in teller's tree."""

    variant: str
    family: str  # kernel | host_gap | straggler | control
    trace: str
    format: str  # kineto | nsys
    kind: str  # gemm | attention | norm | nccl | host_gap | straggler | control
    fraction: float  # added time / step duration
    added_ns: int
    step_index: int | None  # ordinal of the annotated step (time order); None: whole capture
    step_name: str | None
    step_dur_ns: int
    steps_in_trace: int
    pid: object
    tid: object  # the host thread of a host fault (None for a kernel)
    device: int
    at_ns: int  # where the fault begins (kernel start, host delay, stall)
    anchor_name: str
    anchor_ordinal: int
    anchor_start_ns: int  # after planting
    kernel: str | None = None
    kernel_dur_ns: int = 0  # before planting
    launch_op: str | None = None  # the operator whose call launched the kernel
    accept_operators: list[str] = field(default_factory=list)
    peer_wait_added_ns: int = 0  # straggler: how much longer the peer's collective ran
    host_moved_ns: int = 0  # how much later the host's first delayed blocking call returned
    step_growth_ns: int = 0  # how much longer the step's annotation became
    gpu_growth_ns: int = 0  # how much later the device's last GPU op ends
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def load(path: Path) -> KinetoTrace | NsysTrace:
    return NsysTrace.load(path) if path.suffix == ".sqlite" else KinetoTrace.load(path)


def output_name(path: Path) -> str:
    """The planted copy's file name: the original's (teller reads ranks from names), unzipped."""
    return path.name[: -len(".gz")] if path.name.endswith(".gz") else path.name


@dataclass
class Variant:
    truth: Planted
    trace: KinetoTrace | NsysTrace
    replayed: Replayed

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        return self.trace.write(self.replayed, folder / output_name(self.trace.path))


def _rng(seed: int, key: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(key.encode())])


class Planter:
    """Plants the suite's faults in one loaded trace."""

    def __init__(self, spec: TraceSpec, trace: KinetoTrace | NsysTrace, seed: int) -> None:
        self.spec, self.trace, self.seed = spec, trace, seed
        self.t: Timeline = trace.timeline
        self.format = "nsys" if isinstance(trace, NsysTrace) else "kineto"
        annotated = step_windows(self.t, STEP_ANNOTATION)
        if annotated:
            self.steps = [
                (k, start, end, name) for k, (_, start, end, name) in enumerate(annotated)
            ]
        else:
            start = int(
                min(self.t.host_start.min(initial=2**62), self.t.gpu_start.min(initial=2**62))
            )
            end = int(max(self.t.host_end.max(initial=0), self.t.gpu_end.max(initial=0)))
            self.steps = [(None, start, end, None)]

    # -- the families ----------------------------------------------------------------------------
    @staticmethod
    def keys(spec: TraceSpec, sizes: tuple[float, ...] = SIZES) -> list[str]:
        """Keys (family:kind:size) of every variant a trace takes, in a fixed order."""
        keys = [f"kernel:{kind}:{size}" for kind in spec.kinds for size in sizes]
        if spec.host_gaps:
            keys += [f"host_gap:host_gap:{size}" for size in sizes]
        if spec.stragglers:
            keys += [f"straggler:device{d}:{size}" for size in sizes for d in (0, 1)]
            keys.append("control:control:0")
        return keys

    def plant(self, key: str) -> Variant:
        family, kind, size = key.split(":")
        rng = _rng(self.seed, f"{self.spec.path}:{key}")
        if family == "kernel":
            return self.slow_kernel(kind, float(size), rng, key)
        if family == "host_gap":
            return self.host_gap(float(size), rng, key)
        if family == "straggler":
            return self.straggler(int(kind.removeprefix("device")), float(size), rng, key)
        return self.straggler(None, 0.0, rng, key)

    def _step(self, rng: np.random.Generator) -> tuple[int | None, int, int, str | None]:
        """The step to plant in: a random one after the first (often a warm-up) when there are
        several."""
        if len(self.steps) == 1:
            return self.steps[0]
        return self.steps[int(rng.integers(1, len(self.steps)))]

    def slow_kernel(
        self, kind: str, fraction: float, rng: np.random.Generator, key: str
    ) -> Variant:
        t = self.t
        index, start, end, name = self._step(rng)
        launched_at = np.where(
            t.gpu_launch >= 0, t.host_start[np.maximum(t.gpu_launch, 0)], t.gpu_start
        )
        of_kind = np.array(
            [t.gpu_kind[r] == KERNEL and kernel_kind(n) == kind for r, n in enumerate(t.gpu_name)],
            dtype=bool,
        )
        inside = of_kind & (launched_at >= start) & (launched_at <= end)
        if self.format == "nsys":
            devices = np.unique(t.gpu_device[inside])
            if len(devices):
                inside &= t.gpu_device == devices[int(rng.integers(len(devices)))]
        rows = np.flatnonzero(inside)
        if not len(rows):
            raise LookupError(
                f"{self.spec.path}: no {kind} kernel launched in step {name or 'capture'}"
            )
        row = int(rows[int(rng.integers(len(rows)))])
        added = max(round(fraction * int(end - start)), 1)
        replayed = replay(t, slower={row: added})
        op = t.launching_op(row)
        truth = self._truth(
            key, "kernel", kind, fraction, added, (index, start, end, name), row, replayed
        )
        truth.at_ns = int(t.gpu_start[row])
        truth.kernel = t.gpu_name[row]
        truth.kernel_dur_ns = int(t.gpu_end[row] - t.gpu_start[row])
        truth.launch_op = t.host_name[op] if op >= 0 else None
        truth.accept_operators = [n for n in (truth.kernel, truth.launch_op) if n]
        return Variant(truth, self.trace, replayed)

    def host_gap(self, fraction: float, rng: np.random.Generator, key: str) -> Variant:
        t = self.t
        index, start, end, name = self._step(rng)
        thread = (
            self._step_thread(index) if index is not None else self._launching_thread(start, end)
        )
        tops = [
            r
            for r in np.flatnonzero(
                (t.host_thread == thread)
                & (t.host_role == OPERATOR)
                & (t.host_start > start)
                & (t.host_end < end)
            ).tolist()
            if t.enclosing(r, OPERATOR) < 0
        ]
        if len(tops) < 2:
            raise LookupError(
                f"{self.spec.path}: fewer than two top-level operators in step {name}"
            )
        after = tops[int(rng.integers(1, len(tops)))]
        at, before = self._gap_point(thread, after)
        added = max(round(fraction * int(end - start)), 1)
        replayed = replay(t, delays=[HostDelay(thread, at, added)])
        anchor = self._first_launch_after(thread, at)
        truth = self._truth(
            key,
            "host_gap",
            "host_gap",
            fraction,
            added,
            (index, start, end, name),
            anchor,
            replayed,
        )
        truth.at_ns, truth.tid = at, t.threads[thread][1]
        enclosing = self._innermost_at(thread, at)
        names = [t.host_name[after], t.host_name[before] if before >= 0 else None]
        if enclosing >= 0 and not STEP_ANNOTATION.match(t.host_name[enclosing]):
            names.append(t.host_name[enclosing])
        truth.accept_operators = list(dict.fromkeys(n for n in names if n))
        return Variant(truth, self.trace, replayed)

    def straggler(
        self, stalled: int | None, fraction: float, rng: np.random.Generator, key: str
    ) -> Variant:
        """Stall device `stalled`'s host (None: no stall, the control) after a blocking sync, before
        a collective added on every device."""
        if not isinstance(self.trace, NsysTrace):
            raise LookupError("stragglers are planted in nsys exports only")
        t = self.t
        devices = sorted(np.unique(t.gpu_device[t.gpu_kind == KERNEL]).tolist())
        threads = {d: self._device_thread(d) for d in devices}
        syncs = {
            d: [r for r in np.flatnonzero(t.host_sync & (t.host_thread == threads[d])).tolist()]
            for d in devices
        }
        syncs = {d: sorted(rows, key=lambda r: t.host_end[r]) for d, rows in syncs.items()}
        count = min(len(rows) for rows in syncs.values())
        choice = int(rng.integers(count))
        after = {}
        for device in devices:
            sync = syncs[device][choice]
            launched = self._launches_after(threads[device], int(t.host_end[sync]), device)
            if len(launched) <= COLLECTIVE_AFTER_LAUNCHES:
                raise LookupError(
                    f"{self.spec.path}: too few kernels after sync {choice} on device {device}"
                )
            after[device] = launched[COLLECTIVE_AFTER_LAUNCHES]
        trace, collective = self.trace.with_collective(after, COLLECTIVE_BASE_NS)
        index, start, end, name = self.steps[0] if len(self.steps) == 1 else self._step(rng)
        step_dur = end - start
        delays, at, added = [], 0, 0
        target = stalled if stalled is not None else devices[0]
        if stalled is not None:
            sync = syncs[stalled][choice]
            at = self._after_return(threads[stalled], int(t.host_end[sync]))
            added = max(round(fraction * int(step_dur)), 1)
            delays.append(HostDelay(threads[stalled], at, added))
        replayed = replay(trace.timeline, delays=delays)
        mine = collective[devices.index(target)]
        family = "straggler" if stalled is not None else "control"
        truth = self._truth(
            key,
            family,
            family,
            fraction,
            added,
            (index, start, end, name),
            mine,
            replayed,
            timeline=trace.timeline,
        )
        truth.at_ns = at
        truth.tid = t.threads[threads[target]][1] if stalled is not None else None
        peers = [r for r in collective if r != mine]
        truth.peer_wait_added_ns = (
            int(
                max(
                    (replayed.gpu_end[r] - replayed.gpu_start[r])
                    - (trace.timeline.gpu_end[r] - trace.timeline.gpu_start[r])
                    for r in peers
                )
            )
            if peers
            else 0
        )
        truth.notes.append(
            f"collective {COLLECTIVE_KERNEL.split('(')[0]} added on {len(devices)} devices after kernel launch "
            f"{COLLECTIVE_AFTER_LAUNCHES} past blocking sync {choice}"
        )
        return Variant(truth, trace, replayed)

    # -- truth -----------------------------------------------------------------------------------
    def _truth(
        self,
        key: str,
        family: str,
        kind: str,
        fraction: float,
        added: int,
        step: tuple[int | None, int, int, str | None],
        anchor: int,
        replayed: Replayed,
        timeline: Timeline | None = None,
    ) -> Planted:
        t = timeline or self.t
        index, start, end, name = step
        device = int(t.gpu_device[anchor])
        same = np.flatnonzero(
            (t.gpu_device == device) & np.array([n == t.gpu_name[anchor] for n in t.gpu_name])
        )
        ordinal = int(np.flatnonzero(same[np.lexsort((same, t.gpu_start[same]))] == anchor)[0])
        launcher = int(t.gpu_launch[anchor])
        pid = (
            t.thread_pid(int(t.host_thread[launcher]))
            if launcher >= 0
            else self._device_pid(device)
        )
        step_rows = [r for r, *_ in step_windows(t, STEP_ANNOTATION)]
        growth = 0
        if index is not None and step_rows:
            row = step_rows[index]
            thread = int(t.host_thread[row])
            growth = replayed.host_shift(thread, int(t.host_end[row])) - replayed.host_shift(
                thread, int(t.host_start[row])
            )
        on_device = t.gpu_device == device
        return Planted(
            variant=f"{Path(self.spec.path).name}:{key}",
            family=family,
            trace=self.spec.path,
            format=self.format,
            kind=kind,
            fraction=fraction,
            added_ns=added,
            step_index=index,
            step_name=name,
            step_dur_ns=int(end - start),
            steps_in_trace=len(self.steps) if self.steps[0][0] is not None else 0,
            pid=pid,
            tid=None,
            device=device,
            at_ns=0,
            anchor_name=t.gpu_name[anchor],
            anchor_ordinal=ordinal,
            anchor_start_ns=int(replayed.gpu_start[anchor]),
            host_moved_ns=int(replayed.sync_delays[0][1]) if replayed.sync_delays else 0,
            step_growth_ns=int(growth),
            gpu_growth_ns=int(replayed.gpu_end[on_device].max() - t.gpu_end[on_device].max()),
            notes=list(replayed.notes),
        )

    # -- where on the host -----------------------------------------------------------------------
    def _step_thread(self, index: int) -> int:
        """The thread that holds step `index`'s annotation: the engine's Python loop."""
        row = step_windows(self.t, STEP_ANNOTATION)[index][0]
        return int(self.t.host_thread[row])

    def _launching_thread(self, start: int, end: int) -> int:
        t = self.t
        launches = t.gpu_launch[t.gpu_launch >= 0]
        inside = launches[(t.host_start[launches] >= start) & (t.host_start[launches] <= end)]
        threads = t.host_thread[inside if len(inside) else launches]
        return int(np.bincount(threads).argmax())

    def _device_thread(self, device: int) -> int:
        t = self.t
        launches = t.gpu_launch[(t.gpu_launch >= 0) & (t.gpu_device == device)]
        return int(np.bincount(t.host_thread[launches]).argmax())

    def _device_pid(self, device: int) -> object:
        return self.t.thread_pid(self._device_thread(device))

    def _launches_after(self, thread: int, at: int, device: int) -> list[int]:
        t = self.t
        rows = np.flatnonzero(
            (t.gpu_launch >= 0) & (t.gpu_device == device) & (t.gpu_kind == KERNEL)
        )
        rows = rows[
            (t.host_thread[t.gpu_launch[rows]] == thread) & (t.host_start[t.gpu_launch[rows]] > at)
        ]
        return rows[np.argsort(t.host_start[t.gpu_launch[rows]], kind="stable")].tolist()

    def _first_launch_after(self, thread: int, at: int) -> int:
        t = self.t
        rows = np.flatnonzero((t.gpu_launch >= 0) & (t.gpu_kind == KERNEL))
        rows = rows[
            (t.host_thread[t.gpu_launch[rows]] == thread) & (t.host_start[t.gpu_launch[rows]] >= at)
        ]
        if not len(rows):
            rows = np.flatnonzero(t.gpu_kind == KERNEL)
            return int(rows[np.argmax(t.gpu_start[rows])])
        return int(rows[np.argmin(t.host_start[t.gpu_launch[rows]])])

    def _gap_point(self, thread: int, after: int) -> tuple[int, int]:
        """Where to stop the thread before host row `after`: halfway through the idle time between
        the last host event that ended before it and its start; and that event's row."""
        t = self.t
        begins = int(t.host_start[after])
        ended = np.flatnonzero((t.host_thread == thread) & (t.host_end <= begins))
        if not len(ended):
            return begins, -1
        before = int(ended[np.argmax(t.host_end[ended])])
        return (int(t.host_end[before]) + begins + 1) // 2, before

    def _after_return(self, thread: int, returned: int) -> int:
        """A point on `thread` just after a call returned, before the next host event starts."""
        t = self.t
        later = t.host_start[(t.host_thread == thread) & (t.host_start > returned)]
        following = int(later.min()) if len(later) else returned + 2
        return (returned + following + 1) // 2

    def _innermost_at(self, thread: int, at: int) -> int:
        t = self.t
        rows = np.flatnonzero((t.host_thread == thread) & (t.host_start < at) & (t.host_end > at))
        if not len(rows):
            return -1
        return int(rows[np.argmax(t.host_start[rows])])


# -- scoring -------------------------------------------------------------------------------------
@dataclass
class Score:
    """How one method's verdict did on one variant (None: not applicable)."""

    step_found: bool | None
    headline: bool | None
    operator_hit: bool | None  # the top finding on the planted step names an accepted operator
    operator_instance: bool | None  # … and points at the planted instance itself
    device_hit: bool | None  # stragglers: the top finding's rank is the stalled device's
    other_steps_flagged: int
    planted_step: list[int]  # the steps that count as the planted one (see `score`)
    rank: int | None
    top: dict | None  # the top finding: step, rank, operator
    error: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def rank_of_pid(events_table, pid: object) -> int | None:
    """The rank teller gave the process `pid` (host rows carry the process id)."""
    table = events_table.table
    ranks = np.unique(table.column("rank").to_numpy())
    if len(ranks) == 1:
        return int(ranks[0])
    if not isinstance(pid, int):
        return None
    rows = table.filter(
        pc.and_(pc.equal(table.column("pid"), pid), pc.equal(table.column("stream"), -1))
    )
    found = np.unique(rows.column("rank").to_numpy())
    return int(found[0]) if len(found) == 1 else None


def locate(tree, rank: int | None, name: str, ordinal: int) -> int:
    """The tree node of the GPU op named `name` that is the `ordinal`-th of that name on `rank`."""
    names = tree.names
    wanted = [i for i, n in enumerate(names) if n == name]
    if not wanted:
        return -1
    nodes = np.flatnonzero(np.isin(tree.name, wanted) & (tree.stream >= 0))
    if rank is not None:
        nodes = nodes[tree.rank[nodes] == rank]
    nodes = nodes[np.lexsort((nodes, tree.start[nodes]))]
    return int(nodes[ordinal]) if ordinal < len(nodes) else -1


def score(truth: Planted, verdict: dict, tree, events_table) -> Score:
    """One verdict (`teller analyze --format json`) against one variant's truth. The planted step
    is the step teller put the planted op (or the host fault's start) in, or the step teller
    found under the planted step's annotation: a kernel launched late in one step often runs in
    the next, and either is a fair answer."""
    rank = rank_of_pid(events_table, truth.pid)
    node = locate(tree, rank, truth.anchor_name, truth.anchor_ordinal)
    rows = verdict.get("steps") or []
    planted = {_planted_step(truth, tree, node, rank)} - {None}
    if truth.step_name is not None:
        planted |= {
            r["step"]
            for r in rows
            if r.get("name") == truth.step_name and r.get("rank") in (rank, None)
        }
    findings = verdict.get("findings") or []
    flagged = {row["step"] for row in rows if row.get("anomalous")} | {f["step"] for f in findings}
    top = findings[0] if findings else None
    top_brief = {k: top.get(k) for k in ("step", "rank", "operator")} if top else None
    shown = sorted(planted)
    if truth.family == "control":
        return Score(None, None, None, None, None, len(flagged), shown, rank, top_brief)
    on_step = [f for f in findings if f["step"] in planted]
    operator_hit = operator_instance = None
    pick = on_step[0] if on_step else None
    if truth.accept_operators:
        operator_hit = bool(pick) and pick.get("operator") in truth.accept_operators
    if truth.family == "kernel":  # the planted instance is a node of the tree
        instance = _instance_nodes(tree, node) if node >= 0 else set()
        operator_instance = bool(pick) and pick.get("operator_node") in instance
        operator_hit = operator_hit or operator_instance
    device_hit = None
    if truth.family == "straggler":
        device_hit = bool(top) and rank is not None and top.get("rank") == rank
    return Score(
        step_found=bool(planted & flagged),
        headline=bool(top) and top["step"] in planted,
        operator_hit=operator_hit,
        operator_instance=operator_instance,
        device_hit=device_hit,
        other_steps_flagged=len(flagged - planted),
        planted_step=shown,
        rank=rank,
        top=top_brief,
    )


def _planted_step(truth: Planted, tree, node: int, rank: int | None) -> int | None:
    """The step teller put the fault in: the planted kernel's (or its launching call's) step; for
    host faults, the step on the planted rank whose span holds the fault's start."""
    if node < 0:
        return None
    steps = tree.steps
    if truth.family == "kernel":
        for candidate in (node, int(tree.parent[node])):
            if candidate >= 0 and tree.step[candidate] >= 0:
                return int(steps.index[tree.step[candidate]])
        return None
    offset = int(tree.start[node]) - truth.anchor_start_ns
    at = truth.at_ns + offset
    for k in range(len(steps)):
        if (rank is None or steps.rank[k] == rank) and steps.start_ns[k] <= at < steps.start_ns[
            k
        ] + steps.dur_ns[k]:
            return int(steps.index[k])
    return None


def _instance_nodes(tree, node: int) -> set[int]:
    """The planted kernel's node, the call that launched it and the innermost operator above
    that call."""
    out = {node}
    current = int(tree.parent[node])
    while current >= 0 and tree.stream[current] < 0:
        out.add(current)
        if tree.layer[current] == LAYER_CODE["cpu_op"]:
            break
        current = int(tree.parent[current])
    return out


def bucket_of(fraction: float) -> str | None:
    for label, low, high in BUCKETS:
        if low <= fraction < high:
            return label
    return None
