"""The seed inputs the fuzz suite mutates: slices of real traces, an engine log, an OTLP export.

Real traces come through the TELLER_TRACES setting (tests/conftest.py); the log and span seeds are
written here because no public engine log ships with the traces.
"""

from __future__ import annotations

import json

#: Real Kineto traces (relative to TELLER_TRACES) whose slices seed the Kineto variants: GPU and
#: CPU rows, legacy categories, ROCm, collectives, 64-bit ids, nanosecond timestamps.
KINETO_SEEDS: tuple[str, ...] = (
    "hta/cuda_event_sync.json.gz",
    "hta/legacy_inference_rank1_oldcats.json.gz",
    "hta/amd_mi250_rocm62.json.gz",
    "hta/large_integer_comms_id.pt.trace.json.gz",
    "hta/sampled_rank0_of128.json.gz",
    "hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz",
    "tracelens/hf_qwen1.5-0.5b_h100.json.gz",
    "tracelens/sglang_Qwen3-8B_prefilldecode.json.gz",
)
#: Real Nsight Systems exports whose copies get hostile column values.
NSYS_SEEDS: tuple[str, ...] = (
    "nsys_ai/healthy_1pct.sqlite",
    "nsys_ai/mock_tiny_real_export.sqlite",
)

VLLM_LOG = "\n".join(
    [
        "2025-02-13T11:33:33.120000Z (APIServer pid=90458) INFO 02-13 11:33:33 [api_server.py:1] "
        "vLLM API server version 0.8.1",
        "2025-02-13T11:33:33.130000Z (APIServer pid=90458) INFO 02-13 11:33:33 [async_llm.py:382] "
        "Added request chatcmpl-a269fdcb7c6ce890-a8a65d16.",
        "2025-02-13T11:33:39.000000Z (APIServer pid=90458) INFO 02-13 11:33:39 [loggers.py:257] "
        "Engine 000: Avg prompt throughput: 0.8 tokens/s, Avg generation throughput: 4.6 tokens/s,"
        " Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.3%, Prefix cache hit rate: 0.0%",
        "2025-02-13T11:33:40.000000Z (EngineCore_0 pid=90500) ERROR 02-13 11:33:40 [core.py:1] "
        "EngineCore failed",
        "2025-02-13T11:33:40.000100Z Traceback (most recent call last):",
        '2025-02-13T11:33:40.000200Z   File "core.py", line 1, in run',
        "2025-02-13T11:33:40.000300Z torch.OutOfMemoryError: CUDA out of memory.",
        "2025-02-13T11:33:41.000000Z [rank0]:[E213 11:33:41.000000 ProcessGroupNCCL.cpp:1] "
        "[PG 0 Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, "
        "OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600010 ms",
        '2025-02-13T11:33:42.000000Z INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK',
    ]
)


def _attr(key: str, value: object) -> dict:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    if isinstance(value, list):
        return {
            "key": key,
            "value": {"arrayValue": {"values": [{"stringValue": v} for v in value]}},
        }
    return {"key": key, "value": {"stringValue": value}}


def span_export() -> dict:
    """One vLLM `llm_request` span export (gen_ai conventions), as vLLM's OTLP exporter writes."""
    start = 1_739_446_413_120_000_000
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "a1",
        "name": "llm_request",
        "kind": 2,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + 2_000_000_000),
        "attributes": [
            _attr("gen_ai.response.model", "Qwen/Qwen2.5-0.5B-Instruct"),
            _attr("gen_ai.request.id", "chatcmpl-a269fdcb7c6ce890-a8a65d16"),
            _attr("gen_ai.usage.prompt_tokens", 12),
            _attr("gen_ai.usage.completion_tokens", 40),
            _attr("gen_ai.latency.time_to_first_token", 0.05),
            _attr("gen_ai.latency.e2e", 2.0),
            _attr("gen_ai.response.finish_reasons", ["stop"]),
        ],
    }
    resource = {"attributes": [_attr("service.name", "vllm")]}
    scope = {"scope": {"name": "vllm.llm_engine"}, "spans": [span, {**span, "spanId": "a2"}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [scope]}]}


SPAN_TEXT = json.dumps(span_export())
