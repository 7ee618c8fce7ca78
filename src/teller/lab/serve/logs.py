"""vLLM-V1-shaped log lines, so the lab's logs exercise the same parser users' logs do.

Rank 0 logs as `(EngineCore_0 pid=N)`, every rank as `(Worker_TP{r} pid=N)`, each line
`LEVEL MM-DD HH:MM:SS [file.py:line] message` with this code's real file and line.
"""

from __future__ import annotations

import logging
import os
import sys


def process_logger(prefix: str) -> logging.Logger:
    """A logger writing `(prefix pid=N) INFO MM-DD HH:MM:SS [file.py:line] msg` to stdout."""
    logger = logging.getLogger(f"teller.lab.serve.{prefix}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(
            logging.Formatter(
                f"({prefix} pid={os.getpid()}) %(levelname)s %(asctime)s "
                "[%(filename)s:%(lineno)d] %(message)s",
                datefmt="%m-%d %H:%M:%S",
            )
        )
        logger.addHandler(handler)
    return logger


def stats_line(
    prompt_tokens_per_s: float,
    generation_tokens_per_s: float,
    running: int,
    waiting: int,
    kv_usage: float,
) -> str:
    return (
        f"Engine 000: Avg prompt throughput: {prompt_tokens_per_s:.1f} tokens/s, "
        f"Avg generation throughput: {generation_tokens_per_s:.1f} tokens/s, "
        f"Running: {running} reqs, Waiting: {waiting} reqs, "
        f"GPU KV cache usage: {100 * kv_usage:.1f}%, Prefix cache hit rate: 0.0%"
    )


def iteration_line(
    step: int,
    context_requests: int,
    context_tokens: int,
    generation_requests: int,
    generation_tokens: int,
    elapsed_ms: float,
    kv_usage: float,
) -> str:
    return (
        f"Engine 000: Iteration({step}): {context_requests} context requests, "
        f"{context_tokens} context tokens, {generation_requests} generation requests, "
        f"{generation_tokens} generation tokens, iteration elapsed time: {elapsed_ms:.2f} ms, "
        f"GPU KV cache usage: {100 * kv_usage:.1f}%"
    )
