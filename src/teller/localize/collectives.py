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
TRANSFER_REFERENCE = "last arriver's own collective time vs nearest normal steps"


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
    iteration_of, rank, name = arrivals.iteration, arrivals.rank, arrivals.name
    late_ns, own_ns, node, is_last = (
        arrivals.late_ns,
        arrivals.own_ns,
        arrivals.node,
        arrivals.is_last,
    )
    out: list[OperatorCandidate] = []
    here = iteration_of == iteration
    pooled_scale = _pooled_lateness_scale(arrivals, here, reference)
    for r in np.unique(rank[here]).tolist():
        for n in np.unique(name[here & (rank == r)]).tolist():
            mine = (rank == r) & (name == n)
            now = mine & here
            # lateness against this rank's own lateness in the reference steps: ranks skew a
            # little all the time, only skew beyond the usual points at something
            usual = [late_ns[mine & (iteration_of == it)].sum() for it in reference]
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
            last_rows = now & is_last
            if not last_rows.any():
                continue
            usual_own = [own_ns[mine & (iteration_of == it) & is_last].sum() for it in reference]
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


def _pooled_lateness_scale(arrivals: Arrivals, here: np.ndarray, reference: list[int]) -> float:
    """How much any rank's lateness at a collective wanders from its own usual: the spread of
    every (rank, collective)'s deviations from its median in the reference steps, pooled.

    Why pooled: host-bound ranks skew by chance, and a rank that is usually on time has no spread
    of its own to judge by."""
    iteration_of, rank, name, late_ns = (
        arrivals.iteration,
        arrivals.rank,
        arrivals.name,
        arrivals.late_ns,
    )
    deviations = []
    for r in np.unique(rank[here]).tolist():
        for n in np.unique(name[here & (rank == r)]).tolist():
            mine = (rank == r) & (name == n)
            usual = np.array([late_ns[mine & (iteration_of == it)].sum() for it in reference])
            deviations.extend(np.abs(usual - np.median(usual)).tolist() if len(usual) else [])
    return MAD_TO_SIGMA * float(np.median(deviations)) if deviations else 0.0
