"""scheduler_misconfig: a tiny max batch size and token budget on the engine core (rank 0).

Inside the window the scheduler admits at most `max_num_seqs` requests per step and
`max_num_batched_tokens` tokens, as a service started with a mis-set `--max-num-seqs` /
`--max-num-batched-tokens` does: batches shrink, requests queue, TTFT rises.
"""

from __future__ import annotations

#: Limits at intensity 1; lower intensities leave more room.
TINY_MAX_NUM_SEQS = 1
TINY_MAX_BATCHED_TOKENS = 64


def limits(intensity: float, max_num_seqs: int, max_tokens: int) -> tuple[int, int]:
    """The (max_num_seqs, max_num_batched_tokens) the misconfigured engine runs with."""
    share = 1.0 - min(max(intensity, 0.0), 1.0)
    seqs = max(TINY_MAX_NUM_SEQS, round(TINY_MAX_NUM_SEQS + share * (max_num_seqs - 1) / 4))
    tokens = max(TINY_MAX_BATCHED_TOKENS, round(TINY_MAX_BATCHED_TOKENS + share * max_tokens / 4))
    return seqs, tokens
