"""What an objective can name, and the engine metrics each name is read from.

One signal per thing an operator promises (time to first token, inter-token latency, …), each
listed under every name the engines serve it as: vLLM's current name first, then older vLLM
releases', then SGLang's. The first name the engine serves is used, so one `--slo` works across
engines and releases.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Signal:
    key: str  # what an objective calls it: "itl" in `itl_p99<50ms`
    kind: str  # "histogram" (quantiles, mean) or "gauge" (its current value)
    names: tuple[str, ...]  # Prometheus metric family names, in order of preference
    seconds: bool  # histogram of durations (objectives take ms/s) or a plain number
    # how a gauge served once per engine or model becomes one number
    combine: str = "sum"
    description: str = ""


SIGNALS: dict[str, Signal] = {
    signal.key: signal
    for signal in (
        Signal(
            "ttft",
            "histogram",
            ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
            True,
            description="time to first token",
        ),
        Signal(
            "itl",
            "histogram",
            (
                "vllm:inter_token_latency_seconds",
                "vllm:time_per_output_token_seconds",  # the same per-token histogram, before 0.11
                "sglang:inter_token_latency_seconds",
            ),
            True,
            description="inter-token latency",
        ),
        Signal(
            "tpot",
            "histogram",
            (
                "vllm:request_time_per_output_token_seconds",
                "sglang:time_per_output_token_seconds",
            ),
            True,
            description="time per output token, per request",
        ),
        Signal(
            "e2e",
            "histogram",
            ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
            True,
            description="end-to-end request latency",
        ),
        Signal(
            "queue",
            "histogram",
            ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds"),
            True,
            description="time a request waited before it was scheduled",
        ),
        Signal(
            "waiting",
            "gauge",
            ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
            False,
            description="requests waiting",
        ),
        Signal(
            "running",
            "gauge",
            ("vllm:num_requests_running", "sglang:num_running_reqs"),
            False,
            description="requests running",
        ),
        Signal(
            "kv_cache",
            "gauge",
            ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
            False,
            combine="max",
            description="KV-cache usage (0..1)",
        ),
    )
}

#: The family that counts engine steps (one observation per step), where the engine has one.
STEP_COUNTER = "vllm:iteration_tokens_total"
