"""An iteration's duration and batch come from one rank: in a run of several engine replicas
each runs its own batch, and a step is only slow against the batch it ran."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from teller.callchain.facts import iterations_of


@dataclass
class _Steps:
    """The step table's columns `iterations_of` reads."""

    rank: np.ndarray
    index: np.ndarray
    kind: np.ndarray
    context_tokens: np.ndarray
    generation_tokens: np.ndarray
    context_requests: np.ndarray
    generation_requests: np.ndarray
    dur_ns: np.ndarray
    engine: np.ndarray

    def __len__(self) -> int:
        return len(self.rank)


def _tree(rows: list[tuple[int, int, str, int, int, int]]) -> SimpleNamespace:
    """(rank, iteration, kind, context tokens, generation tokens, duration ns) per step row."""
    columns = list(zip(*rows, strict=True))
    steps = _Steps(
        rank=np.array(columns[0]),
        index=np.array(columns[1]),
        kind=np.array(columns[2], dtype=object),
        context_tokens=np.array(columns[3]),
        generation_tokens=np.array(columns[4]),
        context_requests=np.minimum(np.array(columns[3]), 1),  # one prompt where it prefills
        generation_requests=np.array(columns[4]),
        dur_ns=np.array(columns[5]),
        engine=np.zeros(len(rows), dtype=np.int64),  # one engine
    )
    return SimpleNamespace(steps=steps)


def test_the_slowest_replica_brings_its_own_batch() -> None:
    # replica A (ranks 0, 1) decodes; replica B (ranks 2, 3) runs a 477-token prefill chunk
    tree = _tree(
        [
            (0, 7, "decode", 0, 46, 270_000),
            (1, 7, "decode", 0, 46, 420_000),
            (2, 7, "mixed", 477, 43, 5_000_000),
            (3, 7, "mixed", 477, 43, 5_200_000),
        ]
    )
    iterations = iterations_of(tree)
    assert iterations.kind.tolist() == ["mixed"]
    assert iterations.context_tokens.tolist() == [477.0]
    assert iterations.generation_tokens.tolist() == [43.0]
    assert iterations.dur_ns.tolist() == [5_200_000.0]
    assert iterations.ranks == [[0, 1, 2, 3]]


def test_a_rank_that_states_no_batch_does_not_erase_the_batch() -> None:
    # rank 1 has steps from ProfilerStep only (no engine annotation): slowest, but no batch
    tree = _tree([(0, 3, "decode", 0, 12, 900_000), (1, 3, "step", -1, -1, 1_000_000)])
    iterations = iterations_of(tree)
    assert iterations.kind.tolist() == ["decode"]
    assert iterations.generation_tokens.tolist() == [12.0]
    assert iterations.dur_ns.tolist() == [1_000_000.0]
