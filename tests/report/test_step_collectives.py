"""The worst step's collectives per rank, as the report's Gantt chart draws them: every rank's step
is cut into work and collectives with no gap or overlap, a collective's wait is the time until the
last rank arrived, and the rank the others waited for is the one whose collectives wait least."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from teller.report.step_collectives import ALONE, TRANSFER, WAITING, WORK, step_collectives


def _worst(analysis):
    verdict = analysis.diagnose()
    return step_collectives(analysis.tree, analysis.facts.arrivals, verdict.findings[0].step)


def test_segments_tile_each_rank_step(contention_analysis):
    collectives = _worst(contention_analysis)
    assert collectives.ranks == [0, 1] and collectives.shared
    segments = collectives.segments()
    assert {s.part for s in segments} <= {WORK, WAITING, TRANSFER}
    for rank in collectives.ranks:
        mine = [s for s in segments if s.rank == rank]
        start, end = collectives.windows[rank]
        assert mine[0].start_ns == start and mine[-1].end_ns == end
        for before, after in pairwise(mine):
            assert before.end_ns == after.start_ns  # one after the other, no gap or overlap
        assert all(s.end_ns > s.start_ns for s in mine)


def test_wait_runs_until_the_last_rank_arrives(contention_analysis):
    collectives = _worst(contention_analysis)
    groups = collectives.instances()
    assert groups and all(len(group) == 2 for group in groups)  # one GPU row per rank
    for group in groups:
        last = max(group, key=lambda v: v.start_ns)
        assert [v.is_last for v in group].count(True) == 1 and last.is_last
        assert last.wait_ns == 0
        for visit in group:
            own = visit.end_ns - visit.start_ns
            assert visit.wait_ns == min(own, last.start_ns - visit.start_ns)
    firsts = [min(v.start_ns for v in group) for group in groups]
    assert firsts == sorted(firsts)  # in the order the ranks reached them


def test_last_arrivals_count_each_shared_instance_once(contention_analysis):
    collectives = _worst(contention_analysis)
    counts = collectives.last_arrivals()
    assert sum(counts.values()) == len(collectives.instances())
    late = Counter(v.rank for v in collectives.visits if v.is_last).most_common(1)[0][0]
    waited = {r: sum(v.wait_ns for v in collectives.visits if v.rank == r) for r in counts}
    assert waited[late] == min(waited.values())  # the straggler is the rank that waits least


def test_a_step_without_collectives_or_a_peer(contention_analysis):
    tree = contention_analysis.tree
    nothing = step_collectives(tree, None, int(tree.steps.index[0]))
    assert nothing.visits == [] and set(nothing.windows) == {0, 1}
    collectives = _worst(contention_analysis)
    alone = type(collectives)(
        collectives.step,
        {0: collectives.windows[0]},
        [v.__class__(**{**v.__dict__, "peers": 1}) for v in collectives.visits if v.rank == 0],
    )
    assert not alone.shared
    assert {s.part for s in alone.segments()} == {WORK, ALONE}
