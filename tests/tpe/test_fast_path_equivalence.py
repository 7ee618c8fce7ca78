"""The fast TPE gives the tokens and learns the merges of the reference (the code before it was
made fast, `reference_tpe.py`), on real traces and on small synthetic trees."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import real_trace
from teller.callchain.tree import build_tree
from teller.ingest import read_trace
from teller.slices import root_slices, step_slices
from teller.slices.slice import Slice
from teller.tpe import TPE, Tokens
from teller.tpe.tokenizer import UNK_NAMES
from tpe.reference_tpe import reference_encode, reference_train
from tpe.test_tokenizer import _repeat_slice, optimizer_step_slice, random_slices

TOKEN_COLUMNS = (
    "kind",
    "parent",
    "slot",
    "edge",
    "depth",
    "start_ns",
    "dur_ns",
    "offsets",
    "position",
    "name",
    "rank",
    "stream",
    "node_start_ns",
    "node_dur_ns",
    "node_self_ns",
    "tree_node",
)


def assert_same_tokens(fast: Tokens, reference: Tokens) -> None:
    for column in TOKEN_COLUMNS:
        ours, theirs = getattr(fast, column), getattr(reference, column)
        assert ours.dtype == theirs.dtype, column
        assert np.array_equal(ours, theirs), column
    assert fast.names == reference.names


def assert_same_vocabulary(fast: TPE, reference: TPE) -> None:
    assert fast.base == reference.base
    assert fast.merges == reference.merges
    assert fast.merge_counts == reference.merge_counts


def real_slices(relative: str) -> list[Slice]:
    return list(_read_slices(relative))


@functools.cache
def _read_slices(relative: str) -> tuple[Slice, ...]:
    """Each real trace is read once for the whole module (both weightings and the token cap
    train on the same slices; neither tokenizer changes them)."""
    tree = build_tree(read_trace(real_trace(relative)))
    return tuple(step_slices(tree) if len(tree.steps) else root_slices(tree))


@pytest.mark.parametrize("weighting", ["slice", "node"])
def test_real_traces_train_the_same_merges_and_encode_to_the_same_tokens(weighting: str) -> None:
    corpus = real_slices("hta/queue_len_rank0_of16.json.gz")
    corpus += real_slices("tracelens/hf_qwen1.5-0.5b_h100.json.gz")
    held_out = real_slices("hta/df_index_resolver_rank1_of2_216k_events.json.gz")[:2]

    fast = TPE.train(corpus, 2048, weighting=weighting)
    reference = reference_train(corpus, 2048, weighting=weighting)

    assert_same_vocabulary(fast, reference)
    assert len(fast.merges) > 100
    for piece in [*corpus, *held_out]:
        assert_same_tokens(fast.encode(piece), reference_encode(reference, piece))


def test_a_token_cap_trains_the_same_merges() -> None:
    corpus = real_slices("hta/queue_len_rank0_of16.json.gz")

    fast = TPE.train(corpus, 1024, max_token_nodes=8)
    reference = reference_train(corpus, 1024, max_token_nodes=8)

    assert_same_vocabulary(fast, reference)
    for piece in corpus:
        assert_same_tokens(fast.encode(piece), reference_encode(reference, piece))


def test_small_synthetic_trees_train_and_encode_the_same() -> None:
    steps = [optimizer_step_slice(), _repeat_slice([("cpu_op", "aten::mm", -1)], 5)]
    steps.append(
        _repeat_slice([("cpu_op", "aten::linear", -1), ("runtime", "cudaLaunchKernel", 0)], 7)
    )

    fast = TPE.train(steps, 64, min_count=1)
    reference = reference_train(steps, 64, min_count=1)

    assert_same_vocabulary(fast, reference)
    assert fast.merges
    for piece in steps:
        assert_same_tokens(fast.encode(piece), reference_encode(reference, piece))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    corpus=st.lists(random_slices(), min_size=1, max_size=6),
    other=random_slices(),
    vocab=st.integers(len(UNK_NAMES), 64),
    weighting=st.sampled_from(["slice", "node"]),
)
def test_random_trees_train_and_encode_the_same(
    corpus: list[Slice], other: Slice, vocab: int, weighting: str
) -> None:
    fast = TPE.train(corpus, vocab, min_count=1, weighting=weighting)
    reference = reference_train(corpus, vocab, min_count=1, weighting=weighting)

    assert_same_vocabulary(fast, reference)
    for piece in [*corpus, other]:
        assert_same_tokens(fast.encode(piece), reference_encode(reference, piece))
