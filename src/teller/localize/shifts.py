"""Persistent operator shifts: one operator on one rank slower than on its peers, step after step.

An operator that regressed on one rank (attention fallen back from the fused kernel to the math
path, a GEMM swapped for a slower one, a CUDA graph lost) may cost only a few percent of a step:
the step hides it in its noise, so the step-time scores of `localizer` never look at its operators.
The operator itself is unmistakable, though. Tensor-parallel ranks run the same operators on equal
shards, so in every step an operator's time on one rank is about its time on the peers; a regression
makes that ratio jump and *stay* up for as long as the fault lasts. Load spikes on a shared host
stretch random operators in single steps; a rolling median over `WINDOW` steps ignores those.

For each (rank, operator) the series of log(time / peers' time), per step, is compared with its own
median over the run (ranks are not perfectly symmetric: rank 0 may sample tokens); a step is shifted
when the rolling median stays `min_ratio` above that and far outside the series' spread, the
rank's own time shows most of that rise (`OWN_SHARE`: the peer that kept the fast kernel its
regressed peer lost is not shifted), and the operator's excess is large enough to matter. Within a step, a shifted node inside another shifted
node is the same slowdown seen one level down: the outermost one is named (`aten::scaled_dot_product_
attention` rather than the math kernels its fallback now calls). A new operator (absent on the
peers) is a shift too; so is one whose time grows on one rank only because it runs more often.

The reference is the run itself, so a regression that covers most of a run is not seen here (the
step models, fitted on normal runs, still see it when it slows the steps).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from teller.callchain.tree import CallTree
from teller.ingest.schema import GPU_WORK_CODES, HOST_WORK_CODES
from teller.localize.features import MAD_TO_SIGMA

#: Steps in the rolling median: a shift must hold for most of this many consecutive steps.
WINDOW = 5
#: Layers whose nodes can be shifted operators (Python frames contain everything; skip them).
SHIFT_LAYERS = HOST_WORK_CODES | GPU_WORK_CODES
#: Added to both sides of every time ratio: ratios of microsecond operators are noise.
RATIO_FLOOR_NS = 20_000.0
#: Smallest spread of a (rank, operator) log-ratio series.
MIN_SPREAD = 0.05
#: Share of a shift's rise against the peers that the rank's own time must show.
OWN_SHARE = 0.5


@dataclass
class OperatorShift:
    """One (rank, operator) shifted in one step, against its peers in that step."""

    iteration: int
    rank: int
    name: int  # name id in the tree
    observed_ns: int  # its total time in the step on this rank
    peers_ns: int  # the median of its totals on the peer ranks in the same step
    usual_ratio: float  # its usual time against the peers' over the run
    node: int  # its longest node in the step
    steps: int  # length of the shifted run of steps it belongs to
    excess_ns: float  # time beyond its peers', scaled by its usual ratio to them


def operator_shifts(
    tree: CallTree,
    min_ratio: float = 1.5,
    min_z: float = 6.0,
    min_excess_ns: float = 100_000.0,
    waiting: frozenset[int] = frozenset(),
) -> dict[int, list[OperatorShift]]:
    """Iteration → the shifted operators of that step, largest excess first (outermost only).

    `waiting` holds name ids of calls that mostly wait (syncs): a rank that waits longer is a
    symptom of a peer, not a shift of its own."""
    ranks = np.unique(tree.steps.rank)
    if len(ranks) < 2 or len(tree.steps) == 0:
        return {}
    keep = (tree.step >= 0) & np.isin(tree.layer, list(SHIFT_LAYERS))
    if waiting:
        keep &= ~np.isin(tree.name, list(waiting))
    rows = np.flatnonzero(keep)
    if not len(rows):
        return {}
    iteration_of_step = tree.steps.index
    iterations = np.unique(iteration_of_step)
    it_pos = {int(it): i for i, it in enumerate(iterations.tolist())}
    rank_pos = {int(r): j for j, r in enumerate(ranks.tolist())}
    names = np.unique(tree.name[rows])
    name_pos = {int(n): k for k, n in enumerate(names.tolist())}
    it_index = np.array([it_pos[int(i)] for i in iteration_of_step[tree.step[rows]].tolist()])
    rank_index = np.array([rank_pos[int(r)] for r in tree.rank[rows].tolist()])
    name_index = np.array([name_pos[int(n)] for n in tree.name[rows].tolist()])
    # total inclusive time per (iteration, rank, name); NaN where the rank ran no step there
    totals = np.zeros((len(iterations), len(ranks), len(names)))
    np.add.at(totals, (it_index, rank_index, name_index), tree.dur[rows].astype(float))
    present = np.zeros((len(iterations), len(ranks)), dtype=bool)
    present[
        [it_pos[int(i)] for i in iteration_of_step.tolist()],
        [rank_pos[int(r)] for r in tree.steps.rank.tolist()],
    ] = True
    totals[~present] = np.nan
    flagged: dict[int, list[OperatorShift]] = {}
    for j in range(len(ranks)):
        others = [k for k in range(len(ranks)) if k != j]
        with warnings.catch_warnings():  # a step no peer ran is NaN, by design, not a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            peers = np.nanmedian(totals[:, others, :], axis=1)  # (iterations, names)
        own = totals[:, j, :]
        valid = np.isfinite(own) & np.isfinite(peers)
        log_ratio = np.log((own + RATIO_FLOOR_NS) / (peers + RATIO_FLOOR_NS))
        for k in range(len(names)):
            series_rows = np.flatnonzero(valid[:, k])
            if len(series_rows) < 2 * WINDOW:
                continue
            series = log_ratio[series_rows, k]
            usual = float(np.median(series))
            # spread from step-to-step differences: a level shift lasting many steps (the fault)
            # adds two outliers there, where it would inflate the spread around the median
            spread = max(
                MAD_TO_SIGMA * float(np.median(np.abs(np.diff(series)))) / np.sqrt(2), MIN_SPREAD
            )
            lift = _rolling_median(series, WINDOW) - usual
            # the rank's own time must have grown, by most of the ratio's rise: an operator its
            # peer stopped running (the fast kernel the regressed rank lost) is not slower where
            # it still runs, even when noise lifts its own time a little
            own_log = np.log(own[series_rows, k] + RATIO_FLOOR_NS)
            own_lift = _rolling_median(own_log, WINDOW) - float(np.median(own_log))
            shifted = (
                (lift >= np.log(min_ratio))
                & (lift >= min_z * spread)
                & (own_lift >= np.log(1.0 + (min_ratio - 1.0) / 2))
                & (own_lift >= OWN_SHARE * lift)
            )
            excess = own[series_rows, k] - np.exp(usual) * peers[series_rows, k]
            shifted &= _rolling_median(excess, WINDOW) >= min_excess_ns
            for start, stop in _runs(shifted):
                if stop - start < WINDOW:
                    continue
                for position in range(start, stop):
                    row = series_rows[position]
                    if excess[position] <= 0:
                        continue
                    iteration = int(iterations[row])
                    flagged.setdefault(iteration, []).append(
                        OperatorShift(
                            iteration=iteration,
                            rank=int(ranks[j]),
                            name=int(names[k]),
                            observed_ns=int(own[row, k]),
                            peers_ns=int(peers[row, k]),
                            usual_ratio=float(np.exp(usual)),
                            node=-1,
                            steps=stop - start,
                            excess_ns=float(excess[position]),
                        )
                    )
    if not flagged:
        return {}
    # every step's nodes, found once: the clean-up below looks at a few steps' nodes many times
    in_steps = np.flatnonzero(tree.step >= 0)
    node_iteration = iteration_of_step[tree.step[in_steps]]
    order = np.argsort(node_iteration, kind="stable")
    in_steps, node_iteration = in_steps[order], node_iteration[order]

    def nodes_of(iteration: int) -> np.ndarray:
        low, high = np.searchsorted(node_iteration, [iteration, iteration + 1])
        return in_steps[low:high]

    return {it: _outermost(tree, found, nodes_of(it)) for it, found in flagged.items()}


def _rolling_median(values: np.ndarray, window: int) -> np.ndarray:
    """Centred rolling median; the edges use the part of the window that exists."""
    half = window // 2
    count = len(values)
    out = np.empty(count, dtype=np.float64)
    full = window if window % 2 else window + 1  # the centred window: half on either side
    if count >= full:
        out[half : count - half] = np.median(sliding_window_view(values, full), axis=1)
        edges = [*range(half), *range(count - half, count)]
    else:
        edges = list(range(count))
    for i in edges:
        out[i] = np.median(values[max(0, i - half) : i + half + 1])
    return out


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of every run of True."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return list(zip(starts.tolist(), stops.tolist(), strict=True))


def _outermost(
    tree: CallTree, found: list[OperatorShift], step_nodes: np.ndarray
) -> list[OperatorShift]:
    """Drop shifts whose nodes all sit inside another shifted operator's nodes on the same rank
    and step (`step_nodes`: the step's nodes on every rank); give each survivor its longest node;
    largest excess first."""
    ranks, names = tree.rank[step_nodes], tree.name[step_nodes]
    shifted_names = {(s.rank, s.name) for s in found}
    kept = []
    for shift in found:
        nodes = step_nodes[(ranks == shift.rank) & (names == shift.name)]
        if not len(nodes):
            continue
        inside_other = all(
            _has_shifted_ancestor(
                tree, int(n), shift.rank, shifted_names - {(shift.rank, shift.name)}
            )
            for n in nodes.tolist()
        )
        if inside_other:
            continue
        shift.node = int(nodes[np.argmax(tree.dur[nodes])])
        if shift.peers_ns == 0:
            _name_the_caller(tree, shift, step_nodes)
        kept.append(shift)
    merged: dict[tuple[int, int], OperatorShift] = {}
    for shift in kept:  # a caller named twice (two new callees) is one shift
        merged.setdefault((shift.rank, shift.name), shift)
    return sorted(merged.values(), key=lambda s: -s.excess_ns)


def _name_the_caller(tree: CallTree, shift: OperatorShift, step_nodes: np.ndarray) -> None:
    """A new operator called by an operator of the same layer that the peers also run is an
    implementation switch inside that caller (attention falling back to its math path): the caller
    is what the user's code called and what the peers can be compared on, so it is named."""
    parent = int(tree.parent[shift.node])
    if parent < 0 or tree.layer[parent] != tree.layer[shift.node]:
        return
    name = int(tree.name[parent])
    callers = step_nodes[tree.name[step_nodes] == name]
    step_ranks = np.unique(tree.steps.rank[tree.steps.index == shift.iteration]).tolist()
    peer_totals = [
        float(tree.dur[callers[tree.rank[callers] == r]].sum())
        for r in step_ranks
        if r != shift.rank
    ]
    if not any(peer_totals):
        return
    shift.name, shift.node = name, parent
    shift.observed_ns = int(tree.dur[callers[tree.rank[callers] == shift.rank]].sum())
    shift.peers_ns = int(np.median(peer_totals))
    shift.usual_ratio = 1.0  # the caller's own usual ratio is unknown here; peers are the norm
    # the new callee's whole time is excess; the caller's comparison can only show more
    shift.excess_ns = max(shift.excess_ns, shift.observed_ns - shift.peers_ns)


def _has_shifted_ancestor(
    tree: CallTree, node: int, rank: int, names: set[tuple[int, int]]
) -> bool:
    current = int(tree.parent[node])
    while current >= 0:
        if (rank, int(tree.name[current])) in names:
            return True
        current = int(tree.parent[current])
    return False
