"""The grounding guarantee: an explanation's operator and rank are the pointed node's, or none."""

from __future__ import annotations

import re

from teller.rca.infer import NOT_FAULTS, TEMPLATES, NodeFacts, explain
from teller.rca.model import FAULT_NAMES


def test_every_fault_the_head_can_choose_has_a_template():
    assert set(TEMPLATES) == set(FAULT_NAMES) - set(NOT_FAULTS)


def test_templates_fill_operator_and_rank_from_the_pointed_node_only():
    facts = NodeFacts("my_kernel_xyz", 3, observed_ns=2_000_000, normal_ns=1_000_000)
    for fault, template in TEMPLATES.items():
        text = explain(fault, facts, step=7)
        assert set(re.findall(r"(?:rank|GPU) (\d+)", text)) <= {"3"}, fault
        assert ("my_kernel_xyz" in text) == ("{operator}" in template), fault
        assert ("3" in text) == ("{rank}" in template), fault
        assert "{" not in text, fault  # every slot filled, and only from the facts


def test_without_a_pointed_node_nothing_is_named():
    text = explain("straggler", None, step=12)
    assert "12" in text and "rank" not in text.lower()
