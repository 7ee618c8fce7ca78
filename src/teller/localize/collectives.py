"""Collectives are scored by arrival, never by duration.

A rank that reaches a collective after its peers is the suspect, and the peers' inflated waits
are symptoms, not candidates: a collective's duration on most ranks is mostly waiting for the last
one. A collective slower on every rank without a late arrival is a transfer problem, scored by the
last arriver's own time (which has no waiting in it) against the reference steps.
"""

from __future__ import annotations

import numpy as np

from teller.callchain.facts import Arrivals
from teller.callchain.tree import CallTree
from teller.localize.features import MAD_TO_SIGMA, credit, significance
from teller.localize.results import OperatorCandidate
from teller.localize.step_model import ratio_z

ARRIVAL_REFERENCE = "arrival after the other ranks, vs this rank's usual skew"
IN_STEP_REFERENCE = "arrival after the other ranks at the same collective, same step"
#: A rank's lateness at one collective instance against its lateness at the step's other
#: instances: this robust z (where there are at least `MIN_INSTANCES` of them) ...
LATE_Z = 6.0
MIN_INSTANCES = 4
TRANSFER_REFERENCE = "last arriver's own collective time vs nearest normal steps"
OWN_SHARE_REFERENCE = "this rank's own collective time vs its normal steps of this kind"


def collective_candidates(
    tree: CallTree,
    arrivals: Arrivals | None,
    iteration: int,
    reference: list[int],
    noise_floor_ns: float,
) -> list[OperatorCandidate]:
    """Arrival and transfer candidates of one step, against the `reference` steps."""
    if arrivals is None:
        return []
    rank, name = arrivals.rank, arrivals.name
    late_ns, own_ns, node, is_last = (
        arrivals.late_ns,
        arrivals.own_ns,
        arrivals.node,
        arrivals.is_last,
    )
    out: list[OperatorCandidate] = []
    here = arrivals.rows_in(iteration)
    pooled_scale = _pooled_lateness_scale(arrivals, here, reference)
    for r in np.unique(rank[here]).tolist():
        for n in np.unique(name[here[rank[here] == r]]).tolist():
            now = arrivals.rows_of(iteration, r, n)
            usual_rows = [arrivals.rows_of(it, r, n) for it in reference]
            # lateness against this rank's own lateness in the reference steps: ranks skew a
            # little all the time, only skew beyond the usual points at something
            usual = [late_ns[rows].sum() for rows in usual_rows]
            observed = float(late_ns[now].sum())
            lateness = float(late_ns[now].sum() - (np.median(usual) if usual else 0.0))
            if lateness > noise_floor_ns:
                z = significance(observed, usual, noise_floor_ns, pooled_scale)
                out.append(
                    OperatorCandidate(
                        iteration,
                        r,
                        tree.names[n],
                        score=lateness * credit(z),
                        observed_ns=int(observed),
                        normal_ns=int(np.median(usual)) if usual else 0,
                        z=z,
                        node=int(node[now][np.argmax(late_ns[now])]),
                        reference=ARRIVAL_REFERENCE,
                        kind="arrival",
                    )
                )
            # transfer: a collective slower on every rank, the last arriver included, is a
            # transfer problem; the last arriver's own time has no waiting in it
            last_rows = now[is_last[now]]
            if not len(last_rows):
                continue
            usual_own = [own_ns[rows[is_last[rows]]].sum() for rows in usual_rows]
            own = float(own_ns[last_rows].sum())
            excess = float(own_ns[last_rows].sum() - (np.median(usual_own) if usual_own else 0.0))
            if usual_own and excess > noise_floor_ns:
                out.append(
                    OperatorCandidate(
                        iteration,
                        r,
                        tree.names[n],
                        score=excess,
                        observed_ns=int(own),
                        normal_ns=int(np.median(usual_own)),
                        z=ratio_z(own, float(np.median(usual_own))),
                        node=int(node[last_rows][0]),
                        reference=TRANSFER_REFERENCE,
                        kind="transfer",
                    )
                )
    return out


def own_share(
    tree: CallTree,
    arrivals: Arrivals | None,
    iteration: int,
    rank: int,
    reference: list[int],
) -> OperatorCandidate | None:
    """`rank`'s own time in the step's collective that grew most against the `reference`
    steps, as a transfer candidate; None where none grew.

    What names a straggler in a step it reached no collective late: where collectives run on
    the host (gloo), a throttled rank's transfer threads are throttled too, so the step's
    collectives are slow on every rank and its peer can even arrive last, and the straggler has
    no arrival or last-arriver candidate there. Its own share of the slow collective is then
    what the step lost on it."""
    if arrivals is None:
        return None
    here = arrivals.rows_in(iteration)
    best: OperatorCandidate | None = None
    for n in np.unique(arrivals.name[here[arrivals.rank[here] == rank]]).tolist():
        now = arrivals.rows_of(iteration, rank, n)
        usual = [float(arrivals.own_ns[arrivals.rows_of(it, rank, n)].sum()) for it in reference]
        if not usual:
            continue
        observed = float(arrivals.own_ns[now].sum())
        normal = float(np.median(usual))
        if observed <= normal or (best is not None and observed - normal <= best.score):
            continue
        best = OperatorCandidate(
            iteration,
            rank,
            tree.names[n],
            score=observed - normal,
            observed_ns=int(observed),
            normal_ns=int(normal),
            z=ratio_z(observed, normal),
            node=int(arrivals.node[now][np.argmax(arrivals.own_ns[now])]),
            reference=OWN_SHARE_REFERENCE,
            kind="transfer",
        )
    return best


def _pooled_lateness_scale(arrivals: Arrivals, here: np.ndarray, reference: list[int]) -> float:
    """How much any rank's lateness at a collective wanders from its own usual: the spread of
    every (rank, collective)'s deviations from its median in the reference steps, pooled;
    `here`: the step's rows.

    Why pooled: host-bound ranks skew by chance, and a rank that is usually on time has no spread
    of its own to judge by."""
    rank, name, late_ns = arrivals.rank, arrivals.name, arrivals.late_ns
    deviations = []
    for r in np.unique(rank[here]).tolist():
        for n in np.unique(name[here[rank[here] == r]]).tolist():
            usual = np.array([late_ns[arrivals.rows_of(it, r, n)].sum() for it in reference])
            deviations.extend(np.abs(usual - np.median(usual)).tolist() if len(usual) else [])
    return MAD_TO_SIGMA * float(np.median(deviations)) if deviations else 0.0


def late_in_step(
    tree: CallTree,
    arrivals: Arrivals | None,
    min_share: float,
    noise_floor_ns: float,
) -> dict[int, list[OperatorCandidate]]:
    """iteration → arrival candidates found inside the step alone: a rank that reached one
    collective instance after its peers by at least `min_share` of its step, where its lateness
    at the step's other instances (if it has `MIN_INSTANCES`) is far smaller.

    This is the comparison across ranks that needs no other step: the peers' arrival at the same
    instance is the reference, which a one-step capture of a tensor-parallel group still has."""
    out: dict[int, list[OperatorCandidate]] = {}
    if arrivals is None or not len(arrivals):
        return out
    duration = {
        (int(r), int(i)): int(d)
        for r, i, d in zip(tree.steps.rank, tree.steps.index, tree.steps.dur_ns, strict=True)
    }
    keys = arrivals.iteration * (int(arrivals.rank.max()) + 1) + arrivals.rank
    order = np.argsort(keys, kind="stable")  # each group's rows stay ascending
    for rows in np.split(order, np.flatnonzero(np.diff(keys[order])) + 1):
        iteration, rank = int(arrivals.iteration[rows[0]]), int(arrivals.rank[rows[0]])
        late = arrivals.late_ns[rows]
        worst = int(np.argmax(late))
        threshold = max(min_share * duration.get((rank, iteration), 0), noise_floor_ns)
        if late[worst] < threshold:
            continue
        others = np.delete(late, worst)
        usual = float(np.median(others)) if len(others) else 0.0
        if len(others) >= MIN_INSTANCES:
            spread = MAD_TO_SIGMA * float(np.median(np.abs(others - usual)))
            z = (late[worst] - usual) / max(spread, noise_floor_ns)
            if z < LATE_Z:
                continue
        else:
            z = (late[worst] - usual) / noise_floor_ns
        row = rows[worst]
        out.setdefault(iteration, []).append(
            OperatorCandidate(
                iteration,
                rank,
                tree.names[int(arrivals.name[row])],
                score=float(late[worst] - usual),
                observed_ns=int(late[worst]),
                normal_ns=int(usual),
                z=float(z),
                node=int(arrivals.node[row]),
                reference=IN_STEP_REFERENCE,
                kind="arrival",
            )
        )
    for found in out.values():
        found.sort(key=lambda c: -c.score)
    return out
