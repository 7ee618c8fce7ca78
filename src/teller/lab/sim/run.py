"""Run a simulated case: every replica's ranks, logs and spans, then labels and a manifest.

Output layout matches the real lab's:

    CASE/traces/rank{R}.pt.trace.json.gz   one Kineto trace per rank
    CASE/logs/server{D}.log                 one vLLM console per replica (API server, engine, workers)
    CASE/otlp/spans.json                    OTLP JSON, one llm_request span per finished request
    CASE/ground_truth/steps.jsonl           the engine's own record, as the real lab writes it
    CASE/ground_truth/requests.jsonl        (plus `replica`), and lines.jsonl: who printed each
    CASE/ground_truth/lines.jsonl           log line, about which step and request (logs.py)
    CASE/labels.json                        teller.labels.CaseLabels, source "sim"
    CASE/manifest.json                      configuration, files, event counts, calibration inputs

Everything is written under a temporary sibling directory and renamed into place at the end, so a
failure never leaves a half-written case. Replicas share no collectives, so they run as separate
processes (`jobs`); each draws from its own seeded generators, so the bytes do not depend on how
many processes ran them.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from teller.errors import TellerError
from teller.faults import FAULTS
from teller.lab.sim.calibration import load
from teller.lab.sim.engine import EngineConfig, Scheduler, WorkloadConfig
from teller.lab.sim.faults import WATCHDOG_TIMEOUT_NS, FaultModel, FaultSpec
from teller.lab.sim.kineto_writer import EventEncoder, KinetoWriter
from teller.lab.sim.logs import (
    EngineLog,
    GroundTruth,
    Process,
    SpanWriter,
    merge_ground_truth,
    worker_name,
)
from teller.lab.sim.replica import LayerTemplate, ReplicaModel
from teller.lab.sim.topology import Topology
from teller.lab.sim.visible import TIMED_FAULTS, FaultFreeStep
from teller.labels import CaseLabels

MANIFEST_SCHEMA = "teller.sim.manifest/1"
START_UNIX_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z: a fixed clock keeps bytes stable


@dataclass(frozen=True)
class SimConfig:
    topology: Topology
    steps: int = 50
    layers: int = 4
    python_frames: bool = True
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    fault: FaultSpec = field(default_factory=FaultSpec)
    seed: int = 0
    start_unix_ns: int = START_UNIX_NS
    #: the served model's id (OTLP `gen_ai.response.model`); default: the calibrated model's
    model: str = field(default_factory=lambda: load().model["model_id"])

    def validate(self) -> None:
        t, f = self.topology, self.fault
        if self.steps < 1 or self.layers < t.pp:
            raise ValueError("need at least one step and at least one layer per pipeline stage")
        if not 0 <= f.rank < t.world_size:
            raise ValueError(f"guilty rank {f.rank} is not in 0..{t.world_size - 1}")
        crosses_nodes = t.replica_size > t.gpus_per_node or t.tp > t.gpus_per_node
        if f.fault in ("net_delay", "bandwidth_throttle") and not crosses_nodes:
            raise ValueError(
                f"{f.fault} needs traffic between nodes: use --pp or a tp above --gpus-per-node"
            )
        if f.fault in ("straggler", "link_contention", "collective_hang") and t.tp < 2:
            raise ValueError(f"{f.fault} needs tensor parallelism (--tp 2 or more)")
        if f.fault == "link_contention":
            peer = FaultModel(f, t.gpus_per_node, t.tp).peer_of(f.rank)
            if peer // t.tp != f.rank // t.tp or peer >= t.world_size or peer == f.rank:
                raise ValueError(
                    f"link_contention: rank {f.rank}'s ring neighbour {peer} is not in its tp group"
                )


@dataclass
class ReplicaResult:
    replica: int
    steps_done: int
    step_start_ns: list[int]
    step_end_ns: list[int]
    events_per_rank: dict[int, int]
    requests_finished: int
    preemptions: int
    hung_ranks: list[int]
    #: the steps the fault changed, for faults whose window does not act on every step:
    #: kernel_regression's steps where the guilty rank ran another kernel, scheduler_misconfig's
    #: steps whose limits held work back (StepPlan.held_back), a timed fault's steps it visibly
    #: slowed (visible.py); None: every window step
    acted_steps: list[int] | None = None


@dataclass
class SimResult:
    case_dir: Path
    labels: CaseLabels
    replicas: list[ReplicaResult]
    seconds: float

    @property
    def events(self) -> int:
        return sum(sum(r.events_per_rank.values()) for r in self.replicas)


def simulate(
    config: SimConfig, out: str | Path, jobs: int = 1, progress: bool = False
) -> SimResult:
    """Write one simulated case to `out` (which must not exist or be empty)."""
    try:
        config.validate()
    except ValueError as error:
        raise TellerError(f"{out}: {error}") from None
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TellerError(f"{out}: already exists and is not empty; choose a new case directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a case is an ordinary directory
    started = time.perf_counter()
    try:
        for sub in ("traces", "logs", "otlp", "ground_truth"):
            (tmp / sub).mkdir()
        results = _run_replicas(config, tmp, jobs, progress)
        _merge_spans(tmp, config.topology.replicas)
        merge_ground_truth(tmp / "ground_truth", config.topology.replicas)
        labels = make_labels(config, out.name, results)
        labels.write(tmp)
        _write_manifest(tmp, config, results)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SimResult(out, labels, results, time.perf_counter() - started)


_STEPS_DONE = None  # a worker process's shared step counter (set by _init_worker)


def _init_worker(counter) -> None:
    global _STEPS_DONE
    _STEPS_DONE = counter


def _count_step(_: int) -> None:
    with _STEPS_DONE.get_lock():
        _STEPS_DONE.value += 1


def _run_in_worker(config: SimConfig, replica: int, tmp: Path) -> ReplicaResult:
    return run_replica(config, replica, tmp, _count_step)


def _run_replicas(config: SimConfig, tmp: Path, jobs: int, progress: bool) -> list[ReplicaResult]:
    """Replicas in-process (jobs 1) or one per worker process; the bar counts steps either way."""
    replicas = list(range(config.topology.replicas))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=config.steps * len(replicas), desc="simulating", unit="step")
    try:
        if jobs <= 1 or len(replicas) == 1:
            return [run_replica(config, r, tmp, bar.update if bar else None) for r in replicas]
        counter = multiprocessing.Value("q", 0)
        with ProcessPoolExecutor(
            max_workers=jobs, initializer=_init_worker, initargs=(counter,)
        ) as pool:
            futures = [pool.submit(_run_in_worker, config, r, tmp) for r in replicas]
            pending = set(futures)
            while pending:
                _, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                if bar:
                    bar.update(counter.value - bar.n)
            return [future.result() for future in futures]
    finally:
        if bar:
            bar.close()


def _device_header(config: SimConfig, rank: int, pg_names: list) -> dict:
    cal = load()
    header = cal.raw["header"]
    device = header["device_properties"]
    topology = config.topology
    return {
        "schemaVersion": 1,
        "deviceProperties": [device | {"id": i} for i in range(topology.gpus_per_node)],
        **{
            k: header[k]
            for k in ("cuda_runtime_version", "cupti_version", "cuda_driver_version")
            if k in header
        },
        "distributedInfo": {
            "backend": "nccl",
            "rank": rank,
            "world_size": topology.world_size,
            "pg_count": len(pg_names),
            "pg_config": [
                {
                    "pg_name": g.name,
                    "pg_desc": g.desc,
                    "backend_config": "cuda:nccl",
                    "pg_size": len(g.ranks),
                    "ranks": list(g.ranks),
                }
                for g in pg_names
            ],
        },
        "record_shapes": 1,
        "with_stack": 1 if config.python_frames else 0,
        "with_modules": 1 if config.python_frames else 0,
    }


@dataclass
class _ReplicaFiles:
    """What one replica streams into the case: a Kineto trace per rank, the server's console log,
    its spans and its ground truth. Filled as each opens, so `abort` removes what was opened."""

    writers: dict[int, KinetoWriter] = field(default_factory=dict)
    encoders: dict[int, EventEncoder] = field(default_factory=dict)
    log: EngineLog | None = None
    spans: SpanWriter | None = None
    truth: GroundTruth | None = None

    def _handles(self) -> list:
        return [*self.writers.values(), self.log, self.spans, self.truth]

    def close(self) -> None:
        for handle in self._handles():
            handle.close()

    def abort(self) -> None:
        for handle in self._handles():
            if handle is not None:
                handle.abort()


def run_replica(config: SimConfig, replica: int, tmp: Path, tick=None) -> ReplicaResult:
    """Simulate one replica to the end, streaming its rank files, log and spans into `tmp`."""
    topology = config.topology
    seeds = np.random.SeedSequence([config.seed, replica])
    sched_seed, ids_seed, *rank_seeds = seeds.spawn(2 + topology.replica_size)
    ids = np.random.default_rng(ids_seed)
    ranks = topology.replica_ranks(replica)
    base = config.start_unix_ns // 1_000_000_000 * 1_000_000_000
    pids = {r: int(ids.integers(10_000, 4_000_000)) for r in ranks}
    files = _ReplicaFiles()
    try:
        for r in ranks:
            header = _device_header(config, r, topology.groups_of(r))
            header["trace_id"] = ids.bytes(16).hex().upper()
            path = tmp / "traces" / f"rank{r}.pt.trace.json.gz"
            files.writers[r] = KinetoWriter(
                path, header, base, f"/tmp/vllm_profile/rank{r}.pt.trace.json"
            )
            files.encoders[r] = EventEncoder(pids[r], topology.local_gpu(r), base)
        workers = {r: Process(worker_name(topology, r), pids[r], r) for r in ranks}
        log_name = f"server{replica}.log"
        files.truth = GroundTruth(tmp / "ground_truth", replica, f"logs/{log_name}")
        files.log = EngineLog(
            tmp / "logs" / log_name,
            replica,
            int(ids.integers(10_000, 4_000_000)),
            int(ids.integers(10_000, 4_000_000)),
            workers,
            files.truth,
        )
        files.spans = SpanWriter(tmp / "otlp" / f".replica{replica}.part", config.model)
        return _run_steps(config, replica, files, ids, sched_seed, rank_seeds, tick)
    except BaseException:
        files.abort()
        raise


def _run_steps(
    config: SimConfig,
    replica: int,
    files: _ReplicaFiles,
    ids: np.random.Generator,
    sched_seed: np.random.SeedSequence,
    rank_seeds: list[np.random.SeedSequence],
    tick,
) -> ReplicaResult:
    """The replica's step loop: plan, run on every rank, write the step's events, lines and spans."""
    cal = load()
    topology = config.topology
    spec = config.fault
    ranks = topology.replica_ranks(replica)
    writers, log, spans, truth = files.writers, files.log, files.spans, files.truth
    faults = FaultModel(spec, topology.gpus_per_node, topology.tp)
    template = LayerTemplate(cal, config.python_frames)
    rngs = {r: np.random.default_rng(s) for r, s in zip(ranks, rank_seeds, strict=True)}
    model = ReplicaModel(replica, topology, template, faults, config.layers, files.encoders, rngs)
    scheduler = Scheduler(
        config.engine,
        config.workload,
        np.random.default_rng(sched_seed),
        config.start_unix_ns,
        replica,
    )
    starts: list[int] = []
    ends: list[int] = []
    now = config.start_unix_ns
    first_ns = now
    hung: list[int] = []
    held: list[int] = []
    slowed: list[int] = []
    replays = spec.fault in TIMED_FAULTS and spec.rank in ranks
    finished = 0
    for step in range(config.steps):
        _apply_scheduler_faults(config, scheduler, step)
        if spec.fault == "kv_pressure":  # the cache shrinks to 1/(1 + 4x) inside the window
            shrink = 1 - 1 / (1 + 4 * spec.intensity)
            scheduler.reserve(int(config.engine.kv_blocks * shrink) if spec.active(step) else 0)
        plan = scheduler.plan(step, now)
        if plan.held_back:
            held.append(step)
        for request in scheduler.arrived:
            truth.arrived(request)
            log.arrived(request)
        scheduler.arrived.clear()
        fault_free = FaultFreeStep.replay(model, plan) if replays and spec.active(step) else None
        end, hung = model.run_step(plan)
        if fault_free is not None and fault_free.visible(model, end):
            slowed.append(step)
        for r in ranks:
            writers[r].write(model.drain(r))
        starts.append(plan.start_ns)
        ends.append(end)
        if hung:
            _watchdog(log, model, topology, hung, end, step)
            break
        log.scheduled(plan, scheduler.preemptions_total)
        for rank, kernel, launch_ns in model.first_launches:
            log.jit(rank, kernel, launch_ns, step)
        scheduler.complete(plan, end)
        truth.step(plan, end)
        # finished lines come before the step's iteration line, as the real lab's engine prints
        for request in scheduler.finished:
            log.finished(request, step)
            spans.write(request, ids.bytes(16).hex(), ids.bytes(8).hex())
            finished += 1
        scheduler.finished.clear()
        log.step(plan, end, scheduler.kv_usage, len(scheduler.waiting), len(scheduler.running))
        now = end + config.engine.step_overhead_ns
        if tick:
            tick(1)
    last = max(ends) if ends else now
    for r in ranks:
        encoder = files.encoders[r]
        writers[r].write(
            encoder.metadata(first_ns, "python3", topology.gpus_per_node, model.streams_of(r))
        )
        writers[r].write(encoder.profiler_span(first_ns - 1_000_000, last + 1_000_000))
    events = {r: writers[r].events for r in ranks}
    files.close()
    return ReplicaResult(
        replica,
        len(starts),
        starts,
        ends,
        events,
        finished,
        scheduler.preemptions_total,
        hung,
        _acted_steps(spec.fault, model.regressed_steps, held, slowed),
    )


def _acted_steps(
    fault: str, regressed: list[int], held: list[int], slowed: list[int]
) -> list[int] | None:
    if fault == "kernel_regression":
        return sorted(set(regressed))
    if fault == "scheduler_misconfig":
        return held
    if fault in TIMED_FAULTS:
        return slowed
    return None


def _apply_scheduler_faults(config: SimConfig, scheduler: Scheduler, step: int) -> None:
    spec = config.fault
    if spec.fault == "scheduler_misconfig":
        shrink = 1 + 3 * spec.intensity if spec.active(step) else 1.0
        scheduler.engine = dataclasses.replace(
            config.engine,
            max_num_batched_tokens=max(int(config.engine.max_num_batched_tokens / shrink), 16),
            max_num_seqs=max(int(config.engine.max_num_seqs / shrink), 1),
        )
    elif spec.fault == "workload_shift":
        scheduler.prompt_scale = 1 + 4 * spec.intensity if spec.active(step) else 1.0


def _watchdog(
    log: EngineLog, model: ReplicaModel, topology: Topology, hung: list[int], end: int, step: int
) -> None:
    hung_at = model.hung_at
    group = model.tp_group[hung[0]]
    for rank in group.ranks:
        if rank in hung:
            continue
        log.watchdog(
            rank,
            group.name,
            group.desc,
            group.ranks.index(rank),
            hung_at.seq,
            end,
            hung_at.nelems,
            WATCHDOG_TIMEOUT_NS // 1_000_000,
            step,
        )


def _merge_spans(tmp: Path, replicas: int) -> None:
    """Concatenate the replicas' span lists into one OTLP document, streaming."""
    opening, closing = b'"spans":[\n', b"\n]}]}]}\n"
    with open(tmp / "otlp" / "spans.json", "wb") as handle:
        wrote_any = False
        for replica in range(replicas):
            part = tmp / "otlp" / f".replica{replica}.part"
            data = part.read_bytes()
            start = data.index(opening) + len(opening)
            stop = data.rindex(closing)
            if replica == 0:
                handle.write(data[:start])
            body = data[start:stop]
            if body:
                handle.write((b",\n" if wrote_any else b"") + body)
                wrote_any = True
            part.unlink()
        handle.write(closing)


def guilty_operator(config: SimConfig) -> str | None:
    cal = load()
    template = LayerTemplate(cal, config.python_frames)
    fault, topology = config.fault.fault, config.topology
    comm = cal.comm["kernel"] if topology.tp > 1 else cal.p2p["p2p_kernel"]
    cross = cal.p2p["p2p_kernel"] if topology.pp > 1 else cal.comm["kernel"]
    return {
        "gpu_throttle": template.dominant_kernel,
        "gpu_contention": template.dominant_kernel,
        "kv_pressure": cal.model["model_module"],
        "host_cpu_contention": "cudaLaunchKernel",
        "net_delay": cross,
        "bandwidth_throttle": cross,
        "straggler": comm,
        "link_contention": comm,
        "collective_hang": comm,
        "kernel_regression": "cudaLaunchKernel"
        if config.fault.variant == "graph_fallback"
        else cal.gemm_fallback(),
    }.get(fault)


EXPLANATIONS = {
    "none": "No fault was injected.",
    "workload_shift": "Longer prompts arrived; steps grew with the work, which is not a fault.",
    "gpu_throttle": "GPU {rank} is power-capped: all its kernels run slower, led by {op}.",
    "gpu_contention": "Another process shares GPU {rank}: its kernels ({op} first) slow erratically.",
    "kv_pressure": "The KV cache is too small: requests are preempted and their prefills recomputed.",
    "host_cpu_contention": "Rank {rank}'s host CPU is contended: launches ({op}) lag and the GPU idles.",
    "net_delay": "The network link of rank {rank}'s node adds latency to {op}.",
    "bandwidth_throttle": "The network link of rank {rank}'s node lost bandwidth; {op} takes longer.",
    "straggler": "Rank {rank} reaches every collective late; its peers wait inside {op}.",
    "link_contention": "The link between rank {rank} and its ring neighbour is contended; {op} slows.",
    "kernel_regression": "On rank {rank} an operator regressed: {op} now runs where the fast path ran.",
    "scheduler_misconfig": "The scheduler's token budget and batch size are too small: requests queue.",
    "collective_hang": "Rank {rank} never reached its all-reduce; peers hung in {op} until the NCCL watchdog fired.",
}


def make_labels(config: SimConfig, case_id: str, results: list[ReplicaResult]) -> CaseLabels:
    spec, topology = config.fault, config.topology
    view = FAULTS[spec.fault]
    is_fault = view != "-"
    replica = spec.rank // topology.replica_size
    result = next(r for r in results if r.replica == replica)
    first, last = spec.window[0], min(spec.window[1], result.steps_done)
    steps = list(range(first, last)) if spec.fault != "none" else []
    window = None
    if steps:
        window = (result.step_start_ns[steps[0]], result.step_end_ns[steps[-1]])
    if result.acted_steps is not None:  # only the window's steps the fault changed are anomalous
        acted = set(result.acted_steps)
        steps = [s for s in steps if s in acted]
    op = guilty_operator(config) if is_fault else None
    return CaseLabels(
        case_id=case_id,
        source="sim",
        fault=spec.fault,
        view=view,
        guilty_rank=spec.rank if is_fault else None,
        guilty_operator=op,
        window_ns=window,
        steps=steps,
        intensity=spec.intensity,
        seed=config.seed,
        explanation=EXPLANATIONS[spec.fault].format(rank=spec.rank, op=op),
        params={
            "topology": dataclasses.asdict(topology),
            "engine": dataclasses.asdict(config.engine),
            "workload": dataclasses.asdict(config.workload),
            "layers": config.layers,
            "python_frames": config.python_frames,
            "fault_window_steps": list(spec.window)
            if spec.window[1] < 1 << 62
            else [spec.window[0], None],
            "variant": spec.variant or None,
            "peer": FaultModel(spec, topology.gpus_per_node, topology.tp).peer_of(spec.rank)
            if spec.fault == "link_contention"
            else None,
        },
    )


def _write_manifest(tmp: Path, config: SimConfig, results: list[ReplicaResult]) -> None:
    cal = load()
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "source": "sim",
        "config": {
            "topology": dataclasses.asdict(config.topology),
            "steps": config.steps,
            "layers": config.layers,
            "python_frames": config.python_frames,
            "engine": dataclasses.asdict(config.engine),
            "workload": dataclasses.asdict(config.workload),
            "fault": dataclasses.asdict(config.fault)
            | {"window": [config.fault.window[0], min(config.fault.window[1], 1 << 62)]},
            "seed": config.seed,
            "start_unix_ns": config.start_unix_ns,
            "model": config.model,
        },
        "calibration": {"command": cal.raw["meta"]["command"], "inputs": cal.inputs},
        "replicas": [
            {
                "replica": r.replica,
                "steps": r.steps_done,
                "requests_finished": r.requests_finished,
                "preemptions": r.preemptions,
                "hung_ranks": r.hung_ranks,
                "events_per_rank": {str(k): v for k, v in sorted(r.events_per_rank.items())},
            }
            for r in results
        ],
        "files": [{"path": str(p.relative_to(tmp)), "bytes": p.stat().st_size} for p in files],
    }
    path = tmp / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1) + "\n")
