"""The engine's own records: vLLM-V1-style log lines per server and one OTLP span per request.

Line shapes follow shared/formats/engine-logs.md (quoted from users' reports): a process prefix
`(APIServer pid=N)` / `(EngineCore_0 pid=N)`, level, `MM-DD HH:MM:SS` (no year, no sub-second),
`[file.py:line]`, then the message. Workers' NCCL watchdog lines use PyTorch's glog shape. Both
writers stream: lines and spans go to disk as they happen.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson

from teller.lab.sim.engine import Request, StepPlan

#: (file, line) of each message, as printed in the quoted real lines.
RECEIVED = "logger.py:49"
ADDED = "async_llm.py:382"
FINISHED = "async_llm.py:382"
STATS = "loggers.py:257"
RESUMED = "scheduler.py:495"
PREEMPTED = "scheduler.py:1089"
STATS_INTERVAL_NS = 10_000_000_000


def clock(t_ns: int) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.gmtime(t_ns // 1_000_000_000))


class EngineLog:
    """One vLLM server's console (API server, engine core and workers share it)."""

    def __init__(self, path: Path, replica: int, api_pid: int, core_pid: int) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp")
        self.handle = open(self.tmp, "w")  # noqa: SIM115 - closed in close()
        self.replica = replica
        self.api = f"(APIServer pid={api_pid})"
        self.core = f"(EngineCore_{replica} pid={core_pid})"
        self.next_stats_ns = -1
        self.window_prompt = 0
        self.window_generation = 0

    def _line(self, prefix: str, level: str, t_ns: int, where: str, message: str) -> None:
        self.handle.write(f"{prefix} {level} {clock(t_ns)} [{where}] {message}\n")

    def arrived(self, request: Request) -> None:
        self._line(
            self.api,
            "INFO",
            request.arrival_ns,
            RECEIVED,
            f"Received request {request.request_id}: params: SamplingParams(n=1, "
            f"max_tokens={request.output_tokens}), lora_request: None.",
        )
        self._line(
            self.api,
            "INFO",
            request.arrival_ns,
            ADDED,
            f"Added request {request.request_id}-{request.index:08x}.",
        )

    def finished(self, request: Request) -> None:
        self._line(
            self.api,
            "INFO",
            request.finish_ns,
            FINISHED,
            f"Finished request {request.request_id}-{request.index:08x}.",
        )

    def step(
        self,
        plan: StepPlan,
        end_ns: int,
        kv_usage: float,
        waiting: int,
        running: int,
        total_preemptions: int,
    ) -> None:
        for request in plan.preempted:
            self._line(
                self.core,
                "WARNING",
                plan.start_ns,
                PREEMPTED,
                f"Sequence group {request.request_id}-{request.index:08x} is preempted by "
                "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
                "This can affect the end-to-end performance. Increase "
                "gpu_memory_utilization or tensor_parallel_size to provide more KV cache "
                f"memory. total_num_cumulative_preemption={total_preemptions}",
            )
        for request in plan.resumed:
            self._line(
                self.core,
                "INFO",
                plan.start_ns,
                RESUMED,
                f"Preempted request {request.request_id}-{request.index:08x} has been resumed!",
            )
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
    ) -> None:
        stamp = time.strftime("%m%d %H:%M:%S", time.gmtime(t_ns // 1_000_000_000))
        micros = (t_ns // 1000) % 1_000_000
        where = f"[rank{rank}]:[E{stamp}.{micros:06d}000 ProcessGroupNCCL.cpp:1709]"
        pg = f"[PG {group_name} ({group_desc}) Rank {group_rank}]"
        self.handle.write(
            f"{where} {pg} Timeout at NCCL work: {seq}, last enqueued NCCL work: {seq}, "
            f"last completed NCCL work: {seq - 1}.\n"
        )
        self.handle.write(
            f"{where} {pg} Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
            f"OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, Timeout(ms)={timeout_ms}) ran "
            f"for {timeout_ms + 11} milliseconds before timing out.\n"
        )

    def close(self) -> None:
        self.handle.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.handle.close()
        self.tmp.unlink(missing_ok=True)


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
