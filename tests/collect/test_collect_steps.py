"""The agent counts the same step annotations the call-chain builder later finds (no drift)."""

from __future__ import annotations

import re

import pytest

from teller.callchain.steps import parse_step_name
from teller.collect.inject._teller_collect_agent import STEP_NAME, StepWindow

NAMES = [
    "ProfilerStep#0",
    "ProfilerStep#12",
    "execute_context_1(17)_generation_3(3)",
    "execute_128_context_0(0)_generation_8(8)",
    "execute_context_2(sq1024sk1024)_generation_0()",
    "step[DECODE bs=8 toks=8]",
    "step[EXTEND bs=2 toks=900]",
    "aten::mm",
    "ProfilerStep",
    "execute_model",
    "forward",
    "nccl:all_reduce",
]


@pytest.mark.parametrize("name", NAMES)
def test_agent_and_tree_agree_on_what_is_a_step(name: str):
    window = StepWindow(0, 0, STEP_NAME)
    assert window.is_step(name) == (parse_step_name(name) is not None)


def test_custom_regex_replaces_the_built_in_shapes():
    window = StepWindow(0, 0, re.compile(r"^engine_iter"))
    assert window.is_step("engine_iter 7")
    assert not window.is_step("ProfilerStep#0")
