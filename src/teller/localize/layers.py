"""Inside one step, the same operator in every repeated layer: an instance far from its siblings.

A transformer step runs each decoder layer's kernels and operators once per layer (and per
microbatch), so the step carries its own reference: the k-th GEMM of layer 7 should take what the
k-th GEMM of the other layers takes. This comparison needs neither a second step nor a peer rank,
which is what a vLLM or SGLang profiler capture (one step, one rank) offers.

The layers are read from the step itself, not from names: a name that runs once per layer (an
attention kernel, a norm) marks where each layer begins, and the k-th occurrence of another name
after the n-th mark is slot k of layer n. The anchor is the name whose layers agree best on what
they run. Grouping by slot keeps the projections of a layer, which often share one GEMM kernel
name, apart.

An instance is an outlier when its robust z against its slot's other layers passes `z_min` and
its excess is a real share of the step; a slot where many layers stand out (every sixth layer a
global-attention layer) is structure, not a fault, and never flags.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from teller.callchain.facts import RunFacts, StepNodes, run_ordinals
from teller.ingest.comm_names import is_comm_cpu_op, is_comm_kernel
from teller.ingest.schema import COMPUTE_CODES, LAYER_CODE
from teller.localize.features import median_mad

#: Fewest layers a slot needs for its median and spread to mean anything.
MIN_LAYERS = 4
#: A slot's spread is floored at this share of its median: kernels of one shape vary this much.
RELATIVE_NOISE = 0.05
#: Layers compared: the work a rank does itself. Runtime calls are left out: a launch call's time
#: is lazy module loading on first use or a full launch queue (a wait for the GPU), not work.
COMPARED_CODES = COMPUTE_CODES - {LAYER_CODE["runtime"]}
#: A (rank, name, slot, layer) that stands out in at least this share of the run's other steps is
#: that layer's nature (the first layer's warm-up, a bucketed reducer), not a fault of one step.
RECURRING = 0.5
#: Share of an outlier's excess over its siblings that must also be excess over the same
#: instance in the rank's other steps, where they have it.
USUAL_SHARE = 0.5
#: Where a slot has more outliers than one fault makes, the leading ones still count when their
#: excess is this many times the next one's: one stall, not a pattern.
DOMINANT = 10.0
#: How many of the commonest occurrence counts are tried as the layer count.
ANCHOR_COUNTS = 6


@dataclass(frozen=True)
class LayerOutlier:
    """One operator instance slower than the same slot in the step's other layers."""

    iteration: int
    rank: int
    name: int  # name id in the tree
    node: int  # the instance's node
    layer: int  # which repeated layer it sits in, from 0
    layers: int  # how many layers the step repeats
    self_ns: int
    sibling_ns: float  # median self time of the same slot in the other layers
    z: float
    step_share: float  # excess over the siblings / the step's duration on this rank

    @property
    def excess_ns(self) -> float:
        return float(self.self_ns) - self.sibling_ns


def layer_outliers(
    facts: RunFacts,
    z_min: float = 6.0,
    min_share: float = 0.01,
    noise_floor_ns: float = 2_000.0,
) -> dict[int, list[LayerOutlier]]:
    """iteration → its layer outliers, largest excess first.

    Collective kernels take part only on a one-rank trace: with peers in the trace a long
    collective is a wait for the last arrival, which `teller.localize.collectives` scores."""
    tree, nodes = facts.tree, facts.step_nodes
    skip = set(facts.waiting)
    if len(facts.ranks) > 1:
        skip |= {
            i for i, name in enumerate(tree.names) if is_comm_kernel(name) or is_comm_cpu_op(name)
        }
    eligible = np.isin(nodes.layer, list(COMPARED_CODES)) & ~np.isin(nodes.name, list(skip))
    step_dur = tree.steps.dur_ns
    start_ns = tree.start[nodes.node]  # each step node's start, for its place among the layers
    parent = tree.parent[nodes.node]
    caller = np.where(parent >= 0, tree.name[np.maximum(parent, 0)], -1)
    out: dict[int, list[LayerOutlier]] = {}
    for block in _blocks(nodes):
        rows = block[eligible[block]]
        if len(rows) < MIN_LAYERS:
            continue
        found = _block_outliers(nodes, start_ns, caller, rows, z_min, noise_floor_ns)
        duration = float(max(step_dur[int(nodes.step[rows[0]])], 1))
        for row, layer, layers, sibling, z in found:
            share = (float(nodes.self_ns[row]) - sibling) / duration
            if share < min_share:
                continue
            iteration = int(nodes.iteration[row])
            out.setdefault(iteration, []).append(
                LayerOutlier(
                    iteration=iteration,
                    rank=int(nodes.rank[row]),
                    name=int(nodes.name[row]),
                    node=int(nodes.node[row]),
                    layer=layer,
                    layers=layers,
                    self_ns=int(nodes.self_ns[row]),
                    sibling_ns=sibling,
                    z=z,
                    step_share=share,
                )
            )
    out = _without_recurring(out, len(tree.steps.rank) // max(len(facts.ranks), 1))
    return _without_usual(out, nodes)


def _without_recurring(
    found: dict[int, list[LayerOutlier]], steps_per_rank: int
) -> dict[int, list[LayerOutlier]]:
    """`found` less the outliers that recur at the same place in other steps (`RECURRING`),
    each step's list largest excess first."""
    seen: dict[tuple[int, int, int, int], int] = {}
    for outliers in found.values():
        for o in outliers:
            place = (o.rank, o.name, o.layer, o.layers)
            seen[place] = seen.get(place, 0) + 1
    others = max(steps_per_rank - 1, 0)
    out = {}
    for iteration, outliers in found.items():
        kept = [
            o
            for o in outliers
            if not others or (seen[(o.rank, o.name, o.layer, o.layers)] - 1) < RECURRING * others
        ]
        if kept:
            out[iteration] = sorted(kept, key=lambda o: -o.excess_ns)
    return out


def _without_usual(
    found: dict[int, list[LayerOutlier]], nodes: StepNodes
) -> dict[int, list[LayerOutlier]]:
    """`found` less the outliers that took what the same instance (rank, name and occurrence in
    the step) takes in most of the rank's other steps: a layer unlike its siblings in every step
    (a ResNet stage's wider convolution) is the network's shape, whatever the step's layer
    count came out as. An outlier stays when at least half of its excess over its siblings is
    also excess over the same instance elsewhere (`USUAL_SHARE`)."""
    wanted = {o.name for outliers in found.values() for o in outliers}
    if not wanted:
        return found
    rows = np.flatnonzero(np.isin(nodes.name, list(wanted)))
    elsewhere: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    ordinal_of: dict[int, int] = {}
    for row in rows.tolist():
        key = (int(nodes.rank[row]), int(nodes.name[row]), int(nodes.ordinal[row]))
        elsewhere.setdefault(key, []).append((int(nodes.iteration[row]), int(nodes.self_ns[row])))
        ordinal_of[int(nodes.node[row])] = key[2]
    steps_of_rank: dict[int, set[int]] = {}
    for rank, iteration in zip(nodes.rank.tolist(), nodes.iteration.tolist(), strict=True):
        steps_of_rank.setdefault(rank, set()).add(iteration)

    def usual(o: LayerOutlier) -> bool:
        key = (o.rank, o.name, ordinal_of[o.node])
        others = [ns for it, ns in elsewhere.get(key, []) if it != o.iteration]
        if not others or len(others) < RECURRING * (len(steps_of_rank[o.rank]) - 1):
            return False
        return o.self_ns - float(np.median(others)) < USUAL_SHARE * o.excess_ns

    out = {}
    for iteration, outliers in found.items():
        kept = [o for o in outliers if not usual(o)]
        if kept:
            out[iteration] = kept
    return out


def _blocks(nodes: StepNodes) -> list[np.ndarray]:
    """Row positions of each (rank, iteration, on GPU) block; `step_nodes` sorts by those keys."""
    count = len(nodes.node)
    if not count:
        return []
    change = (
        (nodes.rank[1:] != nodes.rank[:-1])
        | (nodes.iteration[1:] != nodes.iteration[:-1])
        | (nodes.on_gpu[1:] != nodes.on_gpu[:-1])
    )
    bounds = np.concatenate([[0], np.flatnonzero(change) + 1, [count]])
    return [np.arange(bounds[k], bounds[k + 1]) for k in range(len(bounds) - 1)]


def _block_outliers(
    nodes: StepNodes,
    start_ns: np.ndarray,
    caller: np.ndarray,
    rows: np.ndarray,
    z_min: float,
    noise_floor_ns: float,
) -> list[tuple[int, int, int, float, float]]:
    """(row, layer, layers, sibling median, z) of the outliers in one (rank, step, side) block.

    `rows` are sorted by name, then time. An instance's slot is the j-th call of its name from
    its caller's name within its layer: the same name called from elsewhere (a `np.array` in
    an image resize and in the batch's final tensor conversion) is not the same call.
    `caller`: per step-node row, its parent's name id (-1 for a root)."""
    layer_of = _layers(nodes, start_ns, rows)
    if layer_of is None:
        return []
    inside = layer_of >= 0
    rows, layer_of = rows[inside], layer_of[inside]
    layers = int(layer_of.max()) + 1
    by_call = np.lexsort((start_ns[rows], caller[rows], nodes.name[rows]))
    rows, layer_of = rows[by_call], layer_of[by_call]
    names, callers = nodes.name[rows], caller[rows]
    slot = run_ordinals(names, callers, layer_of)
    order = np.lexsort((layer_of, slot, callers, names))
    rows, layer_of, slot = rows[order], layer_of[order], slot[order]
    names, callers = names[order], callers[order]
    self_ns = nodes.self_ns[rows].astype(np.float64)
    change = (names[1:] != names[:-1]) | (callers[1:] != callers[:-1]) | (slot[1:] != slot[:-1])
    bounds = np.concatenate([[0], np.flatnonzero(change) + 1, [len(rows)]])
    out = []
    for k in range(len(bounds) - 1):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        if hi - lo < MIN_LAYERS:
            continue
        values = self_ns[lo:hi]
        median, spread = median_mad(values)
        floor = max(RELATIVE_NOISE * float(median), noise_floor_ns / 4.0)
        z = (values - median) / max(float(spread), floor)
        hits = _dominant(
            np.flatnonzero((z >= z_min) & (values - median >= noise_floor_ns)),
            values - median,
            max(2, (hi - lo) // 10),
        )
        for h in hits.tolist():
            others = np.delete(values, h)
            out.append(
                (
                    int(rows[lo + h]),
                    int(layer_of[lo + h]),
                    layers,
                    float(np.median(others)),
                    float(z[h]),
                )
            )
    return out


def _dominant(hits: np.ndarray, excess: np.ndarray, allowed: int) -> np.ndarray:
    """The hits that stand for one fault: all of them when they are few (`allowed`), else the
    leading few whose excess is `DOMINANT` times the next one's (a stall among a Python
    frame's usual microsecond jitter), else none (a pattern: every sixth layer a global one)."""
    if len(hits) <= allowed:
        return hits
    ranked = hits[np.argsort(-excess[hits], kind="stable")]
    for k in range(1, allowed + 1):
        if excess[ranked[k - 1]] >= DOMINANT * excess[ranked[k]]:
            return ranked[:k]
    return hits[:0]


def _layers(nodes: StepNodes, start_ns: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
    """Each row's repeated layer (−1 before the first), from the occurrences of an anchor: a
    name that runs once per layer. None when no name repeats at least MIN_LAYERS times.

    The anchor is the candidate whose layers agree best: the share of the block's work done by
    names that occur equally often in every layer but the last (whose end is a guess: what
    runs after the layers, the final norm or the LM head, is cut off by time)."""
    names = nodes.name[rows]
    starts = start_ns[rows]
    first = np.concatenate([[0], np.flatnonzero(names[1:] != names[:-1]) + 1])
    counts = np.diff(np.concatenate([first, [len(rows)]]))
    repeated = np.flatnonzero(counts >= MIN_LAYERS)
    if not len(repeated):
        return None
    # a layer body runs many names once each, so the commonest count is the layer count
    by_count: dict[int, int] = {}
    for c in counts[repeated].tolist():
        by_count[c] = by_count.get(c, 0) + 1
    common = sorted(by_count, key=lambda c: (-by_count[c], -c))[:ANCHOR_COUNTS]
    work = nodes.self_ns[rows].astype(np.float64)
    total = float(work.sum()) or 1.0
    best: tuple[float, int, np.ndarray] | None = None
    for c in common:
        # of the names that run c times, the one that runs first: a layer begins at it, so
        # only the prologue (the embedding) falls before the first layer
        named = repeated[counts[repeated] == c]
        anchor = int(named[np.argmin(starts[first[named]])])
        bounds = np.sort(starts[first[anchor] : first[anchor] + c])
        layer_of = np.searchsorted(bounds, starts, side="right") - 1
        # the last layer lasts as long as a usual one; what follows is the epilogue
        layer_of[starts >= bounds[-1] + np.median(np.diff(bounds))] = -1
        agree = _agreeing_work(names, layer_of, c, work) / total
        if best is None or (agree, c) > (best[0], best[1]):
            best = (agree, c, layer_of)
    assert best is not None
    return best[2]


def _agreeing_work(names: np.ndarray, layer_of: np.ndarray, layers: int, work: np.ndarray) -> float:
    """Work of the names whose occurrence count is the same in every layer but the last."""
    interior = (layer_of >= 0) & (layer_of < layers - 1)
    if not interior.any():
        return 0.0
    ids, inverse = np.unique(names[interior], return_inverse=True)
    per_layer = np.zeros((len(ids), layers - 1), dtype=np.int64)
    np.add.at(per_layer, (inverse, layer_of[interior]), 1)
    steady = (per_layer == per_layer[:, :1]).all(axis=1)
    return float(work[interior][steady[inverse]].sum())
