"""How long each step's collectives spent moving data, against what the step's batch predicts.

A collective's duration on most ranks is mostly waiting for the last rank to arrive; the last
arriver's own time is the transfer alone (`RunFacts.arrivals`). Summed over a step's collectives it is a
clean measure of the links: it grows with the bytes moved (the batch's tokens) and with nothing
else, so a slower or longer link shows in it even when the step as a whole barely moves (a
contended NVLink adds microseconds to a step of milliseconds).

Why a fit over the whole run and not the nearest steps by batch: a link fault lasts a window of
steps whose batches look alike, so the nearest steps by batch are the fault's own steps and hide
it. Per step kind, the run's transfer times are fitted as ``a + b·context + c·generation``
(trimmed to the faster part, as the step model is), and each step gets its log ratio to the fit,
centred on the kind's usual ratio, and that ratio's z, both read from the faster steps.
"""

from __future__ import annotations

import numpy as np

from teller.callchain.facts import RunFacts
from teller.callchain.tree import CallTree
from teller.localize.step_model import design, fit_step_model

#: Share of a kind's steps the fit keeps (the faster ones): link faults only ever slow transfers.
FIT_KEEP = 0.6
#: Smallest log-ratio scale: a simulated or very quiet link can be steadier than any real one.
MIN_SCALE = 0.01
#: Standard-normal quantiles at 10% and 30%.
_Z10, _Z30 = -1.2816, -0.5244
#: Fewest steps of a kind to fit; below this the kind's steps get no transfer score.
MIN_STEPS = 4


def transfer_residuals(
    tree: CallTree, facts: RunFacts | None = None
) -> dict[int, tuple[float, float]]:
    """iteration → (log of transfer time over the fit, its robust z); steps without collectives
    (one rank, or a kind too rare to fit) are absent. `facts`: the tree's `RunFacts` where the
    caller has them (their arrivals are the slow part)."""
    facts = RunFacts.of(tree, facts)
    arrivals = facts.arrivals
    if arrivals is None:
        return {}
    last = arrivals.is_last
    seen, row = np.unique(arrivals.iteration[last], return_inverse=True)
    totals = np.bincount(row, weights=arrivals.own_ns[last], minlength=len(seen))
    transfer = dict(zip(seen.tolist(), totals.tolist(), strict=True))
    iterations = facts.iterations.iteration
    kinds = facts.iterations.kind
    ctx = facts.iterations.context_tokens
    gen = facts.iterations.generation_tokens
    measured = np.array([transfer.get(int(it), 0.0) for it in iterations])
    out: dict[int, tuple[float, float]] = {}
    for kind in set(kinds.tolist()):
        mask = (kinds == kind) & (measured > 0)
        if mask.sum() < MIN_STEPS:
            continue
        fit = fit_step_model(measured[mask], ctx[mask], gen[mask], keep=FIT_KEEP)
        predicted = np.maximum(design(ctx[mask], gen[mask]) @ fit.coef, 1.0)
        log_ratio = np.log(measured[mask] / predicted)
        # centre and spread from the faster part only (normal quantiles 10% and 30%): link faults
        # only ever slow transfers, so the fast part is normal even when a fault covers most steps
        q10, q30 = np.quantile(log_ratio, [0.1, 0.3])
        scale = max(float(q30 - q10) / (_Z30 - _Z10), MIN_SCALE)
        log_ratio -= q30 - _Z30 * scale  # the kind's usual step sits at 0
        for it, value in zip(iterations[mask].tolist(), log_ratio.tolist(), strict=True):
            out[int(it)] = (float(value), float(value / scale))
    return out
