"""A hang: the step a collective never finished, and the rank that never arrived.

A hang ends the trace inside a step, so that step has no step node and no step score sees it.
Its mark is a collective instance that only some ranks entered, after their last finished step,
and that they sat in for `HANG_NS` or more (until a watchdog or the profiler stopped). The ranks
missing from it never arrived: the suspect, as a late arrival with no end.
"""

from __future__ import annotations

import numpy as np

from teller.callchain.facts import RunFacts
from teller.callchain.render import format_ns
from teller.callchain.tree import CallTree
from teller.localize.results import OperatorCandidate, StepScore
from teller.localize.step_model import ratio_z

#: A collective that some ranks sat in this long while a peer never joined is a hang, not a delay.
HANG_NS = 10_000_000_000


def unfinished_step(
    tree: CallTree, facts: RunFacts | None = None
) -> tuple[StepScore, OperatorCandidate] | None:
    """The step a hang left unfinished (scored as one more step, `kind="unfinished"`), and the
    rank that never arrived as its one candidate; None without a hang."""
    comm = tree.comm
    ranks = RunFacts.of(tree, facts).ranks
    if not len(comm) or len(ranks) < 2:
        return None
    trailing = tree.step[comm.node] < 0
    waited = comm.end_ns - comm.start_ns
    hung_rows = np.flatnonzero(trailing & (waited >= HANG_NS))
    if not len(hung_rows):
        return None
    instance = int(comm.instance[hung_rows[np.argmax(waited[hung_rows])]])
    members = np.flatnonzero(comm.instance == instance)
    present = sorted(set(comm.rank[members].tolist()))
    longest = int(members[np.argmax(waited[members])])
    group_ranks = _group_members(comm, comm.group[longest], present)
    missing = [r for r in (group_ranks or ranks) if r not in present]
    if not missing:
        return None
    wait_ns = int(waited[longest])
    usual_ns = int(np.median(tree.steps.dur_ns))
    # the step after the last one its engine finished (a run may hold several engines)
    of_engine = np.isin(tree.steps.rank, present)
    iteration = int(tree.steps.index[of_engine if of_engine.any() else slice(None)].max()) + 1
    step = StepScore(
        iteration=iteration,
        kind="unfinished",
        dur_ns=wait_ns,
        expected_ns=usual_ns,
        z=ratio_z(wait_ns, usual_ns),
        anomalous=True,
        ranks=present,
    )
    candidate = OperatorCandidate(
        iteration=iteration,
        rank=missing[0],
        operator=tree.names[tree.name[comm.node[longest]]],
        score=float(wait_ns),
        observed_ns=wait_ns,
        normal_ns=0,
        z=step.z,
        node=int(comm.node[longest]),
        reference=f"ranks {present} waited in it; rank(s) {missing} never arrived (hang)",
        kind="arrival",
    )
    return step, candidate


def _group_members(comm, group: str, present: list[int]) -> list[int]:
    """The ranks of the hung collective's process group: those that met one of `present` in an
    earlier collective of the same group. Only they can have failed to arrive; a pipeline's
    other stages and other engines were never in it (empty when the trace names no group)."""
    if not group:
        return []
    rows = np.flatnonzero(np.asarray([g == group for g in comm.group], dtype=bool))
    met = np.unique(comm.instance[rows][np.isin(comm.rank[rows], present)])
    together = rows[np.isin(comm.instance[rows], met)]
    return sorted(set(comm.rank[together].tolist()))


def hang_explanation(step: StepScore, candidate: OperatorCandidate) -> str:
    """The sentence for an unfinished step (`unfinished_step`)."""
    return (
        f"Rank {candidate.rank} never reached {candidate.operator}; its peers hung in it for "
        f"{format_ns(step.dur_ns)} until a watchdog or the profiler stopped them, so step "
        f"{step.iteration} never finished."
    )
