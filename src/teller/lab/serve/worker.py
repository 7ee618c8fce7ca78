"""One rank of the served model: `python -m teller.lab.serve.worker DIR/run/serve.json` (RANK set).

Rank 0 is also the engine core: it admits requests as they arrive, schedules each step, publishes
the plan through the rendezvous TCP store (out of band, like vLLM's shared-memory broadcast, so it
is not a collective in the trace), runs the step, and logs. Every rank wraps a step in
`record_function("execute_context_N(T)_generation_M(G)")`; a profiler started from outside (the
collector) records it, and without one the annotation costs next to nothing.

With `http_port` set, rank 0 also serves the engine's endpoints (`teller.lab.serve.endpoints`):
`/metrics` in vLLM's names, and `/start_profile`/`/stop_profile`, whose toggle rides on the next
plan so every rank starts and stops its own profiler (`teller.lab.serve.profiler`) at the same step.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from teller.lab.faults import inprocess
from teller.lab.guard import die_with_expected_parent
from teller.lab.serve.config import ServeConfig
from teller.lab.serve.control import ProfileControl
from teller.lab.serve.endpoints import EngineEndpoints
from teller.lab.serve.executor import Executor
from teller.lab.serve.logs import iteration_line, process_logger, stats_line
from teller.lab.serve.metrics import EngineMetrics
from teller.lab.serve.model import build_model, map_weights_from_disk
from teller.lab.serve.profiler import RankProfiler
from teller.lab.serve.scheduler import Scheduler, StepPlan
from teller.lab.serve.workload import generate_requests

#: Nominal KV capacity the "GPU KV cache usage" figure is computed against.
KV_CAPACITY_TOKENS = 32_768
STORE_TIMEOUT = timedelta(seconds=300)
#: Longest idle sleep between arrival checks, so a new request waits at most this long.
IDLE_POLL_S = 0.005


def main(argv: list[str]) -> int:
    die_with_expected_parent()  # a killed launcher leaves no rank waiting at a collective
    config = ServeConfig.read(argv[0])
    rank = int(os.environ["RANK"])
    run_dir = Path(config.run_dir)
    (run_dir / f"rank{rank}.pid").write_text(str(os.getpid()))
    torch.set_num_threads(config.threads_per_rank)
    worker_log = process_logger(f"Worker_TP{rank}")
    store = rendezvous_store(config, rank)
    device = rank_device(rank)
    if config.tp > 1:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=config.tp
        )
    model = build_model(config.model, config.tp, device)
    if device.type == "cpu":
        weight_bytes = map_weights_from_disk(model, run_dir / f"weights-rank{rank}.bin")
        where = f"{weight_bytes / 2**20:.1f} MiB of file-mapped weights"
    else:  # device memory: nothing to map (memory_pressure is a host-memory fault)
        where = f"weights on {device}"
    worker_log.info(
        "Loaded Llama (%d layers, hidden %d) as TP rank %d of %d, attention %s, %s",
        config.model.num_hidden_layers,
        config.model.hidden_size,
        rank,
        config.tp,
        config.model.attn_implementation,
        where,
    )
    executor = Executor(model, device)
    _warm_up(executor, config.warmup_steps)
    profiler = RankProfiler(config.profile_dir, rank, device) if _serves_profiler(config) else None
    if config.tp > 1:
        dist.barrier()
    if rank == 0:
        t0_ns = time.time_ns()
        store.set("t0_ns", str(t0_ns))
        _write_atomic(run_dir / "t0_ns", str(t0_ns))
    else:
        t0_ns = int(store.get("t0_ns"))
    worker_log.info("Warm-up done; serving")
    faults = inprocess.start(config.fault, rank, model, t0_ns, run_dir.parent / "ground_truth")
    try:
        if rank == 0:
            _engine_core(config, executor, store, faults, t0_ns, run_dir, profiler)
        else:
            _follow(executor, store, faults, profiler)
    finally:
        faults.stop()
    worker_log.info("Stopped")
    if config.tp > 1:
        dist.barrier()
        dist.destroy_process_group()
        # profiled gloo work freed only at interpreter exit can SIGABRT a gloo run-loop thread
        # (see tests/align/gloo_run.py); freeing it here keeps a clean run's exit status 0
        gc.collect()
    return 0


def rendezvous_store(config: ServeConfig, rank: int) -> dist.TCPStore:
    """The run's TCP store; rank 0 serves it on `master_addr` only (loopback, or the lab's private
    namespace address), not on every interface.

    TCPStore's own server listens on all interfaces whatever host it is given, so rank 0 binds
    the socket itself and hands the store the listening descriptor."""
    if rank != 0:
        return dist.TCPStore(
            config.master_addr, config.master_port, config.tp, False, timeout=STORE_TIMEOUT
        )
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((config.master_addr, config.master_port))
    listener.listen()
    return dist.TCPStore(
        config.master_addr,
        config.master_port,
        config.tp,
        True,
        timeout=STORE_TIMEOUT,
        master_listen_fd=listener.detach(),
    )


def rank_device(rank: int) -> torch.device:
    """This rank's GPU (by LOCAL_RANK, as torchrun sets it) when CUDA is present, else the CPU.

    Chosen before the process group exists so that NCCL binds each rank to its own device."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def _warm_up(executor: Executor, steps: int) -> None:
    """Run a few unannotated steps so first-call costs do not land in the first served step."""
    for k in range(steps):
        ids = [f"warmup-{k}-{i}" for i in range(2)]
        executor.execute(StepPlan(k, prefill_ids=ids, prefill_prompts=[[1] * 32, [2] * 16]))
        executor.execute(StepPlan(k, decode_ids=ids))
        executor.execute(StepPlan(k, free_ids=ids))


def _serves_profiler(config: ServeConfig) -> bool:
    return config.http_port is not None and bool(config.profile_dir)


def _toggle_profiler(profiler: RankProfiler | None, plan: StepPlan) -> None:
    if profiler is None or not plan.profile:
        return
    if plan.profile == "start":
        profiler.start()
    else:
        profiler.stop(plan.capture_id)


def _follow(
    executor: Executor,
    store: dist.Store,
    faults: inprocess.Faults,
    profiler: RankProfiler | None,
) -> None:
    key = 0
    while True:
        plan = StepPlan.from_dict(json.loads(store.get(f"plan/{key}")))
        key += 1
        _toggle_profiler(profiler, plan)
        if plan.stop:
            return
        if plan.idle:
            continue
        faults.before_step()
        with torch.profiler.record_function(plan.annotation):
            executor.execute(plan)


def _engine_core(
    config: ServeConfig,
    executor: Executor,
    store: dist.Store,
    faults: inprocess.Faults,
    t0_ns: int,
    run_dir: Path,
    profiler: RankProfiler | None,
) -> None:
    log = process_logger("EngineCore_0")
    metrics, control, endpoints = None, None, None
    if config.http_port is not None:
        metrics = EngineMetrics(config.served_model_name)
        if profiler is not None:
            control = ProfileControl(config.profile_dir, config.tp)
        endpoints = EngineEndpoints(config.http_host, config.http_port, metrics, control)
        endpoints.start()
        _write_atomic(run_dir / "http_port", str(endpoints.port))
        log.info(
            "Serving /metrics%s on http://%s:%d",
            ", /start_profile, /stop_profile" if control else "",
            config.http_host,
            endpoints.port,
        )
    try:
        _serve_requests(config, executor, store, faults, t0_ns, run_dir, profiler, metrics, control)
    finally:
        if endpoints is not None:
            endpoints.stop()


def _serve_requests(
    config: ServeConfig,
    executor: Executor,
    store: dist.Store,
    faults: inprocess.Faults,
    t0_ns: int,
    run_dir: Path,
    profiler: RankProfiler | None,
    metrics: EngineMetrics | None,
    control: ProfileControl | None,
) -> None:
    log = process_logger("EngineCore_0")
    requests = generate_requests(config.workload, config.model.vocab_size)
    by_id = {r.request_id: r for r in requests}
    scheduler = Scheduler(config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens)
    arrivals = iter(requests)
    pending = next(arrivals, None)
    ground_truth: list[dict] = []
    request_times: dict[str, dict] = {}
    stats_start_s, stats_prompt, stats_generation = 0.0, 0, 0
    step = 0
    key = 0  # plans published: steps plus plans that only toggle the profiler

    def publish(plan: StepPlan) -> None:
        nonlocal key
        store.set(f"plan/{key}", json.dumps(plan.to_dict()))
        if key and key % 50 == 0:
            store.delete_key(f"plan/{key - 50}")
        key += 1

    while True:
        now_s = (time.time_ns() - t0_ns) / 1e9
        while pending is not None and pending.arrival_s <= now_s:
            scheduler.add(pending)
            arrival_ns = t0_ns + int(pending.arrival_s * 1e9)
            request_times[pending.request_id] = {"arrival_ns": arrival_ns}
            if metrics is not None:
                metrics.request_added(pending.request_id, arrival_ns)
            log.info("Added request %s.", pending.request_id)
            pending = next(arrivals, None)
        if now_s - stats_start_s >= config.scheduler.stats_interval_s:
            elapsed_s = now_s - stats_start_s
            log.info(
                stats_line(
                    stats_prompt / elapsed_s,
                    stats_generation / elapsed_s,
                    len(scheduler.running),
                    len(scheduler.waiting),
                    executor.cached_tokens / KV_CAPACITY_TOKENS,
                )
            )
            stats_start_s, stats_prompt, stats_generation = now_s, 0, 0
        toggle = control.take() if control is not None else None
        if toggle is not None and not scheduler.has_work:
            idle = StepPlan(step, idle=True, profile=toggle.action, capture_id=toggle.capture_id)
            publish(idle)
            _toggle_with_log(profiler, idle, log)
            control.applied(toggle)
            continue
        if not scheduler.has_work:
            if pending is None:
                break
            time.sleep(min(IDLE_POLL_S, max(0.0, pending.arrival_s - now_s)))
            continue
        plan = scheduler.schedule(
            *faults.scheduler_limits(
                config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens
            )
        )
        if toggle is not None:
            plan.profile, plan.capture_id = toggle.action, toggle.capture_id
        publish(plan)
        if toggle is not None:
            _toggle_with_log(profiler, plan, log)
            control.applied(toggle)
        faults.before_step()
        start_ns = time.time_ns()
        with torch.profiler.record_function(plan.annotation):
            executor.execute(plan)
        end_ns = time.time_ns()
        finished = scheduler.complete(plan, by_id)
        for request_id in plan.prefill_ids:
            request_times[request_id]["first_token_ns"] = end_ns
        for request_id in finished:
            request_times[request_id]["finish_ns"] = end_ns
            log.info("Finished request %s.", request_id)
        if metrics is not None:
            metrics.step_done(plan, start_ns, end_ns, finished)
            metrics.scheduler_state(
                len(scheduler.running),
                len(scheduler.waiting),
                executor.cached_tokens / KV_CAPACITY_TOKENS,
            )
        stats_prompt += plan.context_tokens
        stats_generation += len(plan.decode_ids) + len(plan.prefill_ids)
        log.info(
            iteration_line(
                step,
                len(plan.prefill_ids),
                plan.context_tokens,
                len(plan.decode_ids),
                len(plan.decode_ids),
                (end_ns - start_ns) / 1e6,
                executor.cached_tokens / KV_CAPACITY_TOKENS,
            )
        )
        ground_truth.append(_step_record(plan, start_ns, end_ns))
        step += 1
    publish(StepPlan(step, stop=True))
    truth_dir = run_dir.parent / "ground_truth"
    _write_atomic(truth_dir / "steps.jsonl", "".join(json.dumps(r) + "\n" for r in ground_truth))
    _write_atomic(
        truth_dir / "requests.jsonl",
        "".join(
            json.dumps({"request_id": request_id, **times}) + "\n"
            for request_id, times in request_times.items()
        ),
    )


def _toggle_with_log(profiler: RankProfiler | None, plan: StepPlan, log: logging.Logger) -> None:
    """Rank 0's own toggle; a stop exports its trace here, as vLLM's worker does."""
    if plan.profile == "start":
        log.info("Starting profiler (capture %s) before step %d", plan.capture_id, plan.index)
    _toggle_profiler(profiler, plan)
    if plan.profile == "stop":
        log.info("Profiler stopped (capture %s) before step %d", plan.capture_id, plan.index)


def _step_record(plan: StepPlan, start_ns: int, end_ns: int) -> dict:
    """One line of ground_truth/steps.jsonl: which request ran in which step, with its tokens."""
    return {
        "step": plan.index,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "annotation": plan.annotation,
        "held_back": plan.held_back,
        "requests": [
            {"request_id": r, "phase": "prefill", "tokens": len(p)}
            for r, p in zip(plan.prefill_ids, plan.prefill_prompts, strict=True)
        ]
        + [{"request_id": r, "phase": "decode", "tokens": 1} for r in plan.decode_ids],
    }


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
