"""GPU idle gaps and the host work that caused them.

When a rank's GPU sits idle and the launch of its next kernel came *after* the GPU went idle, the
GPU was waiting on the host: whatever the launching thread was doing in between delayed the step.
That host work is the suspect, not the kernel that ran late. (A kernel launched before the GPU
went idle but started late waited on something on the device — a dependency, a copy — and is not
attributed here.)

`idle_gaps(tree)` walks each rank's GPU timeline once, finds the gaps, and attributes each one to
the deepest host node running on the launching thread halfway through the host's delay. A run
holds tens of thousands of gaps, each a walk down a few tree levels, so the walks are one
compiled loop (`_running_at`) over the tree's child lists; `run_idle_gaps` keeps the result in
the run's facts, where the localizer's candidates and the explanations' idle totals share it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from teller.callchain.facts import RunFacts
from teller.callchain.tree import EDGE_LAUNCH, CallTree

#: Gaps shorter than this are launch latency, not a stall.
MIN_GAP_NS = 20_000

IdleGaps = dict[tuple[int, int], dict[int, float]]


def run_idle_gaps(facts: RunFacts) -> IdleGaps:
    """`idle_gaps` of the run's tree, computed once per run."""
    return facts.derived("localize.idle_gaps", lambda: idle_gaps(facts.tree))


def idle_gaps(tree: CallTree, min_gap_ns: int = MIN_GAP_NS) -> IdleGaps:
    """(rank, iteration) → {host node name id: idle GPU ns attributed to it}."""
    out: IdleGaps = {}
    on_gpu = np.flatnonzero((tree.stream >= 0) & (tree.step >= 0))
    if not len(on_gpu):
        return out
    end = tree.start + tree.dur
    for rank in np.unique(tree.rank[on_gpu]).tolist():
        nodes = on_gpu[tree.rank[on_gpu] == rank]
        nodes = nodes[np.argsort(tree.start[nodes], kind="stable")]
        busy_until = np.maximum.accumulate(end[nodes])
        gap = tree.start[nodes[1:]] - busy_until[:-1]
        after = np.flatnonzero(gap > min_gap_ns) + 1
        kernels = nodes[after]
        idle_from = busy_until[after - 1]
        launchers = tree.parent[kernels]
        launched = (tree.edge[kernels] == EDGE_LAUNCH) & (launchers >= 0)
        launch_ns = np.where(launched, tree.start[np.maximum(launchers, 0)], 0)
        # launched after the GPU went idle; one launched in time waited on the device instead
        late = launched & (launch_ns > idle_from)
        kernels, launchers, gaps = kernels[late], launchers[late], gap[after[late] - 1]
        midpoints = (idle_from[late] + launch_ns[late]) // 2
        culprits = _running_at(
            tree.parent,
            tree.stream,
            tree.start,
            tree.dur,
            tree.child_offsets,
            tree.child_index,
            launchers.astype(np.int64),
            midpoints.astype(np.int64),
        )
        iterations = tree.steps.index[tree.step[kernels]]
        for culprit, iteration, ns in zip(
            culprits.tolist(), iterations.tolist(), gaps.tolist(), strict=True
        ):
            if culprit < 0:
                continue
            per_name = out.setdefault((rank, int(iteration)), {})
            name = int(tree.name[culprit])
            per_name[name] = per_name.get(name, 0.0) + float(ns)
    return out


@njit(cache=True)
def _running_at(parent, stream, start, dur, child_offsets, child_index, nodes, at_ns):
    """For each (node, time): the deepest host node on the node's thread running then (-1 if
    none). The thread's outermost host ancestor of the node is the root of the walk; each level
    descends into the first host child (in child order) whose span holds the time."""
    out = np.full(len(nodes), -1, dtype=np.int64)
    for q in range(len(nodes)):
        root = nodes[q]
        at = at_ns[q]
        while parent[root] >= 0 and stream[parent[root]] < 0:
            root = parent[root]
        if not (start[root] <= at < start[root] + dur[root]):
            continue
        current = root
        while True:
            found = -1
            for k in range(child_offsets[current], child_offsets[current + 1]):
                child = child_index[k]
                if stream[child] < 0 and start[child] <= at < start[child] + dur[child]:
                    found = child
                    break
            if found < 0:
                break
            current = found
        out[q] = current
    return out
