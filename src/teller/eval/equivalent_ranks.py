"""Ranks that a trace cannot tell apart from a case's labelled guilty rank.

Some injected faults sit on something that several ranks share: a link of a tensor-parallel ring
(`link_contention`: a ring all-reduce runs at its slowest link's pace, so every rank of the ring
waits the same whichever of its links is contended; the simulator writes byte-identical traces
for a contended link 0–1 and 2–3 of a four-rank ring), a node's network on a two-node ring (`net_delay`, `bandwidth_throttle`: every
cross-node link touches both nodes, so throttling node 0 or node 1 slows exactly the same links),
the one link of a two-rank lab run (`net_throttle` shapes the guilty rank's veth both ways, and all
traffic between the two ranks crosses it). The timeline such a fault leaves is the same whichever of
those ranks the label names, so no method can recover the label's choice among them; scoring that
choice would score a coin toss. Naming any of these ranks therefore counts as naming the guilty one
(DESIGN.md §5 talks of "link contention between a rank pair"). Every other fault keeps its one rank.

Operators have the same problem in one place: a case's labels name one guilty operator, and a
contended host (`host_cpu_contention`) delays the host's kernel launches, which are
`cudaLaunchKernel` calls in eager steps and one `cudaGraphLaunch` in a step that replays a CUDA
graph (such a step has no `cudaLaunchKernel` for its kernels at all). Either launch call is the
guilty operator of that case (`equivalent_operators`).
"""

from __future__ import annotations

from teller.lab.labels import CaseLabels

#: Faults on a node's network (simulator): they slow every cross-node link that touches the node.
NODE_NETWORK_FAULTS = ("net_delay", "bandwidth_throttle")


def equivalent_ranks(labels: CaseLabels) -> frozenset[int]:
    """The labelled guilty rank plus every rank indistinguishable from it (empty without a rank)."""
    rank = labels.guilty_rank
    if rank is None:
        return frozenset()
    params = labels.params or {}
    if labels.fault == "link_contention" and params.get("peer") is not None:
        ring = _ring_of(rank, params.get("topology"))
        return frozenset({rank, int(params["peer"])} | ring)
    if labels.fault in NODE_NETWORK_FAULTS and isinstance(params.get("topology"), dict):
        return frozenset({rank} | _same_links_ranks(rank, params["topology"]))
    if labels.fault == "net_throttle" and int(params.get("tp", 0)) == 2:
        return frozenset({0, 1})
    return frozenset({rank})


#: The host calls that launch GPU work: eagerly, kernel by kernel, or a captured CUDA graph at once.
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaGraphLaunch")


def equivalent_operators(labels: CaseLabels) -> frozenset[str]:
    """The labelled guilty operator plus the names it goes by in steps where it does not run
    (empty without an operator)."""
    operator = labels.guilty_operator
    if operator is None:
        return frozenset()
    if labels.fault == "host_cpu_contention" and operator in LAUNCH_CALLS:
        return frozenset(LAUNCH_CALLS)
    return frozenset({operator})


def _ring_of(rank: int, topology: object) -> set[int]:
    """The simulator's tensor-parallel group of `rank` (consecutive blocks of `tp` ranks), whose
    all-reduce ring holds the contended link; empty where the labels do not give the topology."""
    if not isinstance(topology, dict) or int(topology.get("tp", 0)) < 2:
        return set()
    tp = int(topology["tp"])
    first = rank - rank % tp
    return set(range(first, first + tp))


def _same_links_ranks(rank: int, topology: dict) -> set[int]:
    """Ranks on nodes whose network fault would slow exactly the links the guilty node's does."""
    per_node = int(topology["gpus_per_node"])
    nodes = int(topology["nodes"])
    world = per_node * nodes

    def touched(node: int) -> frozenset[tuple[int, int]]:
        return frozenset(
            (a, b)
            for a in range(world)
            for b in range(a + 1, world)
            if a // per_node != b // per_node and node in (a // per_node, b // per_node)
        )

    guilty = touched(rank // per_node)
    same = [node for node in range(nodes) if touched(node) == guilty]
    return {r for node in same for r in range(node * per_node, (node + 1) * per_node)}
