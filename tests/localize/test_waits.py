"""Collectives that waited, on real one-rank files of larger jobs: a collective kernel made longer
by the planting suite's replay is found against the same collective in the other steps, and the
unmodified files, whose collectives vary by several times at some slots, give none."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import planted_analysis, real_trace
from teller.analysis import Analysis
from teller.localize.waits import collective_waits

QUEUE_LEN = "hta/queue_len_rank0_of16.json.gz"
SAMPLED = "hta/sampled_rank0_of128.json.gz"


@pytest.mark.parametrize(
    ("relative", "variant"),
    [
        (QUEUE_LEN, "kernel:nccl:0.05"),  # the step's longest collective, 25.6 ms at most elsewhere
        (QUEUE_LEN, "kernel:nccl:0.25"),  # the next step, pushed later, is the slowest
        (SAMPLED, "kernel:nccl:0.5"),  # two steps: one reference only
    ],
)
def test_a_collective_that_waited_is_named_in_its_step(
    tmp_path: Path, relative: str, variant: str
) -> None:
    analysis, truth = planted_analysis(relative, variant, tmp_path)
    found = [f for f in analysis.verdict.findings if f.step_name == truth.step_name]
    assert found, [f.step_name for f in analysis.verdict.findings]
    first = found[0]
    assert first.operator in truth.accept_operators, first.explanation
    assert "for the same collective in the run's other steps" in first.explanation
    assert "a peer rank the trace does not hold arrived late" in first.explanation
    assert "other ranks waited" not in first.explanation


@pytest.mark.parametrize(
    "relative",
    [
        QUEUE_LEN,
        SAMPLED,
        "hta/sampled_rank1_of128.json.gz",  # one send/recv 90.8 ms in one step, 8.4 ms in the other
        "hta/df_index_resolver_rank1_of2_216k_events.json.gz",
        "tracelens/more/mi300_resnet_act_checkpoint.json.gz",  # steps run different collectives
    ],
)
def test_unmodified_one_rank_files_have_no_collective_wait(relative: str) -> None:
    analysis = Analysis(real_trace(relative), method="localizer", progress=False)
    assert collective_waits(analysis.facts) == {}
