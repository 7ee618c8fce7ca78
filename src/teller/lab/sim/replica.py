"""One serving replica (tp × pp ranks) step by step: host call stacks, launches, GPU streams, NCCL.

Per step every rank first lays out its host timeline (the step annotation, vLLM's frames, the model
and per-layer stacks replayed from the calibrated template, launches, collectives' host chains);
the host never waits for the GPU except at the end-of-step copy back. Then the GPU pass runs launch
by launch across the ranks of each pipeline stage, so a collective can obey its semantics: no rank's
NCCL kernel ends before the last rank of the group has arrived plus the transfer time of the
message on the slowest link of the ring. Events are encoded and handed to each rank's writer at the
end of every step, so memory holds one step, never the trace.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from teller.lab.sim.calibration import Calibration, Fit, module_name
from teller.lab.sim.engine import StepPlan
from teller.lab.sim.faults import WATCHDOG_TIMEOUT_NS, FaultModel
from teller.lab.sim.kineto_writer import EventEncoder
from teller.lab.sim.topology import ProcessGroup, Topology

ATTENTION_MODULE = re.compile(r"^nn\.Module: \w*Attention_\d+$")
MLP_MODULE = re.compile(r"^nn\.Module: \w*MLP_\d+$")
_DTYPE_OF_KERNEL = (("_float", "Float", 4), ("_bf16", "BFloat16", 2), ("_half", "Half", 2))
#: Heavy tails of the fitted delays are clipped at this many medians (a launch queue does not
#: wait seconds in a steady step).
TAIL_CLIP = 4.0
#: Per-rank log-normal spread around a collective's shared host time (see `_comm_host_ns`).
RANK_HOST_LOG_SIGMA = 0.1
#: Per-rank log-normal spread of a layer's host speed around the group's shared draw.
RANK_CPU_LOG_SIGMA = 0.02


@dataclass(frozen=True)
class Streams:
    """A rank's CUDA streams, numbered as CUPTI numbered them in the real traces (calibration).

    Kernels and copies run on PyTorch's compute stream. c10d runs every NCCL communicator on a
    stream of its own: the tensor-parallel group's all-reduces on one, and each pipeline
    neighbour's point-to-point pair (c10d's per-peer communicator) on another, taking the
    calibrated p2p stream ids in order of first use (a later stage receives before it sends).
    The timeline is still one chain: c10d makes the NCCL stream wait for the compute stream
    before a collective and the compute stream wait for it after, so no two kernels overlap.
    """

    compute: int
    allreduce: int | None = None
    recv: int | None = None
    send: int | None = None

    @classmethod
    def of(cls, calibration: Calibration, topology: Topology, stage: int) -> Streams:
        p2p = iter(calibration.p2p["p2p_streams"])
        recv = next(p2p) if stage > 0 else None
        send = next(p2p) if stage < topology.pp - 1 else None
        allreduce = calibration.comm["stream"] if topology.tp > 1 else None
        return cls(calibration.model["compute_stream"], allreduce, recv, send)

    def for_launch(self, kind: str) -> int:
        """The stream a launch of this kind (kernels | copy | allreduce | send | recv) runs on."""
        stream = {"allreduce": self.allreduce, "send": self.send, "recv": self.recv}.get(kind)
        return self.compute if stream is None else stream

    def used(self) -> list[int]:
        streams = (self.compute, self.allreduce, self.recv, self.send)
        return sorted({s for s in streams if s is not None})


@dataclass(frozen=True)
class HungCollective:
    """The collective a hang left unfinished: what the NCCL watchdog's lines report."""

    step: int
    seq: int
    nelems: int


@dataclass
class _Hang(Exception):
    """Raised on the rank that never reaches its collective: its host stops there."""


@dataclass
class Launch:
    """A runtime call that puts work on the stream, in host order."""

    kind: str  # kernels | allreduce | send | recv | copy
    ts_ns: int
    correlation: int
    external_id: int
    kernels: list[tuple[str, str, int, int]]  # (cat, name, duration ns, bytes)
    graph: bool = False
    comm: dict | None = None  # collective facts for comm launches


@dataclass
class Frame:
    cat: str
    name: str
    start_ns: int
    args: dict
    end_ns: int = -1


@dataclass
class RankState:
    rank: int
    stage: int
    tp_index: int
    device: int
    pid: int
    encoder: EventEncoder
    rng: np.random.Generator
    streams: Streams
    gpu_free_ns: int = 0
    correlation: int = 1
    external_id: int = 1
    ev_idx: int = 0
    python_id: int = 1
    events: list[bytes] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    open_frames: list[Frame] = field(default_factory=list)
    seq: dict[str, int] = field(default_factory=dict)
    hung: bool = False
    cpu_ns: int = 0
    #: GPU time of every kernel, memcpy and memset the rank ran so far (visible.py compares it)
    gpu_busy_ns: int = 0
    pending_frames: tuple = ()
    python_stack: list[tuple[int, int]] = field(default_factory=list)  # (Python id, end ns)


class LayerTemplate:
    """The calibrated decoder layer, prepared once: kept nodes, comm points, kernel pieces."""

    def __init__(self, calibration: Calibration, python_frames: bool) -> None:
        self.calibration = calibration
        nodes = calibration.nodes
        keep = [python_frames or n.layer != "python" for n in nodes]
        self.nodes = nodes
        self.keep = keep
        self.python_frames = python_frames
        ends = {"attn": None, "mlp": None}
        for node in nodes:
            if ATTENTION_MODULE.match(node.name) and ends["attn"] is None:
                ends["attn"] = node.start_ns + node.dur_ns
            if MLP_MODULE.match(node.name) and ends["mlp"] is None:
                ends["mlp"] = node.start_ns + node.dur_ns
        self.comm_points = sorted(v for v in ends.values() if v is not None)
        self.kernel_nodes = [i for i, n in enumerate(nodes) if n.layer in ("kernel", "memset")]
        # graph pieces: kernels split at the comm points, by their launcher's host time
        self.pieces: list[list[int]] = [[] for _ in range(len(self.comm_points) + 1)]
        for i in self.kernel_nodes:
            t = nodes[nodes[i].parent].start_ns
            self.pieces[sum(1 for p in self.comm_points if p <= t)].append(i)
        total_ns: dict[str, int] = {}
        for i in self.kernel_nodes:
            total_ns[nodes[i].name] = total_ns.get(nodes[i].name, 0) + nodes[i].dur_ns
        #: the kernel that takes most of a layer's GPU time (what a slower GPU shows first)
        self.dominant_kernel = max(total_ns, key=lambda name: total_ns[name])
        self.kinds = [n.layer for n in nodes]
        self.parents = [n.parent for n in nodes]
        self.bytes = [n.bytes for n in nodes]
        self.start_ns = np.array([n.start_ns for n in nodes], dtype=np.int64)
        self.end_ns = np.array([n.start_ns + n.dur_ns for n in nodes], dtype=np.int64)
        self.comm_points_ns = np.array(self.comm_points, dtype=np.int64)
        self.no_points = np.zeros(0, dtype=np.int64)
        launchers = {nodes[i].parent for i in self.kernel_nodes}
        self.has_gpu = [i in launchers for i in range(len(nodes))]
        self._names: dict[int, list[str]] = {}
        gemms = [i for i in self.kernel_nodes if "gemm" in nodes[i].name.lower()]
        self.regression_kernel = gemms[-1] if gemms else -1

    def names_of_layer(self, layer_index: int) -> list[str]:
        """Node names with module instance numbers shifted to this layer (cached)."""
        names = self._names.get(layer_index)
        if names is None:
            counts = self.calibration.modules_per_layer
            names = [module_name(n.name, layer_index, counts) for n in self.nodes]
            self._names[layer_index] = names
        return names


class ReplicaModel:
    """Simulates one replica's ranks; `run_step` returns the step's end (last rank's) in unix ns."""

    def __init__(
        self,
        replica: int,
        topology: Topology,
        template: LayerTemplate,
        faults: FaultModel,
        layers: int,
        encoders: dict[int, EventEncoder],
        rngs: dict[int, np.random.Generator],
    ) -> None:
        """`layers` decoder layers split over the pipeline stages; each rank writes through its
        encoder (which holds its pid) and draws from its own generator. The calibration is the
        template's."""
        calibration = template.calibration
        self.replica = replica
        self.topology = topology
        self.cal = calibration
        self.faults = faults
        self.template = template
        self.ranks: dict[int, RankState] = {}
        for stage in range(topology.pp):
            for t in range(topology.tp):
                rank = topology.rank_of(replica, stage, t)
                self.ranks[rank] = RankState(
                    rank=rank,
                    stage=stage,
                    tp_index=t,
                    device=topology.local_gpu(rank),
                    pid=encoders[rank].pid,
                    encoder=encoders[rank],
                    rng=rngs[rank],
                    streams=Streams.of(calibration, topology, stage),
                )
        groups = topology.groups()
        self.tp_group = {
            r: next(g for g in groups if g.desc == "tp" and r in g.ranks) for r in self.ranks
        }
        self.pp_group = {
            r: next(g for g in groups if g.desc == "pp" and r in g.ranks) for r in self.ranks
        }
        per_stage, extra = divmod(layers, topology.pp)
        self.stage_layers = []
        first = 0
        for stage in range(topology.pp):
            count = per_stage + (1 if stage < extra else 0)
            self.stage_layers.append(range(first, first + count))
            first += count
        # one generator for what all ranks share, seeded from the first rank's stream; its draws
        # are kept for the current step only (every rank asks for them within the step)
        self._shared_rng = np.random.default_rng(int(rngs[min(rngs)].integers(2**63)))
        self._shared_comm_host: dict[tuple[str, int], int] = {}
        self._shared_cpu: dict[tuple[int, int], float] = {}
        comm = calibration.comm
        self.allreduce_kernel = comm["kernel"]
        self.p2p_kernel = calibration.p2p["p2p_kernel"]
        self.dtype, self.dtype_bytes = next(
            ((d, b) for tag, d, b in _DTYPE_OF_KERNEL if tag in self.allreduce_kernel.lower()),
            ("BFloat16", 2),
        )
        self.fallback_gemm = calibration.gemm_fallback()
        self.p2p_exchanges = 0
        self.hung_at: HungCollective | None = None
        #: (rank, kernel, launch ns) of kernels a rank launched for the first time this step; a
        #: real engine compiles such a kernel then (vLLM warns). The template's kernels are warm.
        self.first_launches: list[tuple[int, str, int]] = []
        self._launched: set[tuple[int, str]] = set()
        #: steps in which kernel_regression changed what a rank ran (see FaultModel.changes_kernels)
        self.regressed_steps: list[int] = []
        self.cbid = calibration.raw["runtime_cbid"]
        self.graph_launch = calibration.vllm["graph_launch"]
        self.comm_host_fit = Fit.of(calibration.comm["host_dur"])

    # -- sampling helpers ------------------------------------------------------------------------
    def _fit(self, rng: np.random.Generator, fit) -> int:
        return int(min(fit.sample(rng), fit.median_ns * TAIL_CLIP))

    def _kernel_ns(self, state: RankState, name: str, tokens: int, step: int) -> int:
        fit = self.cal.kernels.get(name)
        floor = self.cal.kernel_floor_ns
        if fit is None:
            return floor
        if name.startswith("Memset") or name.startswith("Memcpy"):
            scale = 1.0
        else:
            scale = tokens / self.topology.tp / self.cal.reference_tokens
        base = max(floor, fit.median_ns * scale)
        noise = math.exp(fit.log_sigma * state.rng.standard_normal())
        return max(int(base * noise * self.faults.kernel_factor(state.rank, step, state.rng)), 1)

    def _launch_delay(self, state: RankState) -> int:
        return self._fit(state.rng, self.cal.launch_delay)

    def _runtime_ns(self, state: RankState, name: str) -> int:
        fit = self.cal.runtime.get(name)
        return self._fit(state.rng, fit) if fit else 2_000

    # -- event helpers ---------------------------------------------------------------------------
    def _open(self, state: RankState, cat: str, name: str, ts: int) -> Frame:
        frame = Frame(cat, name, ts, self._args(state, cat, ts))
        state.open_frames.append(frame)
        return frame

    def _close(self, state: RankState, frame: Frame, end_ns: int) -> None:
        frame.end_ns = end_ns
        state.open_frames.remove(frame)
        if frame.cat == "python_function":
            state.python_stack = [e for e in state.python_stack if e[0] != frame.args["Python id"]]
        state.events.append(
            state.encoder.cpu(
                frame.cat, frame.name, frame.start_ns, end_ns - frame.start_ns, frame.args
            )
        )

    def _args(self, state: RankState, cat: str, start_ns: int = 0, end_ns: int = 1 << 62) -> dict:
        """Kineto's args; a Python frame's parent id is the innermost frame still open at its start
        (frames come in start order; an open frame not yet closed has end 2^62)."""
        state.ev_idx += 1
        if cat == "python_function":
            state.python_id += 1
            stack = state.python_stack
            while stack and stack[-1][1] <= start_ns:
                stack.pop()
            parent = stack[-1][0] if stack else None
            stack.append((state.python_id, end_ns))
            return {
                "Python parent id": parent,
                "Python id": state.python_id,
                "Ev Idx": state.ev_idx,
            }
        state.external_id += 1
        return {"External id": state.external_id, "Record function id": 0, "Ev Idx": state.ev_idx}

    def _complete(self, state: RankState, cat: str, name: str, ts: int, dur: int) -> dict:
        args = self._args(state, cat, ts, ts + dur)
        state.events.append(state.encoder.cpu(cat, name, ts, dur, args))
        return args

    def _runtime(
        self,
        state: RankState,
        name: str,
        ts: int,
        dur: int,
        kind: str,
        kernels: list,
        graph: bool = False,
        comm: dict | None = None,
    ) -> Launch:
        state.correlation += 1
        correlation = state.correlation
        args = {
            "External id": state.external_id,
            "cbid": self.cbid.get(name, 0),
            "correlation": correlation,
        }
        state.events.append(state.encoder.cpu("cuda_runtime", name, ts, dur, args))
        state.events.append(state.encoder.flow_start(correlation, ts))
        launch = Launch(kind, ts, correlation, state.external_id, kernels, graph, comm)
        state.launches.append(launch)
        return launch

    # -- host side -------------------------------------------------------------------------------
    def _layer_eager(self, state: RankState, plan: StepPlan, layer_index: int, t0: int) -> int:
        """Replay the template for one layer from t0; returns the host time at its end.

        Host durations scale by one factor per layer (the calibrated spread, times any host
        contention); a collective's host chain is inserted at the end of the attention and MLP
        blocks, pushing everything after it later and stretching the frames around it.
        """
        tpl = self.template
        rng = state.rng
        shared = self._shared_cpu.get((plan.index, layer_index))
        if shared is None:  # the layer's host speed this step, common to the group (see above)
            shared = self._shared_cpu[(plan.index, layer_index)] = math.exp(
                self.cal.cpu_log_sigma * self._shared_rng.standard_normal()
            )
        f = shared * math.exp(RANK_CPU_LOG_SIGMA * rng.standard_normal())
        f *= self.faults.cpu_factor(state.rank, plan.index)
        tokens = plan.tokens
        points = tpl.comm_points_ns if self.topology.tp > 1 else tpl.no_points
        group = self.tp_group[state.rank].name
        first_seq = state.seq.get(group, 0)
        inserts = np.array(
            [self._comm_host_ns(state, group, first_seq + k) for k in range(len(points))],
            dtype=np.int64,
        )
        shifted = np.concatenate(([0], np.cumsum(inserts)))
        starts = (
            t0
            + (tpl.start_ns * f).astype(np.int64)
            + shifted[np.searchsorted(points, tpl.start_ns, "right")]
        ).tolist()
        ends = (
            t0
            + (tpl.end_ns * f).astype(np.int64)
            + shifted[np.searchsorted(points, tpl.end_ns, "left")]
        ).tolist()
        insert_before = np.searchsorted(tpl.start_ns, points, "left").tolist()
        insert_at = (
            t0
            + (points * f).astype(np.int64)
            + shifted[np.searchsorted(points, points, "right")]
            - inserts
        ).tolist()
        names = tpl.names_of_layer(layer_index)
        kinds, parents, has_gpu, nbytes = tpl.kinds, tpl.parents, tpl.has_gpu, tpl.bytes
        runtime_of: dict[int, Launch] = {}
        regress = self.faults.regression(state.rank, plan.index) and self.fallback_gemm
        pending = 0
        encoder, events = state.encoder, state.events
        for i in range(len(kinds)):
            while pending < len(insert_before) and insert_before[pending] <= i:
                self._allreduce_host(state, plan, insert_at[pending], int(inserts[pending]), tokens)
                pending += 1
            kind = kinds[i]
            if kind == "kernel" or kind == "memset":
                launch = runtime_of.get(parents[i])
                if launch is None:
                    continue
                name = names[i]
                dur = self._kernel_ns(state, name, tokens if kind == "kernel" else 0, plan.index)
                if regress and i == tpl.regression_kernel:
                    name = self.fallback_gemm
                    dur = int(dur * (1.0 + self.faults.spec.intensity))
                    if (state.rank, name) not in self._launched:
                        self._launched.add((state.rank, name))
                        self.first_launches.append((state.rank, name, launch.ts_ns))
                cat = "kernel" if kind == "kernel" else "gpu_memset"
                launch.kernels.append((cat, name, dur, nbytes[i]))
                continue
            if kind == "python" and not tpl.python_frames:
                continue
            start = starts[i]
            dur = max(ends[i] - start, 1)
            if kind == "python":
                self._complete(state, "python_function", names[i], start, dur)
            elif kind == "cpu_op":
                self._complete(state, "cpu_op", names[i], start, dur)
            elif has_gpu[i]:
                runtime_of[i] = self._runtime(state, names[i], start, dur, "kernels", [])
            else:
                state.correlation += 1
                args = {
                    "External id": state.external_id,
                    "cbid": self.cbid.get(names[i], 0),
                    "correlation": state.correlation,
                }
                events.append(encoder.cpu("cuda_runtime", names[i], start, dur, args))
        while pending < len(insert_before):
            self._allreduce_host(state, plan, insert_at[pending], int(inserts[pending]), tokens)
            pending += 1
        return ends[0]

    def _comm_host_ns(self, state: RankState, group: str, seq: int) -> int:
        """Host time of one collective's call chain on this rank.

        The ranks of a group run the same Python path on the same inputs, so most of the
        calibrated variation is shared by all of them (one draw per collective instance); each
        rank adds only a little of its own. Independent heavy-tailed draws per rank would make
        healthy ranks skew by milliseconds at every collective, which real TP workers do not."""
        shared = self._shared_comm_host.get((group, seq))
        if shared is None:
            shared = self._shared_comm_host[(group, seq)] = self._fit(
                self._shared_rng, self.comm_host_fit
            )
        own = math.exp(RANK_HOST_LOG_SIGMA * state.rng.standard_normal())
        return max(int(shared * own), 1)

    def _allreduce_host(
        self, state: RankState, plan: StepPlan, at: int, dur: int, tokens: int
    ) -> None:
        """c10d::allreduce_ → record_param_comms → nccl:all_reduce → cudaLaunchKernel."""
        if self.faults.hangs(state.rank, plan.index):
            raise _Hang
        group = self.tp_group[state.rank]
        seq = state.seq.get(group.name, 0)
        state.seq[group.name] = seq + 1
        nelems = max(tokens, 1) * self.cal.model["hidden_size"]
        facts = self._collective_args(state, group, "allreduce", nelems, seq)
        chain = self.cal.comm["host_chain"]
        spans = [(at, dur), (at + dur // 20, dur * 9 // 10), (at + dur // 10, dur * 8 // 10)]
        for (ts, d), link in zip(spans, chain[:3], strict=True):
            args = self._args(state, link["cat"])
            if link["name"] == "record_param_comms":
                args |= facts
            state.events.append(state.encoder.cpu(link["cat"], link["name"], ts, d, args))
        runtime = chain[3]["name"]
        launch_ts = at + dur // 2
        launch_dur = min(self._runtime_ns(state, runtime), dur * 3 // 10)
        self._runtime(
            state,
            runtime,
            launch_ts,
            launch_dur,
            "allreduce",
            [("kernel", self.allreduce_kernel, 0, nelems * self.dtype_bytes)],
            comm={"group": group, "bytes": nelems * self.dtype_bytes, "args": facts, "seq": seq},
        )

    def _collective_args(
        self, state: RankState, group: ProcessGroup, name: str, nelems: int, seq: int
    ) -> dict:
        ranks = list(group.ranks)
        return {
            "Collective name": name,
            "dtype": self.dtype,
            "In msg nelems": nelems,
            "Out msg nelems": nelems,
            "In split size": "[]",
            "Out split size": "[]",
            "Global rank start": ranks[0],
            "Global rank stride": ranks[1] - ranks[0] if len(ranks) > 1 else 1,
            "Group size": len(ranks),
            "Process Group Name": group.name,
            "Process Group Description": group.desc,
            "Process Group Ranks": "[" + ", ".join(map(str, ranks)) + "]",
            "Rank": state.rank,
            "Seq": seq,
        }

    def _p2p_host(self, state: RankState, plan: StepPlan, at: int, kind: str, exchange: int) -> int:
        """send/recv between adjacent pipeline stages; returns the host time after it."""
        group = self.pp_group[state.rank]
        seq = self.p2p_exchanges * max(self.topology.pp - 1, 1) + exchange
        nelems = max(plan.tokens, 1) * self.cal.model["hidden_size"]
        facts = self._collective_args(state, group, kind, nelems, seq)
        peer = state.rank + self.topology.tp if kind == "send" else state.rank - self.topology.tp
        facts["Dst Rank" if kind == "send" else "Src Rank"] = peer
        dur = self._comm_host_ns(state, group.name, seq)
        args = self._args(state, "cpu_op") | facts
        state.events.append(state.encoder.cpu("cpu_op", "record_param_comms", at, dur, args))
        runtime = self.cal.comm["host_chain"][3]["name"]
        self._runtime(
            state,
            runtime,
            at + dur // 2,
            min(self._runtime_ns(state, runtime), dur * 3 // 10),
            kind,
            [("kernel", self.p2p_kernel, 0, nelems * self.dtype_bytes)],
            comm={
                "group": group,
                "bytes": nelems * self.dtype_bytes,
                "peer": peer,
                "seq": seq,
                "args": facts,
            },
        )
        return at + dur

    def _graph_layers(self, state: RankState, plan: StepPlan, layers: range, t: int) -> int:
        """Decode with CUDA graphs: replay pieces between collectives, collectives eager."""
        tpl = self.template
        nodes = tpl.nodes
        pending: list[int] = []

        def flush(t: int) -> int:
            if not pending:
                return t
            frames = []
            if tpl.python_frames:
                for name in self.cal.vllm["graph_replay"]:
                    frames.append(self._open(state, "python_function", name, t))
                    t += 500
            dur = int(
                self._runtime_ns(state, self.graph_launch)
                * self.faults.cpu_factor(state.rank, plan.index)
            )
            kernels = []
            for i in pending:
                node = nodes[i]
                cat = "kernel" if node.layer == "kernel" else "gpu_memset"
                tokens = plan.tokens if node.layer == "kernel" else 0
                kernels.append(
                    (
                        cat,
                        node.name,
                        self._kernel_ns(state, node.name, tokens, plan.index),
                        node.bytes,
                    )
                )
            self._runtime(state, self.graph_launch, t, dur, "kernels", kernels, graph=True)
            t += dur
            for frame in reversed(frames):
                t += 300
                self._close(state, frame, t)
            pending.clear()
            return t

        for _layer in layers:
            for k, piece in enumerate(tpl.pieces):
                pending.extend(piece)
                if k < len(tpl.pieces) - 1 and self.topology.tp > 1:
                    t = flush(t)
                    group = self.tp_group[state.rank].name
                    dur = self._comm_host_ns(state, group, state.seq.get(group, 0))
                    dur = int(dur * self.faults.cpu_factor(state.rank, plan.index))
                    self._allreduce_host(state, plan, t, dur, plan.tokens)
                    t += dur
        return flush(t)

    def _host_step(self, state: RankState, plan: StepPlan, start: int) -> None:
        state.launches = []
        state.python_stack = []
        state.events = []
        tpl = self.template
        step_frame = self._open(state, "user_annotation", plan.annotation(), start)
        t = start + 2_000
        frames = []
        if tpl.python_frames:
            for name in self.cal.vllm["step_to_model"]:
                frames.append(self._open(state, "python_function", name, t))
                t += 1_000
            frames.append(self._open(state, "python_function", self.cal.model["model_module"], t))
            t += 1_000
        stage = state.stage
        if stage > 0:
            t = self._p2p_host(state, plan, t, "recv", stage - 1)
        layers = self.stage_layers[stage]
        state.pending_frames = (step_frame, frames)
        if self.faults.changes_kernels(
            state.rank, plan.index, plan.graph, can_swap=bool(self.fallback_gemm)
        ):
            self.regressed_steps.append(plan.index)
        try:
            if plan.graph and not self.faults.graph_fallback(state.rank, plan.index):
                t = self._graph_layers(state, plan, layers, t)
            else:
                for layer in layers:
                    t = self._layer_eager(state, plan, layer, t) + 1_000
        except _Hang:
            state.hung = True
            return
        if stage < self.topology.pp - 1:
            t = self._p2p_host(state, plan, t, "send", stage)
        state.cpu_ns = t
        if frames:
            model = frames.pop()
            self._close(state, model, t)
        state.pending_frames = (step_frame, frames)  # closed after the copy back

    # -- GPU side --------------------------------------------------------------------------------
    def _gpu_kernels(self, state: RankState, launch: Launch) -> None:
        """A launch's kernels back to back; a graph replay's every kernel shares its correlation
        and, as Kineto writes it, each carries its own `ac2g` flow end."""
        t = max(state.gpu_free_ns, launch.ts_ns + self._launch_delay(state))
        for cat, name, dur, nbytes in launch.kernels:
            self._emit_gpu(state, launch, cat, name, t, dur, nbytes)
            t += dur
        state.gpu_free_ns = t

    def _emit_gpu(self, state, launch, cat, name, t, dur, nbytes, extra=None) -> None:
        stream = state.streams.for_launch(launch.kind)
        args = {
            "External id": launch.external_id,
            "queued": 0,
            "device": state.device,
            "context": 1,
            "stream": stream,
            "correlation": launch.correlation,
        }
        args |= self.cal.launch_args(name)
        if cat != "kernel":
            args["bytes"] = nbytes
            args["memory bandwidth (GB/s)"] = nbytes / max(dur, 1)
        if extra:
            args |= extra
        state.events.append(state.encoder.gpu(cat, name, t, dur, stream, args))
        state.events.append(state.encoder.flow_end(launch.correlation, t, stream))
        state.gpu_busy_ns += dur

    def _arrival(self, state: RankState, launch: Launch, step: int) -> int:
        return max(
            state.gpu_free_ns, launch.ts_ns + self._launch_delay(state)
        ) + self.faults.arrival_delay_ns(state.rank, step)

    def _ring_cost(self, ranks: list[int], nbytes: int, step: int) -> int:
        n = len(ranks)
        if n < 2:
            return 0
        slowest_bw, worst_latency = math.inf, 0
        for a, b in zip(ranks, ranks[1:] + ranks[:1], strict=True):
            bw, lat = self.topology.link(a, b)
            bw, lat = self.faults.link(a, b, step, bw, lat)
            slowest_bw, worst_latency = min(slowest_bw, bw), max(worst_latency, lat)
        return int(worst_latency + 2 * (n - 1) / n * nbytes / slowest_bw)

    def _p2p_cost(self, a: int, b: int, nbytes: int, step: int) -> int:
        bw, lat = self.topology.link(a, b)
        bw, lat = self.faults.link(a, b, step, bw, lat)
        return int(lat + nbytes / bw)

    def _kernel_extra(self, launch: Launch) -> dict:
        facts = launch.comm["args"] if launch.comm and "args" in launch.comm else {}
        keep = (
            "Collective name",
            "dtype",
            "In msg nelems",
            "Out msg nelems",
            "Group size",
            "In split size",
            "Out split size",
            "Process Group Name",
            "Process Group Description",
            "Process Group Ranks",
        )
        return {k: facts[k] for k in keep if k in facts}

    def _gpu_stage(
        self,
        plan: StepPlan,
        stage_ranks: list[int],
        recv_peer_arrival: dict[int, int],
        send_peer_arrival: dict[int, int],
    ) -> bool:
        """Run one stage's launches across its ranks; False when a collective hangs.

        Ranks are aligned by their collectives, not by launch index: a rank that lost its CUDA
        graphs launches many more kernels between two collectives than its peers.
        """
        states = [self.ranks[r] for r in stage_ranks]
        position = dict.fromkeys(stage_ranks, 0)
        while True:
            heads: list[tuple[RankState, Launch]] = []
            for state in states:
                launches, k = state.launches, position[state.rank]
                while k < len(launches) and launches[k].kind == "kernels":
                    self._gpu_kernels(state, launches[k])
                    k += 1
                position[state.rank] = k
                if k < len(launches):
                    heads.append((state, launches[k]))
            if not heads:
                return True
            for state, _ in heads:
                position[state.rank] += 1
            kind = heads[0][1].kind
            if kind == "allreduce":
                if not self._allreduce_gpu(plan, stage_ranks, heads, hung=len(heads) < len(states)):
                    return False
            else:
                for state, launch in heads:
                    self._p2p_gpu(plan, state, launch, recv_peer_arrival, send_peer_arrival)

    def _allreduce_gpu(
        self, plan: StepPlan, ranks: list[int], heads: list[tuple[RankState, Launch]], hung: bool
    ) -> bool:
        """Every present rank's NCCL kernel ends after the last arrival plus the ring's transfer."""
        arrivals = [self._arrival(state, launch, plan.index) for state, launch in heads]
        first = heads[0][1]
        if hung:  # a rank never launched it: the others wait until the watchdog fires
            end = max(arrivals) + WATCHDOG_TIMEOUT_NS
            nelems = first.comm["args"]["In msg nelems"]
            self.hung_at = HungCollective(plan.index, first.comm["seq"], nelems)
        else:
            end = max(arrivals) + self._ring_cost(ranks, first.comm["bytes"], plan.index)
        for (state, launch), arrival in zip(heads, arrivals, strict=True):
            self._comm_kernel(state, launch, arrival, end + int(state.rng.integers(0, 400)))
        return not hung

    def _p2p_gpu(
        self,
        plan: StepPlan,
        state: RankState,
        launch: Launch,
        recv_peer_arrival: dict[int, int],
        send_peer_arrival: dict[int, int],
    ) -> None:
        """A send ends when the receiver is there too and the message crossed the link."""
        arrival = self._arrival(state, launch, plan.index)
        peer = launch.comm["peer"]
        other = (recv_peer_arrival if launch.kind == "send" else send_peer_arrival)[peer]
        cost = self._p2p_cost(state.rank, peer, launch.comm["bytes"], plan.index)
        end = max(arrival, other) + cost
        if launch.kind == "send":
            send_peer_arrival[state.rank] = arrival
        self._comm_kernel(state, launch, arrival, end)

    def _comm_kernel(self, state: RankState, launch: Launch, start_ns: int, end_ns: int) -> None:
        """A communication launch's one NCCL kernel, from the rank's arrival to the transfer's end."""
        _, name, _, nbytes = launch.kernels[0]
        self._emit_gpu(
            state,
            launch,
            "kernel",
            name,
            start_ns,
            end_ns - start_ns,
            nbytes,
            extra=self._kernel_extra(launch),
        )
        state.gpu_free_ns = end_ns

    def _copy_back(self, state: RankState, plan: StepPlan) -> int:
        """The sampled tokens come back to the host: the one place the host waits for the GPU."""
        t = state.cpu_ns + 2_000
        copy_args = self._args(state, "cpu_op")
        runtime = self.cal.model["dtoh_runtime"]
        name = self.cal.model["dtoh_memcpy"]
        launch_ts = t + 1_000
        state.correlation += 1
        launch = Launch("copy", launch_ts, state.correlation, state.external_id, [])
        nbytes = max(len(plan.prefill) + len(plan.decode), 1) * 8  # one int64 token id each
        start = max(state.gpu_free_ns, launch_ts + self._launch_delay(state))
        dur = self._kernel_ns(state, name, 0, plan.index)
        self._emit_gpu(state, launch, "gpu_memcpy", name, start, dur, nbytes)
        state.gpu_free_ns = start + dur
        end = start + dur + 2_000
        args = {
            "External id": state.external_id,
            "cbid": self.cbid.get(runtime, 0),
            "correlation": launch.correlation,
        }
        state.events.append(
            state.encoder.cpu("cuda_runtime", runtime, launch_ts, end - launch_ts, args)
        )
        state.events.append(state.encoder.flow_start(launch.correlation, launch_ts))
        state.events.append(
            state.encoder.cpu("cpu_op", "aten::copy_", t, end + 1_000 - t, copy_args)
        )
        finish = end + 3_000
        step_frame, frames = state.pending_frames
        for frame in reversed(frames):
            finish += 1_000
            self._close(state, frame, finish)
        self._close(state, step_frame, finish + 1_000)
        return finish + 1_000

    # -- one step --------------------------------------------------------------------------------
    def run_step(self, plan: StepPlan) -> tuple[int, list[int]]:
        """Simulate one step on every rank; returns (end ns, ranks whose trace ended in a hang)."""
        self._shared_cpu.clear()  # past steps' shared draws: memory stays one step's worth
        self._shared_comm_host.clear()
        self.first_launches = []
        for state in self.ranks.values():
            jitter = int(state.rng.exponential(2_000))
            self._host_step(state, plan, plan.start_ns + jitter)
        recv_arrival: dict[int, int] = {}
        for state in self.ranks.values():
            for launch in state.launches:
                if launch.kind == "recv":
                    recv_arrival[state.rank] = max(
                        state.gpu_free_ns, launch.ts_ns + self._launch_delay(state)
                    )
        send_arrival: dict[int, int] = {}
        for stage in range(self.topology.pp):
            ranks = self.topology.stage_ranks(self.replica, stage)
            if not self._gpu_stage(plan, ranks, recv_arrival, send_arrival):
                return self._hang_flush()
        self.p2p_exchanges += 1
        end = 0
        for state in self.ranks.values():
            end = max(end, self._copy_back(state, plan))
        return end, []

    def _hang_flush(self) -> tuple[int, list[int]]:
        """A hung collective: open frames never close (Kineto drops them); the replica stops."""
        end = 0
        for state in self.ranks.values():
            state.open_frames.clear()
            end = max(end, state.gpu_free_ns)
        return end, [s.rank for s in self.ranks.values() if s.hung]

    def streams_of(self, rank: int) -> list[int]:
        """The streams a rank's trace names (for its thread metadata)."""
        return self.ranks[rank].streams.used()

    def drain(self, rank: int) -> list[bytes]:
        events = self.ranks[rank].events
        self.ranks[rank].events = []
        return events
