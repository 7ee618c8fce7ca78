"""How many requests the engine's logs say each step preempted, and where a line is too vague.

vLLM logs one line per preempted request, with its id; SGLang one line per retraction, with
`#retracted_reqs: N` and a time to the second. A line counts its requests on its step only where
it is placed surely enough (`PREEMPTION_PLACED`): a second holds many steps of a fast engine.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from ingest.test_logs_engines import SGLANG_RETRACT
from rca.conftest import small_case
from teller.align.align import PREEMPTION_PLACED, Alignment, AlignResult
from teller.analysis import Analysis
from teller.ingest.logs import read_logs

VLLM_PREEMPTED = (
    "INFO 09-13 16:06:07 scheduler.py:1560] Sequence group cmpl-1 is preempted by "
    "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space."
)


def _result(logs, step, confidence) -> AlignResult:
    count = len(step)
    alignment = Alignment(
        np.asarray(step),
        np.zeros(count, int),
        np.zeros(count, int),
        np.asarray(confidence),
        ["window"] * count,
    )
    return AlignResult(None, logs, None, alignment, None, None, [])


def test_a_line_counts_its_requests_where_it_is_placed_surely(tmp_path):
    (tmp_path / "sglang.log").write_text(SGLANG_RETRACT + "\n" + SGLANG_RETRACT + "\n")
    (tmp_path / "vllm.log").write_text(VLLM_PREEMPTED + "\n")
    logs = read_logs([tmp_path / "sglang.log", tmp_path / "vllm.log"], year=2026)
    assert list(logs.column("event")) == ["request_preempted"] * 3
    sure = _result(logs, [4, 4, 9], [1.0, PREEMPTION_PLACED, 1.0])
    assert sure.preempted == {4: 6, 9: 1}
    vague = _result(logs, [4, 5, -1], [0.2, 1.0, 0.0])
    assert vague.preempted == {5: 3}


def test_a_retraction_known_to_the_second_among_many_steps_names_none(tmp_path):
    """The simulator's fault-free run fits its 30 steps in well under a second: an SGLang
    retract line of the second its first step starts in overlaps several steps, is placed on
    one of them with a confidence under `PREEMPTION_PLACED`, and no step is said to have
    preempted."""
    case = small_case("none")
    steps = Analysis(case).tree.steps
    second = datetime.fromtimestamp(int(steps.start_ns.min()) // 1_000_000_000, UTC)
    line = SGLANG_RETRACT.replace("2026-09-13 16:06:07", second.strftime("%Y-%m-%d %H:%M:%S"))
    (tmp_path / "sglang.log").write_text(line + "\n")
    alignment = Analysis(case, logs=[tmp_path / "sglang.log"]).alignment
    placed = alignment.alignment
    assert placed.step[0] >= 0 and placed.confidence[0] < PREEMPTION_PLACED
    assert alignment.preempted == {}
