"""How many cached tokens each step's decode attention read, estimated from the batches alone.

A decode step's attention reads every running sequence's whole KV cache, so its time grows with
the sequences' lengths, not only with how many there are: after a burst of long prompts, or as
long answers grow, decode steps of the same batch size take several times longer, on every rank,
and no fault is involved. The engines' step annotations (vLLM's
``execute_context_N(X)_generation_M(Y)``, the lab's) state how many sequences and tokens a step
ran, not how long those sequences are; this module carries the total forward from step to step:

- a step's prefill adds its context tokens, and its decode adds one token (its generation tokens)
  per sequence;
- the next step decodes M sequences of what were running: the cache is taken to be shared evenly
  among them (a mean-field estimate), so sequences that finished take the mean length with them;
- a capture usually begins mid-run, with sequences already running whose lengths it never saw:
  they start at the run's mean prompt length.

Steps whose annotation states no batch get 0, as does every step of a run without such
annotations. docs/scoreboard.md ("Steps expected from their cached tokens") measures a step model
that reads it; the shipped one does not yet.
"""

from __future__ import annotations

import numpy as np


def cached_tokens(
    context_tokens: np.ndarray,
    context_requests: np.ndarray,
    generation_tokens: np.ndarray,
    generation_requests: np.ndarray,
) -> np.ndarray:
    """Per step of one engine, in iteration order: the estimated cached tokens its decoding
    sequences read (≥ 0; 0 where the step states no batch). Inputs are the steps' stated batch,
    negative where unstated."""
    count = len(context_tokens)
    out = np.zeros(count)
    stated = (context_requests >= 0) & (generation_requests >= 0)
    if not stated.any():
        return out
    prompts = context_requests[stated & (context_requests > 0)]
    prompt_tokens = context_tokens[stated & (context_requests > 0)]
    mean_prompt = float(prompt_tokens.sum() / prompts.sum()) if prompts.sum() > 0 else 0.0
    total: float | None = None  # cached tokens of the sequences step k decodes
    for k in range(count):
        if not stated[k]:
            total = None  # the chain breaks: it starts again from the mean prompt
            continue
        decoding = float(generation_requests[k])
        if total is None:
            total = decoding * mean_prompt
        out[k] = total
        if k + 1 == count or not stated[k + 1]:
            continue
        # after step k: its prefills joined with their prompts, its decodes grew by a token each
        running = decoding + float(context_requests[k])
        grown = total + max(float(context_tokens[k]), 0.0) + max(float(generation_tokens[k]), 0.0)
        following = float(generation_requests[k + 1])
        mean = grown / running if running > 0 else mean_prompt
        # finished sequences leave with the mean length; sequences beyond those known to be
        # running (a prefill the capture did not show) start as prompts
        total = min(following, running) * mean + max(following - running, 0.0) * mean_prompt
    return out
