"""GPU idle gaps and the host work that caused them.

When a rank's GPU sits idle and the launch of its next kernel came *after* the GPU went idle, the
GPU was waiting on the host: whatever the launching thread was doing in between delayed the step.
That host work is the suspect, not the kernel that ran late. (A kernel launched before the GPU
went idle but started late waited on something on the device — a dependency, a copy — and is not
attributed here.)

`idle_gaps(tree)` walks each rank's GPU timeline once, finds the gaps, and attributes each one to
the deepest host node running on the launching thread halfway through the host's delay.
"""

from __future__ import annotations

import numpy as np

from teller.callchain.tree import EDGE_LAUNCH, CallTree

#: Gaps shorter than this are launch latency, not a stall.
MIN_GAP_NS = 20_000


def idle_gaps(
    tree: CallTree, min_gap_ns: int = MIN_GAP_NS
) -> dict[tuple[int, int], dict[int, float]]:
    """(rank, iteration) → {host node name id: idle GPU ns attributed to it}."""
    out: dict[tuple[int, int], dict[int, float]] = {}
    on_gpu = np.flatnonzero((tree.stream >= 0) & (tree.step >= 0))
    if not len(on_gpu):
        return out
    end = tree.start + tree.dur
    for rank in np.unique(tree.rank[on_gpu]).tolist():
        nodes = on_gpu[tree.rank[on_gpu] == rank]
        nodes = nodes[np.argsort(tree.start[nodes], kind="stable")]
        busy_until = np.maximum.accumulate(end[nodes])
        gap = tree.start[nodes[1:]] - busy_until[:-1]
        for i in (np.flatnonzero(gap > min_gap_ns) + 1).tolist():
            kernel = int(nodes[i])
            idle_from = int(busy_until[i - 1])
            launcher = int(tree.parent[kernel])
            if tree.edge[kernel] != EDGE_LAUNCH or launcher < 0:
                continue
            if tree.start[launcher] <= idle_from:  # launched in time: a device-side wait
                continue
            culprit = _running_at(tree, launcher, (idle_from + int(tree.start[launcher])) // 2)
            if culprit < 0:
                continue
            iteration = int(tree.steps.index[tree.step[kernel]])
            per_name = out.setdefault((rank, iteration), {})
            name = int(tree.name[culprit])
            per_name[name] = per_name.get(name, 0.0) + float(gap[i - 1])
    return out


def _running_at(tree: CallTree, node: int, at_ns: int) -> int:
    """The deepest host node on `node`'s thread that was running at `at_ns` (-1 if none)."""
    root = node
    while tree.parent[root] >= 0 and tree.stream[tree.parent[root]] < 0:
        root = int(tree.parent[root])
    if not tree.start[root] <= at_ns < tree.start[root] + tree.dur[root]:
        return -1
    current = root
    while True:
        children = tree.children(current)
        children = children[tree.stream[children] < 0]
        inside = children[
            (tree.start[children] <= at_ns) & (tree.start[children] + tree.dur[children] > at_ns)
        ]
        if not len(inside):
            return current
        current = int(inside[0])
