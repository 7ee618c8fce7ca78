"""The engine's Prometheus metrics under vLLM V1's names, labels and histogram buckets.

A monitoring stack (or `teller watch`) that reads vLLM's `/metrics` reads the lab's the same way:
`vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`,
`vllm:e2e_request_latency_seconds` histograms, `vllm:num_requests_running`/`_waiting` and
`vllm:kv_cache_usage_perc` gauges, token counters; every series labelled `model_name` and
`engine`. Times are measured by the engine core from each request's arrival to the end of the step
that produced each token, as vLLM's engine measures them.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from teller.lab.serve.scheduler import StepPlan

#: vLLM V1's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0)
TTFT_BUCKETS_S += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75)
TOKEN_LATENCY_BUCKETS_S += (1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0)
REQUEST_LATENCY_BUCKETS_S += (40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_LABELS = ("model_name", "engine")


@dataclass
class _RequestTiming:
    arrival_ns: int
    first_token_ns: int = 0
    last_token_ns: int = 0
    tokens: int = 0


class EngineMetrics:
    """What the engine core observes each step, as vLLM's Prometheus stat logger records it."""

    def __init__(self, model_name: str, engine: str = "0") -> None:
        self.registry = CollectorRegistry()
        self._requests: dict[str, _RequestTiming] = {}
        values = (model_name, engine)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, _LABELS, registry=self.registry).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, _LABELS, registry=self.registry).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            family = Histogram(name, doc, _LABELS, registry=self.registry, buckets=buckets)
            return family.labels(*values)

        self.running = gauge("vllm:num_requests_running", "Number of requests in execution.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting.")
        self.kv_cache_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.request_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*_LABELS, "finished_reason"],
            registry=self.registry,
        ).labels(*values, "length")
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS_S,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            TOKEN_LATENCY_BUCKETS_S,
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TOKEN_LATENCY_BUCKETS_S,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS_S,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS_S,
        )

    def request_added(self, request_id: str, arrival_ns: int) -> None:
        self._requests[request_id] = _RequestTiming(arrival_ns)

    def step_done(self, plan: StepPlan, start_ns: int, end_ns: int, finished: list[str]) -> None:
        """Every request the step ran produced one token at `end_ns`."""
        for request_id in plan.prefill_ids:
            timing = self._requests[request_id]
            self.queue_time.observe((start_ns - timing.arrival_ns) / 1e9)
            self.ttft.observe((end_ns - timing.arrival_ns) / 1e9)
            timing.first_token_ns = timing.last_token_ns = end_ns
            timing.tokens = 1
        for request_id in plan.decode_ids:
            timing = self._requests[request_id]
            self.itl.observe((end_ns - timing.last_token_ns) / 1e9)
            timing.last_token_ns = end_ns
            timing.tokens += 1
        for request_id in finished:
            timing = self._requests.pop(request_id)
            self.e2e.observe((end_ns - timing.arrival_ns) / 1e9)
            if timing.tokens > 1:
                per_token_s = (end_ns - timing.first_token_ns) / 1e9 / (timing.tokens - 1)
                self.tpot.observe(per_token_s)
            self.request_success.inc()
        generated = len(plan.prefill_ids) + len(plan.decode_ids)
        self.prompt_tokens.inc(plan.context_tokens)
        self.generation_tokens.inc(generated)
        self.iteration_tokens.observe(plan.context_tokens + len(plan.decode_ids))

    def scheduler_state(self, running: int, waiting: int, kv_cache_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_cache_usage.set(kv_cache_usage)

    def exposition(self) -> bytes:
        """The Prometheus text format, as `GET /metrics` serves it."""
        return generate_latest(self.registry)
