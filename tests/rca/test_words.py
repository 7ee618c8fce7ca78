"""The explanation decoder's vocabulary: slots instead of names, plain words only."""

from __future__ import annotations

import json

import pytest

from teller.errors import TraceError
from teller.rca.words import (
    EVIDENCE,
    OP,
    RANK,
    WordVocab,
    fill,
    pieces,
    slotted,
    target_words,
)


def test_a_reference_names_its_operator_and_rank_only_through_slots():
    op = "aten::scaled_dot_product_attention"
    text = "Rank 1 ran without flash attention, so its scaled_dot_product_attention (aten::scaled_dot_product_attention) fell back; GPU 1 idled."
    words = slotted(text, op, 1)
    assert words.count(OP) == 2 and words.count(RANK) == 2
    assert "1" not in words and not any("scaled_dot" in w for w in words)


def test_a_reference_without_an_operator_gets_the_evidence_clause_when_a_node_was_pointed():
    text = "Forced garbage-collection storms on rank 0 held the Python interpreter."
    assert target_words(text, None, 0, has_node=False)[-1] == "."
    with_node = target_words(text, None, 0, has_node=True)
    assert with_node[-len(pieces(EVIDENCE)) :] == pieces(EVIDENCE)
    sim = "Rank 2 reaches every collective late; its peers wait inside ncclKernel_AllReduce."
    assert OP in target_words(sim, "ncclKernel_AllReduce", 2, has_node=True)
    assert "shows" not in target_words(sim, "ncclKernel_AllReduce", 2, has_node=True)


def test_the_vocabulary_holds_no_identifier_or_number():
    vocab = WordVocab.build(
        [slotted("Rank 0's o_proj all-reduce took 20 ms in aten::mm on sm90 kernels.", None, 0)]
    )
    assert "all-reduce" in vocab.words and "kernels" in vocab.words
    for banned in ("o_proj", "20", "aten::mm", "sm90", "0"):
        assert banned not in vocab.words
    ids = vocab.encode(["all-reduce", "o_proj", "."])
    assert vocab.decode(ids) == ["all-reduce", "."]  # <unk> is never said


def test_fill_joins_words_and_punctuation_as_written():
    words = pieces("Rank <rank> 's host stalls ( around <op> ) : <observed> vs <normal> .")
    text = fill(words, {OP: "aten::mm", RANK: "3", "<observed>": "2 ms", "<normal>": "1 ms"})
    assert text == "Rank 3's host stalls (around aten::mm): 2 ms vs 1 ms."


def test_a_broken_vocabulary_file_is_a_clear_error(tmp_path):
    path = tmp_path / "words.json"
    with pytest.raises(TraceError, match="missing"):
        WordVocab.load(path)
    path.write_text(json.dumps({"format": "teller.words/1", "words": ["a", "b"]}))
    with pytest.raises(TraceError, match="specials and slots"):
        WordVocab.load(path)
    vocab = WordVocab.build([["a", "b", "a"]])
    vocab.save(path)
    assert WordVocab.load(path).words == vocab.words
