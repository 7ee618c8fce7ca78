"""The verdict builds on the breakdown: a flagged step's explanation says how long the named rank's
GPU sat idle in it and what the host was doing meanwhile (the plans of family "time"), with the
breakdown's own numbers, and says nothing of it where the GPU was busy nearly throughout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import teller.callchain.breakdown
from conftest import planted_analysis, real_trace
from teller.analysis import Analysis
from teller.callchain.breakdown import (
    GpuBusy,
    IdleContributor,
    IdleTime,
    StepBreakdown,
    share,
)
from teller.eval.metrics import agreement
from teller.localize import OperatorCandidate
from teller.rca.context import StepContext
from teller.rca.explain import IDLE_STATED, choose_mechanism, compose
from teller.rca.inputs import FAULT_NAMES
from teller.rca.plans import MECHANISMS, Said, parse

from .conftest import small_case
from .test_explain import _model_loads
from .test_plans import _random_context

#: GPU idle over half of every step, most of it inside aten::to's blocking copies.
QUEUE_LEN = "hta/queue_len_rank0_of16.json.gz"
#: A GPU-bound training loop: the host runs far ahead, and no step's GPU is idle 7% of its span.
V100 = "hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz"


def _time_sentences(explanation: str) -> list[Said]:
    said = parse(explanation)
    assert said is not None, explanation
    return [s for s in said if s.plan.startswith("time.")]


def test_a_planted_host_gap_states_the_idle_time_of_its_step_and_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    computed: list[int] = []
    real = teller.callchain.breakdown.run_breakdown

    def counted(tree):
        computed.append(1)
        return real(tree)

    monkeypatch.setattr(teller.callchain.breakdown, "run_breakdown", counted)
    analysis, truth = planted_analysis(QUEUE_LEN, "host_gap:host_gap:0.25", tmp_path)
    found = [f for f in analysis.verdict.findings if f.step_name == truth.step_name]
    assert found, [f.step_name for f in analysis.verdict.findings]
    finding = found[0]
    assert finding.rank == 0
    step = analysis.breakdown().step(finding.rank, finding.step)
    assert len(computed) == 1  # the verdict's explanations and the report share one breakdown
    assert step is not None and step.idle_ns >= IDLE_STATED * step.span_ns
    [time] = _time_sentences(finding.explanation)
    top = step.idle_contributors[0]
    assert time.plan == "time.idle_sync" and top.cause == "sync"
    assert time.slots == {
        "rank": str(finding.rank),
        "step": str(finding.step),
        "idle_share": share(step.idle_ns, step.span_ns),
        "cause_share": share(top.idle_ns, step.idle_ns),
        "host_call": top.host_call,
        "host_op": top.cpu_operator,
    }
    idle = time.slots["idle_share"]
    assert f"In step {finding.step}, rank 0's GPU was idle for {idle} of the time;" in (
        finding.explanation
    )
    assert agreement(finding.explanation, finding.fault_type, finding.operator, finding.rank).agrees


def test_steps_whose_gpu_was_busy_throughout_say_nothing_of_idle_time(tmp_path: Path) -> None:
    analysis, _ = planted_analysis(V100, "host_gap:host_gap:0.25", tmp_path)
    findings = analysis.verdict.findings
    assert findings
    breakdown = analysis.breakdown()
    for finding in findings:
        step = breakdown.step(finding.rank, finding.step)
        assert step is not None and step.idle_ns < IDLE_STATED * step.span_ns
        assert _time_sentences(finding.explanation) == [], finding.explanation


@pytest.mark.parametrize("method", ["localizer", "model"])
def test_both_methods_state_the_named_ranks_idle_time(method: str) -> None:
    if method == "model" and not _model_loads():
        pytest.skip("no loadable default model")
    run = Analysis(small_case("straggler", rank=1, seed=11, gpus=4), method=method)
    verdict, breakdown = run.diagnose(), run.breakdown()
    assert verdict.findings
    for finding in verdict.findings:
        step = breakdown.step(finding.rank, finding.step)
        time = _time_sentences(finding.explanation)
        if step is None or step.idle_ns < IDLE_STATED * step.span_ns:
            assert time == [], finding.explanation
            continue
        assert [(s.slots["rank"], s.slots["step"]) for s in time] == [
            (str(finding.rank), str(finding.step))
        ]


# -- the sentence itself, on made-up breakdowns ---------------------------------------------------


def _breakdown(
    idle_ns: int, contributors: list[IdleContributor], span_ns: int = 1_000_000
) -> StepBreakdown:
    return StepBreakdown(
        rank=1,
        step=7,
        start_ns=0,
        span_ns=span_ns,
        busy=GpuBusy(span_ns - idle_ns, span_ns - idle_ns, 0, 0, 0),
        idle=IdleTime(idle_ns, 0, 0, 0, 0),
        idle_contributors=contributors,
        longest_gaps=[],
        top_kernels=[],
        top_operators=[],
    )


def _context(breakdown: StepBreakdown | None) -> StepContext:
    candidate = OperatorCandidate(
        iteration=7,
        rank=1,
        operator="aten::mm",
        score=1.0,
        observed_ns=900_000,
        normal_ns=100_000,
        z=5.0,
        node=1,
        reference="nearest-composition normal steps, same rank",
        kind="compute",
    )
    return StepContext(
        iteration=7,
        kind="decode",
        step_dur_ns=1_000_000,
        expected_ns=200_000,
        rank=1,
        rank_dur_ns=1_000_000,
        ranks=2,
        candidate=candidate,
        breakdown=breakdown,
    )


@pytest.mark.parametrize(
    ("cause", "call", "operator", "plan", "ending"),
    [
        ("sync", "cudaStreamSynchronize", "aten::item", "time.idle_sync", ""),
        ("sync", "cudaDeviceSynchronize", None, "time.idle_sync_call", ""),
        ("sync", None, None, "time.idle_sync_unnamed", "fell inside blocking calls."),
        ("launch", "cudaLaunchKernel", "aten::mm", "time.idle_launch", ""),
        ("launch", "cudaLaunchKernel", None, "time.idle_launch_call", ""),
        ("launch", None, None, "time.idle_launch_unnamed", "the host's launch calls."),
        ("scheduler", None, None, "time.idle_scheduler", "the engine's scheduler."),
        ("host", None, None, "time.idle_host", "Python or CPU operators between launches."),
        ("unrecorded", None, None, "time.idle_unrecorded", "records nothing on the host."),
    ],
)
def test_the_largest_idle_contributor_is_named_without_the_names_the_trace_lacks(
    cause: str, call: str | None, operator: str | None, plan: str, ending: str
) -> None:
    contributors = [
        IdleContributor(cause, call, operator, idle_ns=284_000, gaps=12),
        IdleContributor("host", None, None, idle_ns=96_000, gaps=40),
    ]
    explanation = compose(_context(_breakdown(380_000, contributors)), None)
    text = next(s.text for s in explanation.sentences if s.plan.startswith("time."))
    assert text.startswith("In step 7, rank 1's GPU was idle for 38% of the time; 75% of that ")
    assert "None" not in text and text.endswith(ending)
    expected_names = f"({call} in {operator})." if operator else f"({call})."
    if call is not None:
        assert text.endswith(expected_names)
    [time] = _time_sentences(explanation.text)
    assert time.plan == plan


def test_idle_time_is_stated_from_a_tenth_of_the_step_and_only_for_a_named_rank() -> None:
    span = 1_000_000
    below = compose(_context(_breakdown(int(IDLE_STATED * span) - 1, [])), None)
    at = compose(_context(_breakdown(int(IDLE_STATED * span), [])), None)
    assert "time.idle" not in below.plans
    assert (
        "time.idle" in at.plans
        and "In step 7, rank 1's GPU was idle for 10% of the time." in at.text
    )
    assert not any(p.startswith("time.") for p in compose(_context(None), None).plans)
    unnamed = _context(_breakdown(500_000, []))
    unnamed.candidate, unnamed.rank = None, None
    assert not any(p.startswith("time.") for p in compose(unnamed, None).plans)


def test_random_heads_over_random_breakdowns_keep_the_pointers_rank() -> None:
    rng = np.random.default_rng(1)
    causes = ["sync", "launch", "scheduler", "host", "unrecorded"]
    stated = 0
    for _ in range(500):
        context = _random_context(rng)
        span = int(rng.integers(1, 10**9))
        idle = int(span * rng.uniform(0, 1))
        contributors = [
            IdleContributor(
                str(rng.choice(causes)),
                str(rng.choice(["cudaStreamSynchronize", "cudaLaunchKernel"]))
                if rng.random() < 0.7
                else None,
                str(rng.choice(["aten::item", "nn.Module: Qwen2ForCausalLM_0", "aten::to"]))
                if rng.random() < 0.7
                else None,
                idle_ns=max(int(idle * rng.uniform(0, 1)), 1),
                gaps=1,
            )
            for _ in range(int(rng.integers(0, 3)))
        ]
        context.breakdown = _breakdown(idle, contributors, span) if rng.random() < 0.8 else None
        fault = str(rng.choice(FAULT_NAMES))
        mechanism = choose_mechanism(context, fault, rng.normal(size=len(MECHANISMS)).tolist())
        text = compose(context, fault, mechanism).text
        for time in _time_sentences(text):
            stated += 1
            assert context.candidate is not None
            assert time.slots["rank"] == str(context.candidate.rank), text
            assert time.slots["step"] == str(context.iteration), text
            assert "None" not in text
    assert stated > 100


def test_a_verdict_on_the_first_captured_step_says_set_up_may_explain_it() -> None:
    """HTA's annotated training loop: its first step is slow in the allocator (aten::empty_strided
    2.21 ms against 27.5 µs later), one-time set-up that a profiler schedule without warm-up
    steps captures; the verdict says so. A later flagged step (the planted one) does not."""
    analysis = Analysis(real_trace("hta/gpu_user_annotation_steps.json.gz"))
    first = [f for f in analysis.verdict.findings if f.step == 0]
    assert first, [f.step for f in analysis.verdict.findings]
    said = parse(first[0].explanation)
    assert said is not None
    assert [s.slots for s in said if s.plan == "caveat.first_step"] == [{"step": "0"}]


def test_a_one_step_captures_first_layer_outlier_says_set_up_may_explain_it() -> None:
    """HTA's CUPTI-counter capture holds one step of a convolutional net: its first
    cudnn_convolution took 451 ms against 474 µs in the later layers, cuDNN choosing its
    algorithms on the first call. There is no earlier step to compare, so the verdict says
    what a first call pays for."""
    analysis = Analysis(real_trace("hta/cupti_profiler_counters.json.gz"))
    findings = analysis.verdict.findings
    assert findings and "in layer 1 of" in findings[0].explanation
    said = parse(findings[0].explanation)
    assert said is not None
    assert [s.plan for s in said if s.plan.startswith("caveat.first")] == ["caveat.first_call"]


def test_a_planted_fault_in_a_later_step_gets_no_first_step_caveat(tmp_path: Path) -> None:
    analysis, truth = planted_analysis(QUEUE_LEN, "host_gap:host_gap:0.25", tmp_path)
    found = [f for f in analysis.verdict.findings if f.step_name == truth.step_name]
    assert found and found[0].step != 0
    said = parse(found[0].explanation)
    assert said is not None and all(s.plan != "caveat.first_step" for s in said)
