"""A slow link's collectives tell a rate limit from added latency by how they grew with size.

On the repository's recorded lab run (fault-free, TP 2, gloo), rank 1's collectives in a few
steps are made slower: by their bytes over a rate (a rate limit), or by one fixed time each
(a delay). `size_growth` says which; unmodified steps never read as a rate limit.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from teller.callchain.tree import CallTree, build_tree
from teller.ingest import read_run
from teller.rca.link_size import size_growth

LAB_TRACES = Path(__file__).parents[1] / "align" / "data" / "lab_none_tp2" / "traces"
RANK = 1
BYTES_PER_NS = 2.5e6 / 1e9  # 20 Mbit/s


@pytest.fixture(scope="module")
def recorded() -> CallTree:
    return build_tree(read_run([LAB_TRACES]))


def _grows(tree: CallTree, ranks: list[int], window: list[int]) -> bool | None:
    growth = size_growth(tree, ranks, window)
    return None if growth is None else growth.grows


def _window(tree: CallTree) -> list[int]:
    iterations = np.unique(tree.steps.index)
    middle = len(iterations) // 2
    return iterations[middle : middle + 4].tolist()


def _slowed(tree: CallTree, window: list[int], added_ns, rank: int = RANK) -> CallTree:
    """`tree` with each of `rank`'s sized collectives in `window` longer by `added_ns(bytes)`."""
    comm = tree.comm
    rows = tree.step[comm.node]
    chosen = (
        (rows >= 0)
        & (comm.bytes > 0)
        & (tree.steps.rank[rows] == rank)
        & np.isin(tree.steps.index[rows], window)
    )
    dur = tree.dur.copy()
    dur[comm.node[chosen]] += added_ns(comm.bytes[chosen].astype(float)).astype(dur.dtype)
    return dataclasses.replace(tree, dur=dur)


def test_a_rate_limit_grows_with_size(recorded):
    window = _window(recorded)
    limited = _slowed(recorded, window, lambda size: size / BYTES_PER_NS)
    assert _grows(limited, [RANK], window) is True
    # the quoted measurement is the time the rate added: each half's bytes over the rate
    growth = size_growth(limited, [RANK], window)
    for size, excess in (
        (growth.small_bytes, growth.small_excess_ns),
        (growth.large_bytes, growth.large_excess_ns),
    ):
        assert excess == pytest.approx(size / BYTES_PER_NS, rel=0.25)


def test_added_latency_does_not(recorded):
    window = _window(recorded)
    delayed = _slowed(recorded, window, _fixed)
    assert _grows(delayed, [RANK], window) is False


def test_both_ends_of_a_link_are_measured_together(recorded):
    """The pointer named rank 0 in one flagged step and rank 1 in the next: rank 1's one step
    holds too few collectives of distinct sizes to tell anything, both ends' steps together
    tell a rate limit from a delay."""
    window = _window(recorded)[:2]
    ends = {0: window[:1], 1: window[1:]}
    for added_ns, grows in ((lambda size: size / BYTES_PER_NS, True), (_fixed, False)):
        slowed = recorded
        for rank, steps in ends.items():
            slowed = _slowed(slowed, steps, added_ns, rank)
        assert _grows(slowed, [1], ends[1]) is None
        assert _grows(slowed, [0, 1], window) is grows


def _fixed(size: np.ndarray) -> np.ndarray:
    return np.full_like(size, 5e6)


def test_noise_never_reads_as_a_rate_limit(recorded):
    """Every window of four steps of the unmodified run: flat or unknown, never a rate limit."""
    iterations = np.unique(recorded.steps.index).tolist()
    windows = [iterations[i : i + 4] for i in range(0, len(iterations) - 3, 4)]
    assert all(_grows(recorded, [RANK], window) is not True for window in windows)
