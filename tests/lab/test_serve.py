"""The lab's serving engine: batching is exact, scheduling obeys its limits, names parse."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from teller.callchain.steps import parse_step_name
from teller.lab.serve.config import ModelConfig, WorkloadConfig
from teller.lab.serve.executor import Executor
from teller.lab.serve.logs import iteration_line, process_logger, stats_line
from teller.lab.serve.model import build_model
from teller.lab.serve.scheduler import Scheduler, StepPlan
from teller.lab.serve.workload import Request, generate_requests


@pytest.fixture(scope="module")
def model():
    return build_model(ModelConfig(num_hidden_layers=2), tp=1)


def test_continuous_batching_gives_the_tokens_of_one_request_generation(model):
    """Mixed and batched decode steps with left padding match HF's own greedy generate."""
    prompt_a, prompt_b = list(range(5, 40)), list(range(100, 112))
    executor = Executor(model)
    executor.execute(StepPlan(0, prefill_ids=["a"], prefill_prompts=[prompt_a]))
    tokens_a = [executor.last_token["a"]]
    executor.execute(StepPlan(1, prefill_ids=["b"], prefill_prompts=[prompt_b], decode_ids=["a"]))
    tokens_a.append(executor.last_token["a"])
    tokens_b = [executor.last_token["b"]]
    for step in range(4):
        executor.execute(StepPlan(2 + step, decode_ids=["a", "b"]))
        tokens_a.append(executor.last_token["a"])
        tokens_b.append(executor.last_token["b"])
    with torch.no_grad():
        expected_a = model.generate(torch.tensor([prompt_a]), max_new_tokens=6, do_sample=False)
        expected_b = model.generate(torch.tensor([prompt_b]), max_new_tokens=5, do_sample=False)
    assert tokens_a == expected_a[0, len(prompt_a) :].tolist()
    assert tokens_b == expected_b[0, len(prompt_b) :].tolist()
    executor.execute(StepPlan(6, free_ids=["a", "b"]))
    assert executor.caches == {}


def _request(k: int, prompt_tokens: int, output_tokens: int = 3) -> Request:
    return Request(f"cmpl-{k:032x}-0", 0.0, [1] * prompt_tokens, output_tokens)


def test_scheduler_respects_batch_size_and_token_budget():
    scheduler = Scheduler(max_num_seqs=3, max_num_batched_tokens=100)
    requests = {r.request_id: r for r in (_request(k, 40) for k in range(5))}
    for request in requests.values():
        scheduler.add(request)
    first = scheduler.schedule()
    assert len(first.prefill_ids) == 2  # a third 40-token prompt would pass the 100-token budget
    scheduler.complete(first, requests)
    second = scheduler.schedule()
    assert second.decode_ids == first.prefill_ids
    assert len(second.prefill_ids) == 1  # the batch is full at 3
    assert second.annotation == "execute_context_1(40)_generation_2(2)"


def test_scheduler_finishes_requests_after_their_output_tokens_and_frees_caches():
    scheduler = Scheduler(max_num_seqs=4, max_num_batched_tokens=512)
    request = _request(1, 10, output_tokens=2)
    scheduler.add(request)
    plan = scheduler.schedule()
    assert scheduler.complete(plan, {request.request_id: request}) == []
    plan = scheduler.schedule()
    assert scheduler.complete(plan, {request.request_id: request}) == [request.request_id]
    assert scheduler.schedule().free_ids == [request.request_id]
    assert not scheduler.has_work


def test_a_prompt_over_the_budget_still_runs_alone():
    scheduler = Scheduler(max_num_seqs=4, max_num_batched_tokens=64)
    scheduler.add(_request(1, 300))
    scheduler.add(_request(2, 10))
    plan = scheduler.schedule()
    assert plan.context_tokens == 300 and len(plan.prefill_ids) == 1


def test_step_annotation_parses_as_a_vllm_step_with_its_batch():
    plan = StepPlan(0, ["a", "b"], [[1] * 30, [1] * 12], ["c", "d", "e"])
    facts = parse_step_name(plan.annotation)
    assert facts is not None
    assert (facts.kind, facts.context_requests, facts.context_tokens) == ("mixed", 2, 42)
    assert (facts.generation_requests, facts.generation_tokens) == (3, 3)


def test_workload_is_poisson_seeded_and_has_vllm_request_ids():
    config = WorkloadConfig(rate_per_s=20.0, duration_s=30.0, seed=7)
    requests = generate_requests(config, vocab_size=4096)
    assert requests == generate_requests(config, vocab_size=4096)
    assert requests != generate_requests(WorkloadConfig(rate_per_s=20.0, seed=8), 4096)
    assert all(re.fullmatch(r"cmpl-[0-9a-f]{32}-0", r.request_id) for r in requests)
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(requests)]
    mean_gap = sum(gaps) / len(gaps)
    assert 0.04 < mean_gap < 0.06  # 1 / rate
    lengths = [len(r.prompt_ids) for r in requests]
    assert min(lengths) >= config.prompt_tokens_min and max(lengths) <= config.prompt_tokens_max


def test_burst_adds_long_prompts_only_inside_its_window():
    config = WorkloadConfig(
        rate_per_s=2.0,
        duration_s=10.0,
        burst_start_s=4.0,
        burst_end_s=6.0,
        burst_rate_per_s=10.0,
        burst_prompt_tokens=512,
    )
    long_ones = [r for r in generate_requests(config, 4096) if len(r.prompt_ids) == 512]
    assert len(long_ones) >= 5
    assert all(4.0 <= r.arrival_s < 6.0 for r in long_ones)


def test_log_lines_have_vllm_v1_shapes(capsys):
    process_logger("EngineCore_0").info(stats_line(12.5, 3.25, 4, 1, 0.02))
    process_logger("EngineCore_0").info(iteration_line(42, 3, 6144, 0, 0, 187.32, 0.412))
    lines = capsys.readouterr().out.splitlines()
    prefix = r"\(EngineCore_0 pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d \[test_serve\.py:\d+\] "
    assert re.fullmatch(
        prefix + r"Engine 000: Avg prompt throughput: 12\.5 tokens/s, Avg generation throughput: "
        r"3\.2 tokens/s, Running: 4 reqs, Waiting: 1 reqs, GPU KV cache usage: 2\.0%, "
        r"Prefix cache hit rate: 0\.0%",
        lines[0],
    )
    assert lines[1].endswith(
        "Engine 000: Iteration(42): 3 context requests, 6144 context tokens, 0 generation "
        "requests, 0 generation tokens, iteration elapsed time: 187.32 ms, GPU KV cache usage: 41.2%"
    )


TP_SHAPES_PROGRAM = """
import sys
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from teller.lab.dataset import TP_SIZES
from teller.lab.serve.config import ModelConfig
from teller.lab.serve.model import build_model

config = ModelConfig()
for tp in TP_SIZES:
    for rank in range(tp):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=tp)
        with torch.no_grad():
            logits = build_model(config, tp)(torch.arange(8).unsqueeze(0)).logits
        assert logits.shape == (1, 8, config.vocab_size), (tp, rank, logits.shape)
        dist.destroy_process_group()
    print("tp", tp, "ok", flush=True)
"""


@pytest.mark.slow
def test_every_tp_size_the_dataset_draws_shards_the_model_into_whole_heads():
    """Each rank of every TP size `teller lab dataset` mixes runs the sharded forward: a fake
    process group (collectives are no-ops) checks the shapes without starting N processes."""
    import subprocess
    import sys

    from teller.lab.dataset import TP_SIZES

    config = ModelConfig()
    for tp in TP_SIZES:
        assert config.num_attention_heads % tp == 0 and config.num_key_value_heads % tp == 0
    done = subprocess.run(
        [sys.executable, "-c", TP_SHAPES_PROGRAM], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:-1] == [f"tp {tp} ok" for tp in TP_SIZES]


def test_a_step_under_lowered_limits_says_whether_they_kept_work_out():
    """`held_back`: the limits a step ran under admitted or decoded less than the configured
    ones would have from the same queue (a capped scheduler acting); the same limits with
    nothing waiting, or the configured ones, hold nothing back."""
    scheduler = Scheduler(max_num_seqs=4, max_num_batched_tokens=512)
    requests = {r.request_id: r for r in (_request(k, 40, output_tokens=5) for k in range(3))}
    for request in requests.values():
        scheduler.add(request)
    capped = scheduler.schedule(max_num_seqs=1, max_tokens=64)
    assert capped.held_back and len(capped.prefill_ids) == 1
    scheduler.complete(capped, requests)
    full = scheduler.schedule()
    assert not full.held_back and len(full.prefill_ids) == 2 and len(full.decode_ids) == 1
    scheduler.complete(full, requests)
    cut = scheduler.schedule(max_num_seqs=1, max_tokens=64)  # decodes one of three running
    assert cut.held_back and len(cut.decode_ids) == 1
    alone = Scheduler(max_num_seqs=4, max_num_batched_tokens=512)
    request = _request(9, 40)
    alone.add(request)
    plan = alone.schedule(max_num_seqs=1, max_tokens=64)
    assert not plan.held_back  # one request: the lowered limits ran all there was
    alone.complete(plan, {request.request_id: request})
    assert not alone.schedule(max_num_seqs=1, max_tokens=64).held_back
