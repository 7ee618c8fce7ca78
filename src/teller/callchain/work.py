"""Per-node facts that tell an iteration from any other stretch of a trace.

When no annotation names the steps, teller has to decide which repeating stretch of a trace is
the iteration (a training step, a serving engine's scheduler step) rather than a part of one (a
decoder layer, the optimizer). Three facts decide it, all cheap per node:

* **the work it holds**: iterations together hold most of the rank's GPU time (on a CPU-only
  rank, of its top-level operators' time); a range around the optimizer or one module does not.
  Kernels and collectives are work; copies are not (loading the weights before the loop can take
  the GPU longer than every iteration after it).
* **how it ends**: an iteration of a loop closes with its results back on the host or the
  weights updated: a copy to the host, a host wait on the device (a stream synchronisation,
  `.item()`), or the optimizer's step (PyTorch's `Optimizer.step#…` range). A decoder layer,
  repeated just as regularly inside one forward, does none of these. Copies *into* the device do
  not count: FSDP with offloading and weight prefetching copy in every layer. They mark where an
  iteration begins instead (`copy_in`).
* **whether the device worked in it**: a stretch in which the GPU was busy for almost none of
  its time is host work (CUDA graph capture, compilation), not an iteration to diagnose.

`top` names each node's top-level host operation (an operator, runtime call or host collective
with no such ancestor; Python frames and annotations are see-through): the units whose sequence
the period finder reads, and through which every node below one joins that unit's step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from teller.ingest.schema import LAYER_CODE

#: Host-side work: the nodes whose outermost instances make up the top-level sequence.
HOST_OP_CODES = frozenset(LAYER_CODE[n] for n in ("cpu_op", "runtime", "comm"))
#: GPU activity that is the device's work (a collective's time is mostly waiting, but it is time
#: the iteration holds the device).
GPU_WORK_CODES = frozenset(LAYER_CODE[n] for n in ("kernel", "comm"))
#: Names of nodes that bring results back to the host or block the host on the device.
CLOSING_NAME = re.compile(
    r"""
    ^Memcpy\ DtoH\b                          # a copy out (Kineto's and the nsys reader's names)
    | ^(?:cuda|hip|cu)\w*Synchronize\b       # cudaStreamSynchronize, hipDeviceSynchronize, …
    | ^aten::(?:item|_local_scalar_dense)$   # a tensor read back to Python
    """,
    re.VERBOSE,
)
#: The range PyTorch's optimizers record around their step: everything under it updates weights.
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
#: A GPU-side wait (cudaStreamWaitEvent): recorded as a sync, but the host does not wait.
DEVICE_SIDE_WAIT = "Stream Wait Event"
#: A copy of inputs into the device: where a loop's iteration begins.
COPY_IN_NAME = re.compile(r"^Memcpy HtoD\b")
#: The usual iteration keeps its rank's GPU busy for at least this share of its time.
MIN_GPU_BUSY = 0.02


class Forest(Protocol):
    """The columns of a call-chain forest that step finding reads (`tree.CallTree` has them)."""

    names: list[str]
    name: np.ndarray
    layer: np.ndarray
    rank: np.ndarray
    stream: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    child_offsets: np.ndarray
    child_index: np.ndarray

    def __len__(self) -> int: ...

    def node_name(self, node: int) -> str: ...


@dataclass
class NodeWork:
    """What each node of a forest contributes to the question "is this stretch an iteration"."""

    work_ns: np.ndarray  # the node's own work: GPU activity, or a top-level op on a CPU-only rank
    closes: np.ndarray  # bool: a copy to the host, a host wait, or part of the optimizer's step
    copy_in: np.ndarray  # bool: a host→device copy
    top: np.ndarray  # the node's top-level host operation (itself included), -1 for none
    levels: list[np.ndarray]  # node ids by depth, to pass ownership from parents to children
    rank_has_gpu: dict[int, bool]

    def owners(self, parent: np.ndarray, owner: np.ndarray) -> np.ndarray:
        """`owner` (-1 = none) passed down to every descendant that has none of its own."""
        return _pass_down(self.levels, parent, owner)


def node_work(
    names: list[str],
    name: np.ndarray,
    layer: np.ndarray,
    rank: np.ndarray,
    stream: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    depth: np.ndarray,
) -> NodeWork:
    on_gpu = stream >= 0
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(int(depth.max(initial=0)) + 2))
    levels = [order[bounds[d] : bounds[d + 1]] for d in range(len(bounds) - 1)]

    closes = _names_matching(names, CLOSING_NAME)[name]
    sync = layer == LAYER_CODE["sync"]
    if sync.any() and DEVICE_SIDE_WAIT in names:
        sync &= name != names.index(DEVICE_SIDE_WAIT)
    optimizer = _names_matching(names, OPTIMIZER_STEP)[name]
    if optimizer.any():
        marked = np.where(optimizer, np.arange(len(parent)), -1)
        optimizer = _pass_down(levels, parent, marked) >= 0
    closes |= sync | optimizer

    gpu_work = on_gpu & np.isin(layer, list(GPU_WORK_CODES))
    host_op = ~on_gpu & np.isin(layer, list(HOST_OP_CODES))
    top = np.full(len(parent), -1, dtype=np.int64)
    for nodes in levels:
        inherited = np.where(parent[nodes] >= 0, top[np.maximum(parent[nodes], 0)], -1)
        top[nodes] = np.where((inherited < 0) & host_op[nodes], nodes, inherited)

    work_ns = np.where(gpu_work, dur, 0).astype(np.int64)
    rank_has_gpu: dict[int, bool] = {}
    for r in np.unique(rank).tolist():
        mine = rank == r
        rank_has_gpu[r] = bool(gpu_work[mine].any())
        if not rank_has_gpu[r]:  # a CPU-only rank: its operators' time is its work
            tops = mine & (top == np.arange(len(top)))
            work_ns[tops] = dur[tops]
    return NodeWork(
        work_ns=work_ns,
        closes=closes,
        copy_in=_names_matching(names, COPY_IN_NAME)[name],
        top=top,
        levels=levels,
        rank_has_gpu=rank_has_gpu,
    )


def _names_matching(names: list[str], pattern: re.Pattern[str]) -> np.ndarray:
    return np.fromiter((bool(pattern.search(n)) for n in names), dtype=bool, count=len(names))


def _pass_down(levels: list[np.ndarray], parent: np.ndarray, owner: np.ndarray) -> np.ndarray:
    owner = owner.copy()
    for nodes in levels[1:]:
        inherited = owner[parent[nodes]]
        unset = owner[nodes] < 0
        owner[nodes[unset]] = inherited[unset]
    return owner
