"""The grounding guarantee: whatever the decoder writes, an explanation's operator and rank are
the pointed node's, or none."""

from __future__ import annotations

import re

import numpy as np

from teller.callchain.render import format_ns
from teller.rca.infer import DEFAULT_MODEL, NodeFacts, explain
from teller.rca.words import SLOTS, WordVocab


def test_any_word_sequence_names_only_the_pointed_node():
    """Random sentences over the shipped vocabulary: the slots are the only way a name gets in."""
    words = WordVocab.load(DEFAULT_MODEL / "words.json")
    facts = NodeFacts("my_kernel_xyz", 3, observed_ns=2_000_000, normal_ns=1_000_000)
    rng = np.random.default_rng(0)
    for _ in range(500):
        ids = rng.integers(0, len(words), size=int(rng.integers(1, 40))).tolist()
        text = explain(words, ids, facts, step=7)
        assert set(re.findall(r"(?:rank|GPU) (\d+)", text, flags=re.I)) == {"3"}
        assert "my_kernel_xyz" in text  # the pointed node and its rank are always named
        assert not any(slot in text for slot in SLOTS)
        digits = text
        for shown in ("my_kernel_xyz", format_ns(2_000_000), format_ns(1_000_000), "3"):
            digits = digits.replace(shown, "")
        assert not re.search(r"\d", digits)  # no number but the facts'


def test_without_a_pointed_node_nothing_is_named():
    words = WordVocab.load(DEFAULT_MODEL / "words.json")
    text = explain(words, [words.index["<rank>"], words.index["<op>"]], None, step=12)
    assert "12" in text and "rank" not in text.lower()
