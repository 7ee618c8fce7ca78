"""Requests for the lab: Poisson arrivals, uniform lengths, vLLM-style ids, all from one seed.

The whole arrival schedule is drawn up front, so a seed names the workload exactly and a case can
be recorded again with and without a fault on the same requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from teller.lab.serve.config import WorkloadConfig


@dataclass
class Request:
    request_id: str  # `cmpl-<32 hex>-0`, the shape vLLM V1 logs
    arrival_s: float  # seconds after serve start
    prompt_ids: list[int]
    max_new_tokens: int


def generate_requests(config: WorkloadConfig, vocab_size: int) -> list[Request]:
    """The run's requests in arrival order (the burst, if configured, merged in)."""
    rng = np.random.default_rng(config.seed)
    requests = _poisson(
        rng,
        config.rate_per_s,
        0.0,
        config.duration_s,
        (config.prompt_tokens_min, config.prompt_tokens_max),
        (config.output_tokens_min, config.output_tokens_max),
        vocab_size,
    )
    if config.burst_start_s is not None and config.burst_end_s is not None:
        requests += _poisson(
            rng,
            config.burst_rate_per_s,
            config.burst_start_s,
            config.burst_end_s,
            (config.burst_prompt_tokens, config.burst_prompt_tokens),
            (config.output_tokens_min, config.output_tokens_max),
            vocab_size,
        )
    return sorted(requests, key=lambda r: r.arrival_s)


def _poisson(
    rng: np.random.Generator,
    rate_per_s: float,
    start_s: float,
    end_s: float,
    prompt_range: tuple[int, int],
    output_range: tuple[int, int],
    vocab_size: int,
) -> list[Request]:
    requests: list[Request] = []
    if rate_per_s <= 0:
        return requests
    now_s = start_s
    while True:
        now_s += float(rng.exponential(1.0 / rate_per_s))
        if now_s >= end_s:
            return requests
        prompt_len = int(rng.integers(prompt_range[0], prompt_range[1] + 1))
        requests.append(
            Request(
                request_id=f"cmpl-{rng.bytes(16).hex()}-0",
                arrival_s=now_s,
                prompt_ids=rng.integers(0, vocab_size, prompt_len).tolist(),
                max_new_tokens=int(rng.integers(output_range[0], output_range[1] + 1)),
            )
        )
