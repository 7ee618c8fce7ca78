"""The engine's own records: vLLM-V1-style log lines per server, one OTLP span per request, and the
ground truth of both.

Line shapes follow shared/formats/engine-logs.md (quoted from users' reports): a process prefix
`(APIServer pid=N)` / `(EngineCore_0 pid=N)` / `(Worker_TP1 pid=N)`, level, `MM-DD HH:MM:SS` (no
year, no sub-second), `[file.py:line]`, then the message. Workers' NCCL watchdog lines use
PyTorch's glog shape. Log and span writers stream: lines and spans go to disk as they happen.

`GroundTruth` writes what the real lab's engine writes (teller.lab.serve.worker): which request ran
in which step (`steps.jsonl`) and each request's times (`requests.jsonl`), plus what only a
simulator knows exactly: which process (and rank) printed each log line and which step and request
the line is about (`lines.jsonl`).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from teller.lab.sim.engine import Request, StepPlan
from teller.lab.sim.topology import Topology

#: (file, line) of each message, as printed in the quoted real lines.
RECEIVED = "logger.py:49"
ADDED = "async_llm.py:382"
FINISHED = "async_llm.py:382"
STATS = "loggers.py:257"
RESUMED = "scheduler.py:495"
PREEMPTED = "scheduler.py:1089"
JIT = "jit_monitor.py:135"
STATS_INTERVAL_NS = 10_000_000_000
_IDENTIFIER = re.compile(r"\w+")


def clock(t_ns: int) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.gmtime(t_ns // 1_000_000_000))


@dataclass(frozen=True)
class Process:
    """A process that prints to the server's console; `rank` only for GPU workers."""

    name: str
    pid: int
    rank: int | None = None

    @property
    def prefix(self) -> str:
        return f"({self.name} pid={self.pid})"


def worker_name(topology: Topology, rank: int) -> str:
    """vLLM's worker process tag: `Worker`, then `_PP<stage>` with pp > 1, `_TP<i>` with tp > 1."""
    stage, tp_index = divmod(rank % topology.replica_size, topology.tp)
    name = "Worker"
    if topology.pp > 1:
        name += f"_PP{stage}"
    if topology.tp > 1:
        name += f"_TP{tp_index}"
    return name


@dataclass(frozen=True)
class About:
    """What a log line is about, for the ground truth: a step and a request (None: none).

    Admission lines (Received, Added) are about the request's first step, which only its
    scheduling tells: `admission` marks them, and the ground truth fills the step in at the end.
    """

    step: int | None = None
    request: Request | None = None
    admission: bool = False


#: A line about no step and no request (stats lines).
NOTHING = About()


def jit_kernel_name(kernel: str) -> str:
    """The name a JIT monitor prints for a kernel: a function name, one identifier.

    A demangled C++ kernel name (`void cutlass::Kernel2<cutlass_80_simt_sgemm_…>(…::Params)`) is
    cut to its longest identifier, the instantiated kernel's own name, which the trace's kernel
    name contains.
    """
    return max(_IDENTIFIER.findall(kernel), key=len, default=kernel)


class EngineLog:
    """One vLLM server's console (API server, engine core and workers share it).

    Every line is reported to `truth` with the process that printed it and what it is about.
    """

    def __init__(
        self,
        path: Path,
        replica: int,
        api_pid: int,
        core_pid: int,
        workers: dict[int, Process],
        truth: GroundTruth,
    ) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp")
        self.handle = open(self.tmp, "w")  # noqa: SIM115 - closed in close()
        self.replica = replica
        self.api = Process("APIServer", api_pid)
        self.core = Process(f"EngineCore_{replica}", core_pid)
        self.workers = workers
        self.truth = truth
        self.lines = 0
        self.next_stats_ns = -1
        self.window_prompt = 0
        self.window_generation = 0

    def _write(self, process: Process, text: str, about: About = NOTHING) -> None:
        self.handle.write(text + "\n")
        self.lines += 1
        self.truth.line(self.lines, process, about)

    def _line(
        self, process: Process, level: str, t_ns: int, where: str, message: str, about: About
    ) -> None:
        """A vLLM logger line: process prefix, level, time, `[file.py:line]`, message."""
        self._write(process, f"{process.prefix} {level} {clock(t_ns)} [{where}] {message}", about)

    def arrived(self, request: Request) -> None:
        """Received and Added: about the request's first step, which only its scheduling tells."""
        admission = About(request=request, admission=True)
        self._line(
            self.api,
            "INFO",
            request.arrival_ns,
            RECEIVED,
            f"Received request {request.request_id}: params: SamplingParams(n=1, "
            f"max_tokens={request.output_tokens}), lora_request: None.",
            admission,
        )
        self._line(
            self.api,
            "INFO",
            request.arrival_ns,
            ADDED,
            f"Added request {request.engine_id}.",
            admission,
        )

    def finished(self, request: Request, step: int) -> None:
        self._line(
            self.api,
            "INFO",
            request.finish_ns,
            FINISHED,
            f"Finished request {request.engine_id}.",
            About(step, request),
        )

    def scheduled(self, plan: StepPlan, total_preemptions: int) -> None:
        """What scheduling the step printed: requests it preempted and requests it resumed."""
        for request in plan.preempted:
            self._line(
                self.core,
                "WARNING",
                plan.start_ns,
                PREEMPTED,
                f"Sequence group {request.engine_id} is preempted by "
                "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
                "This can affect the end-to-end performance. Increase "
                "gpu_memory_utilization or tensor_parallel_size to provide more KV cache "
                f"memory. total_num_cumulative_preemption={total_preemptions}",
                About(plan.index, request),
            )
        for request in plan.resumed:
            self._line(
                self.core,
                "INFO",
                plan.start_ns,
                RESUMED,
                f"Preempted request {request.engine_id} has been resumed!",
                About(plan.index, request),
            )

    def jit(self, rank: int, kernel: str, t_ns: int, step: int) -> None:
        """vLLM's warning when a worker compiles a kernel while serving (a new shape or config)."""
        self._line(
            self.workers[rank],
            "WARNING",
            t_ns,
            JIT,
            f"Triton kernel JIT compilation during inference: {jit_kernel_name(kernel)}. "
            "This causes a latency spike; consider extending warmup to cover this shape/config.",
            About(step),
        )

    def step(
        self,
        plan: StepPlan,
        end_ns: int,
        kv_usage: float,
        waiting: int,
        running: int,
    ) -> None:
        """The step's iteration line, and the periodic stats line when one is due."""
        elapsed_ms = (end_ns - plan.start_ns) / 1e6
        gen = len(plan.decode)
        self._line(
            self.core,
            "INFO",
            end_ns,
            STATS,
            f"Engine {self.replica:03d}: Iteration({plan.index}): {len(plan.prefill)} context "
            f"requests, {plan.context_tokens} context tokens, {gen} generation requests, "
            f"{gen} generation tokens, iteration elapsed time: {elapsed_ms:.2f} ms, "
            f"GPU KV cache usage: {kv_usage * 100:.1f}%",
            About(plan.index),
        )
        self.window_prompt += plan.context_tokens
        self.window_generation += gen
        if self.next_stats_ns < 0:
            self.next_stats_ns = plan.start_ns + STATS_INTERVAL_NS
        if end_ns >= self.next_stats_ns:
            seconds = STATS_INTERVAL_NS / 1e9
            self._line(
                self.api,
                "INFO",
                end_ns,
                STATS,
                f"Engine {self.replica:03d}: Avg prompt throughput: "
                f"{self.window_prompt / seconds:.1f} tokens/s, Avg generation throughput: "
                f"{self.window_generation / seconds:.1f} tokens/s, Running: {running} reqs, "
                f"Waiting: {waiting} reqs, GPU KV cache usage: {kv_usage * 100:.1f}%, "
                "Prefix cache hit rate: 0.0%",
                NOTHING,
            )
            self.window_prompt = self.window_generation = 0
            self.next_stats_ns += STATS_INTERVAL_NS

    def watchdog(
        self,
        rank: int,
        group_name: str,
        group_desc: str,
        group_rank: int,
        seq: int,
        t_ns: int,
        numel: int,
        timeout_ms: int,
        step: int,
    ) -> None:
        stamp = time.strftime("%m%d %H:%M:%S", time.gmtime(t_ns // 1_000_000_000))
        micros = (t_ns // 1000) % 1_000_000
        where = f"[rank{rank}]:[E{stamp}.{micros:06d}000 ProcessGroupNCCL.cpp:1709]"
        pg = f"[PG {group_name} ({group_desc}) Rank {group_rank}]"
        worker, about = self.workers[rank], About(step)
        self._write(
            worker,
            f"{where} {pg} Timeout at NCCL work: {seq}, last enqueued NCCL work: {seq}, "
            f"last completed NCCL work: {seq - 1}.",
            about,
        )
        self._write(
            worker,
            f"{where} {pg} Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
            f"OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, Timeout(ms)={timeout_ms}) ran "
            f"for {timeout_ms + 11} milliseconds before timing out.",
            about,
        )

    def close(self) -> None:
        self.handle.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.handle.close()
        self.tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class _Line:
    number: int
    process: Process
    about: About


class GroundTruth:
    """One replica's ground truth, written into `folder` as `.replica<D>.<name>.part` files that
    `merge_ground_truth` joins into the case's `ground_truth/<name>.jsonl`.

    Rows have the real lab's keys plus `replica` (cases may run several engines):

    * steps.jsonl: `{step, start_ns, end_ns, annotation, requests: [{request_id, phase, tokens}],
      replica}` for every step that completed (a hung step never does, as in the trace);
    * requests.jsonl: `{request_id, arrival_ns, first_token_ns?, finish_ns?, replica}`, in arrival
      order, the times a request did not reach left out;
    * lines.jsonl: `{log, line, process, pid, rank, step, request_id, replica}`, one per log line
      (1-based, in file order): the process that printed it (`rank` for GPU workers, else null),
      the step it is about (null for none) and its request (null for none). A request's
      Received/Added lines are about its first step, Finished about its last, a preemption about
      the step whose scheduling preempted it (which the request is not in), a resumption about
      the step that resumed it, an iteration line about its step, a JIT warning about the step
      whose kernel it compiled, a watchdog line about the hung step. Stats lines and lines of a
      request that never ran have step null.

    Request ids are the engine's (what the engine core's lines print).
    """

    NAMES = ("steps", "requests", "lines")

    def __init__(self, folder: Path, replica: int, log_name: str) -> None:
        self.folder = Path(folder)
        self.replica = replica
        self.log_name = log_name
        self.handle = open(self.part("steps"), "wb")  # noqa: SIM115 - closed in close()
        self.requests: list[Request] = []
        self.first_step: dict[int, int] = {}  # request index → the first step it ran in
        self.lines: list[_Line] = []

    def part(self, name: str) -> Path:
        return self.folder / f".replica{self.replica}.{name}.part"

    def arrived(self, request: Request) -> None:
        self.requests.append(request)

    def line(self, number: int, process: Process, about: About) -> None:
        self.lines.append(_Line(number, process, about))

    def step(self, plan: StepPlan, end_ns: int) -> None:
        """Record a completed step (as the lab's engine does once execute returns)."""
        requests = [
            {"request_id": request.engine_id, "phase": "prefill", "tokens": chunk}
            for request, chunk, _ in plan.prefill
        ] + [
            {"request_id": request.engine_id, "phase": "decode", "tokens": 1}
            for request, _ in plan.decode
        ]
        for request, _, _ in plan.prefill:
            self.first_step.setdefault(request.index, plan.index)
        row = {
            "step": plan.index,
            "start_ns": plan.start_ns,
            "end_ns": end_ns,
            "annotation": plan.annotation(),
            "requests": requests,
            "replica": self.replica,
        }
        self.handle.write(orjson.dumps(row) + b"\n")

    def close(self) -> None:
        self.handle.close()
        rows = []
        for request in self.requests:
            row: dict = {"request_id": request.engine_id, "arrival_ns": request.arrival_ns}
            if request.first_token_ns >= 0:
                row["first_token_ns"] = request.first_token_ns
            if request.finish_ns >= 0:
                row["finish_ns"] = request.finish_ns
            row["replica"] = self.replica
            rows.append(orjson.dumps(row) + b"\n")
        self.part("requests").write_bytes(b"".join(rows))
        rows = []
        for line in self.lines:
            request, step = line.about.request, line.about.step
            if line.about.admission:
                step = self.first_step.get(request.index)
            row = {
                "log": self.log_name,
                "line": line.number,
                "process": line.process.name,
                "pid": line.process.pid,
                "rank": line.process.rank,
                "step": step,
                "request_id": request.engine_id if request is not None else None,
                "replica": self.replica,
            }
            rows.append(orjson.dumps(row) + b"\n")
        self.part("lines").write_bytes(b"".join(rows))

    def abort(self) -> None:
        self.handle.close()
        for name in self.NAMES:
            self.part(name).unlink(missing_ok=True)


def merge_ground_truth(folder: Path, replicas: int) -> None:
    """Join the replicas' parts into steps.jsonl, requests.jsonl and lines.jsonl, replica order."""
    for name in GroundTruth.NAMES:
        with open(folder / f"{name}.jsonl", "wb") as handle:
            for replica in range(replicas):
                part = folder / f".replica{replica}.{name}.part"
                handle.write(part.read_bytes())
                part.unlink()


class SpanWriter:
    """OTLP-JSON (`resourceSpans`) with one `llm_request` SERVER span per finished request."""

    def __init__(self, path: Path, model_name: str) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp")
        self.handle = open(self.tmp, "wb")  # noqa: SIM115 - closed in close()
        self.model_name = model_name
        resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]}
        self.handle.write(
            b'{"resourceSpans":[{"resource":'
            + orjson.dumps(resource)
            + b',"scopeSpans":[{"scope":{"name":"vllm.llm_engine"},"spans":[\n'
        )
        self.count = 0

    def write(self, request: Request, trace_id: str, span_id: str) -> None:
        def attr(key: str, value) -> dict:
            if isinstance(value, (bool, str)):
                return {"key": key, "value": {"stringValue": str(value)}}
            if isinstance(value, int):
                return {"key": key, "value": {"intValue": str(value)}}
            return {"key": key, "value": {"doubleValue": value}}

        s = 1e-9
        queue = (request.first_scheduled_ns - request.arrival_ns) * s
        e2e = (request.finish_ns - request.arrival_ns) * s
        prefill, decode = request.prefill_ns * s, request.decode_ns * s
        span = {
            "traceId": trace_id,
            "spanId": span_id,
            "name": "llm_request",
            "kind": 2,
            "startTimeUnixNano": str(request.arrival_ns),
            "endTimeUnixNano": str(request.finish_ns),
            "attributes": [
                attr("gen_ai.request.id", request.request_id),
                attr("gen_ai.request.n", 1),
                attr("gen_ai.request.max_tokens", request.output_tokens),
                attr("gen_ai.request.top_p", 1.0),
                attr("gen_ai.request.temperature", 0.0),
                attr("gen_ai.response.model", self.model_name),
                {
                    "key": "gen_ai.response.finish_reasons",
                    "value": {"arrayValue": {"values": [{"stringValue": "length"}]}},
                },
                attr("gen_ai.usage.prompt_tokens", request.prompt_tokens),
                attr("gen_ai.usage.completion_tokens", request.generated),
                attr("gen_ai.usage.num_sequences", 1),
                attr("gen_ai.usage.cached_tokens", 0),
                attr("gen_ai.latency.time_in_queue", queue),
                attr(
                    "gen_ai.latency.time_to_first_token",
                    (request.first_token_ns - request.arrival_ns) * s,
                ),
                attr("gen_ai.latency.e2e", e2e),
                attr("gen_ai.latency.time_in_scheduler", queue),
                attr("gen_ai.latency.time_in_model_forward", prefill + decode),
                attr("gen_ai.latency.time_in_model_execute", prefill + decode),
                attr("gen_ai.latency.time_in_model_prefill", prefill),
                attr("gen_ai.latency.time_in_model_decode", decode),
                attr("gen_ai.latency.time_in_model_inference", prefill + decode),
            ],
            "status": {},
        }
        self.handle.write((b",\n" if self.count else b"") + orjson.dumps(span))
        self.count += 1

    def close(self) -> None:
        self.handle.write(b"\n]}]}]}\n")
        self.handle.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.handle.close()
        self.tmp.unlink(missing_ok=True)
