"""The self-time history kept one table per engine answers what one table of the run would."""

from __future__ import annotations

import numpy as np

from teller.callchain.facts import StepNodes
from teller.localize.candidates import SelfTimeHistory


def two_engines(seed: int) -> tuple[StepNodes, np.ndarray]:
    """Ranks 0-1 run engine 0's even iterations, ranks 2-3 engine 1's odd ones; each step runs a
    random subset of three operators, some twice."""
    rng = np.random.default_rng(seed)
    rows = []
    for iteration in range(40):
        engine = iteration % 2
        for rank in (2 * engine, 2 * engine + 1):
            for name in (0, 1, 2):
                for ordinal in range(int(rng.integers(0, 3))):
                    rows.append((iteration, rank, name, ordinal, engine, rng.uniform(1e3, 1e6)))
    iteration, rank, name, ordinal, engine, self_ns = (np.array(c) for c in zip(*rows, strict=True))
    count = len(rows)
    nodes = StepNodes(
        node=np.arange(count),
        step=np.arange(count),
        iteration=iteration.astype(np.int64),
        rank=rank.astype(np.int32),
        name=name.astype(np.int32),
        ordinal=ordinal.astype(np.int64),
        self_ns=self_ns.astype(np.int64),
        layer=np.zeros(count, np.int8),
        on_gpu=np.ones(count, bool),
    )
    return nodes, engine.astype(np.int64)


def test_per_engine_tables_give_the_one_tables_medians() -> None:
    for seed in range(5):
        nodes, engine = two_engines(seed)
        split = SelfTimeHistory.of(nodes, engine)
        whole = SelfTimeHistory.of(nodes, np.zeros_like(engine))
        assert len(split.blocks) == 2 and len(whole.blocks) == 1
        assert sum(b.size for b in split.blocks) * 2 == whole.blocks[0].size
        for iteration in range(40):
            rows = np.flatnonzero(nodes.iteration == iteration)
            reference = [i for i in range(iteration % 2, 40, 2) if i != iteration][:8]
            for history in (split, whole):
                got = history.medians(rows, reference)
                want = whole.medians(rows, reference)
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])
            np.testing.assert_array_equal(
                split.peer_medians(rows, iteration), whole.peer_medians(rows, iteration)
            )


def test_a_rank_in_two_engines_keeps_one_table() -> None:
    nodes, engine = two_engines(0)
    engine[:3] = 1 - engine[:3]  # rank 0's first nodes said to be the other engine's
    assert len(SelfTimeHistory.of(nodes, engine).blocks) == 1
