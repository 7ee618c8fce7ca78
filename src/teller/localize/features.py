"""Per-step and per-node numbers the localizer (and the model) compare.

Two facts make comparisons possible without a model of the engine: with tensor parallelism every rank
runs the same operator sequence in every step, and a step's operator sequence repeats from step to
step. So a node is identified by its *key* — (name, occurrence ordinal of that name within its step
on its rank) — and the same key names the same operator instance on a peer rank in the same step
(horizontal reference) and in another step (temporal reference).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from teller.callchain.tree import CallTree
from teller.ingest.schema import LAYER_CODE

#: Layers whose self time is work a rank did itself (not waiting on a peer).
COMPUTE_LAYERS = frozenset(
    LAYER_CODE[n] for n in ("python", "cpu_op", "runtime", "kernel", "memcpy", "memset")
)
COMM_LAYER = LAYER_CODE["comm"]


@dataclass
class StepNodes:
    """The nodes that belong to steps, with their keys, in one flat set of arrays."""

    node: np.ndarray  # node index in the tree
    step: np.ndarray  # step-table row of the node's step
    iteration: np.ndarray  # rank-local step ordinal (the same iteration on every rank)
    rank: np.ndarray
    name: np.ndarray  # name id
    ordinal: np.ndarray  # occurrence of this name within (rank, iteration), in time order
    self_ns: np.ndarray
    dur_ns: np.ndarray
    layer: np.ndarray
    on_gpu: np.ndarray


def step_nodes(tree: CallTree) -> StepNodes:
    """Every node inside a step, keyed by (name, ordinal) within its (rank, iteration)."""
    inside = np.flatnonzero(tree.step >= 0)
    step = tree.step[inside]
    iteration = tree.steps.index[step]
    rank = tree.rank[inside]
    name = tree.name[inside]
    on_gpu = tree.stream[inside] >= 0
    order = np.lexsort((tree.start[inside], name, on_gpu, iteration, rank))
    inside, step, iteration, rank, name, on_gpu = (
        inside[order],
        step[order],
        iteration[order],
        rank[order],
        name[order],
        on_gpu[order],
    )
    ordinal = np.zeros(len(inside), dtype=np.int64)
    if len(inside):
        same = (
            (rank[1:] == rank[:-1])
            & (iteration[1:] == iteration[:-1])
            & (name[1:] == name[:-1])
            & (on_gpu[1:] == on_gpu[:-1])
        )
        run_start = np.concatenate([[0], np.flatnonzero(~same) + 1])
        run_id = np.cumsum(np.concatenate([[1], (~same).astype(np.int64)])) - 1
        ordinal = np.arange(len(inside)) - run_start[run_id]
    return StepNodes(
        node=inside,
        step=step,
        iteration=iteration,
        rank=rank,
        name=name,
        ordinal=ordinal,
        self_ns=tree.self_ns[inside],
        dur_ns=tree.dur[inside],
        layer=tree.layer[inside],
        on_gpu=on_gpu,
    )


def robust_z(values: np.ndarray, reference: np.ndarray, floor: float) -> np.ndarray:
    """(value − median) / (1.4826·MAD), with the scale floored so identical references still
    give finite, meaningful scores (`floor` in the values' own units)."""
    median = np.median(reference)
    mad = 1.4826 * np.median(np.abs(reference - median))
    return (values - median) / max(mad, floor)


def kernel_sequences(tree: CallTree) -> dict[int, list[tuple[int, np.ndarray]]]:
    """iteration → [(step row, its kernel rows in launch order)], one entry per rank's step.

    The ranks of a tensor-parallel group launch the same kernels in the same order, so kernel i
    of one rank's sequence compares with kernel i of the others' (slowdown shapes, substituted
    kernels). Kernels on a stream only; a step without kernels gets an empty sequence."""
    in_step = (tree.step >= 0) & (tree.layer == LAYER_CODE["kernel"]) & (tree.stream >= 0)
    rows = np.flatnonzero(in_step)
    rows = rows[np.lexsort((tree.start[rows], tree.step[rows]))]
    bounds = np.searchsorted(tree.step[rows], np.arange(len(tree.steps) + 1))
    out: dict[int, list[tuple[int, np.ndarray]]] = {}
    for k in range(len(tree.steps)):
        out.setdefault(int(tree.steps.index[k]), []).append((k, rows[bounds[k] : bounds[k + 1]]))
    return out
