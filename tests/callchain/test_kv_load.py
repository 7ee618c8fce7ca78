"""A decode step's cached tokens, carried from step to step by the batches the steps state."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from teller.callchain.kv_load import cached_tokens
from teller.callchain.steps import parse_step_name

LAB_CASE = Path(__file__).parents[1] / "align" / "data" / "lab_none_tp2"


def _estimate(batches: list[tuple[int, int, int, int]]) -> list[float]:
    """(context requests, context tokens, generation requests, generation tokens) per step."""
    ctx_req, ctx, gen_req, gen = (np.array(c) for c in zip(*batches, strict=True))
    return cached_tokens(ctx, ctx_req, gen, gen_req).tolist()


def test_prompts_join_the_cache_and_decodes_grow_it_by_a_token() -> None:
    # one 100-token prompt, then it decodes; a 300-token prompt joins at step 2
    batches = [(1, 100, 0, 0), (0, 0, 1, 1), (1, 300, 1, 1), (0, 0, 2, 2), (0, 0, 2, 2)]
    assert _estimate(batches) == [0.0, 100.0, 101.0, 402.0, 404.0]


def test_a_finished_sequence_leaves_with_the_mean_length() -> None:
    # two sequences of 100 and 300 tokens; one finishes after step 0: half the cache goes with it
    batches = [(0, 0, 2, 2), (0, 0, 1, 1)]
    got = _estimate([(2, 400, 0, 0), *batches])
    assert got == [0.0, 400.0, 201.0]


def test_a_capture_that_begins_mid_run_starts_its_sequences_at_the_mean_prompt() -> None:
    # four sequences already decoding when the capture began; the prompts it saw average 50
    batches = [(0, 0, 4, 4), (2, 100, 4, 4), (0, 0, 6, 6)]
    assert _estimate(batches) == [200.0, 204.0, 308.0]


def test_steps_that_state_no_batch_break_the_chain() -> None:
    batches = [(1, 80, 0, 0), (0, 0, 1, 1), (-1, -1, -1, -1), (0, 0, 2, 2)]
    assert _estimate(batches) == [0.0, 80.0, 0.0, 160.0]
    none = [(-1, -1, -1, -1)] * 3
    assert _estimate(none) == [0.0, 0.0, 0.0]


def test_the_estimate_follows_a_recorded_runs_exact_cached_tokens() -> None:
    """The lab's ground truth lists every step's requests and their tokens: each decode's exact
    cached tokens are its sequences' prompts and decoded tokens so far."""
    rows = [
        json.loads(line)
        for line in (LAB_CASE / "ground_truth" / "steps.jsonl").read_text().splitlines()
    ]
    length: dict[str, int] = {}
    exact, batches = [], []
    for row in rows:
        requests = row["requests"]
        exact.append(
            sum(length.get(r["request_id"], 0) for r in requests if r["phase"] == "decode")
        )
        for r in requests:
            length[r["request_id"]] = length.get(r["request_id"], 0) + r["tokens"]
        step = parse_step_name(row["annotation"])
        assert step is not None
        batches.append(
            (
                step.context_requests,
                step.context_tokens,
                step.generation_requests,
                step.generation_tokens,
            )
        )
    estimate = np.array(_estimate(batches))
    truth = np.array(exact, dtype=float)
    assert len(truth) > 50 and truth.max() > 1000
    assert np.corrcoef(estimate, truth)[0, 1] > 0.98
    decoding = truth > 0
    error = np.abs(estimate[decoding] - truth[decoding]) / truth[decoding]
    assert np.median(error) < 0.1
