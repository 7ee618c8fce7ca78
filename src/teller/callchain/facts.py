"""The facts of one run that several stages read, computed from its call tree once.

The localizer, the root-cause model's features and the baselines all compare the same things:
each rank's work per step, its arrival at each collective, each iteration's batch. `RunFacts`
computes each of them on first use and keeps it, so a run's facts are computed once however many
methods read them: pass one `RunFacts` to every stage that takes it.

Two facts make comparisons possible without a model of the engine: with tensor parallelism every
rank runs the same operator sequence in every step, and a step's operator sequence repeats from
step to step. So a node is identified by its *key* (name, occurrence ordinal of that name within
its step on its rank), and the same key names the same operator instance on a peer rank in the same
step (horizontal reference) and in another step (temporal reference): `StepNodes`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

import numpy as np

from teller.callchain.kv_load import cached_tokens
from teller.callchain.steps import StepTable
from teller.callchain.tree import CallTree
from teller.ingest.schema import COMPUTE_CODES, GPU_WORK_CODES, HOST_WORK_CODES, LAYER_CODE

T = TypeVar("T")

#: Calls whose time is mostly waiting for the GPU or a peer, not host work.
WAITING_CALL = re.compile(
    r"""
    ynchronize      # cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize
    | Query         # cudaStreamQuery, cudaEventQuery: polling for the GPU
    | WaitEvent     # cudaStreamWaitEvent
    | Memcpy        # cudaMemcpy and its variants: blocking copies
    | wait_tensor   # functional collectives waiting for their result
    | c10d::wait    # a process group's Work.wait()
    """,
    re.IGNORECASE | re.VERBOSE,
)


def waiting_names(tree: CallTree) -> frozenset[int]:
    """Name ids of the calls that mostly wait (`WAITING_CALL`)."""
    return frozenset(i for i, name in enumerate(tree.names) if WAITING_CALL.search(name))


class StepKeyed:
    """Rows keyed by `iteration`, `rank` and `name` columns (int arrays of the subclass), found by
    binary search in an index built once: what a boolean mask over every row would select, without
    a scan per step."""

    iteration: np.ndarray
    rank: np.ndarray
    name: np.ndarray

    @cached_property
    def _by_step(self) -> RowIndex:
        return RowIndex(self.iteration)

    @cached_property
    def _by_key(self) -> RowIndex:
        return RowIndex(self.iteration, self.rank, self.name)

    def rows_in(self, iteration: int) -> np.ndarray:
        """Rows of `iteration`, ascending."""
        return self._by_step.rows(iteration)

    def rows_of(self, iteration: int, rank: int, name: int) -> np.ndarray:
        """Rows of one rank's `name` in `iteration`, ascending."""
        return self._by_key.rows(iteration, rank, name)


@dataclass(frozen=True)
class Arrivals(StepKeyed):
    """One row per (collective instance, rank) inside a step: when each rank reached the
    collective against its peers (an instance only one rank ran is never late nor last). Arrival
    is read on the GPU where collectives run there: host-side enqueue times say nothing about
    arrival on the GPU."""

    iteration: np.ndarray  # the step's iteration
    rank: np.ndarray  # int64
    name: np.ndarray  # int64 name id of the collective
    late_ns: np.ndarray  # float: arrival after the median of the others' arrivals, ≥ 0
    own_ns: np.ndarray  # float: the collective's own duration on this rank
    node: np.ndarray  # this rank's root node of the collective
    is_last: np.ndarray  # bool: the last rank to arrive (its own time has no waiting in it)
    instance: np.ndarray  # the collective instance (`CommInstances.instance`) the row belongs to
    start_ns: np.ndarray  # int64: when this rank reached the collective, on the run's one clock
    end_ns: np.ndarray  # int64: when the collective ended on this rank

    def __len__(self) -> int:
        return len(self.iteration)


class RowIndex:
    """Rows grouped by their values in some non-negative int columns, so that one group's rows
    (ascending, as a boolean mask would select them) are found by binary search instead of a
    scan over every row: per-step searches run once per step, and a scan each would make the
    run quadratic in its steps."""

    def __init__(self, *columns: np.ndarray) -> None:
        self.sizes = [int(np.asarray(c, dtype=np.int64).max(initial=0)) + 1 for c in columns]
        keys = packed_keys(*columns)
        order = np.argsort(keys, kind="stable")
        # held for the run's lifetime, one of each per row: half the bytes where they fit
        self.order = order.astype(narrowest(len(keys)))
        self.sorted_keys = keys[order].astype(narrowest(int(np.prod(self.sizes, dtype=float))))

    def rows(self, *values: int) -> np.ndarray:
        """The rows whose columns hold `values`, ascending (none for a value no row has)."""
        key = 0
        for size, value in zip(self.sizes, values, strict=True):
            if not 0 <= value < size:
                return self.order[:0]
            key = key * size + int(value)
        # the bounds in the keys' own dtype: searchsorted would otherwise copy every key to
        # the bounds' wider one, on every call
        bounds = np.array([key, key + 1], dtype=self.sorted_keys.dtype)
        lo, hi = np.searchsorted(self.sorted_keys, bounds)
        return self.order[lo:hi]


def arrivals_of(tree: CallTree) -> Arrivals | None:
    """The run's `Arrivals` (None without collectives)."""
    comm = tree.comm
    if not len(comm):
        return None
    use = np.ones(len(comm), dtype=bool)
    on_gpu = tree.stream[comm.node] >= 0
    if on_gpu.any():
        use &= on_gpu
    step = tree.step[comm.node]
    use &= step >= 0
    rows = np.flatnonzero(use)
    late = np.zeros(len(comm), dtype=np.int64)
    last = np.zeros(len(comm), dtype=bool)
    order = np.argsort(comm.instance[rows], kind="stable")
    rows = rows[order]
    boundaries = np.flatnonzero(np.diff(comm.instance[rows])) + 1
    for group in np.split(rows, boundaries):
        if len(group) < 2:
            continue
        starts = comm.start_ns[group]
        if not _one_meeting(starts, comm.end_ns[group]):
            continue
        last[group[np.argmax(starts)]] = True
        for k, row in enumerate(group.tolist()):
            others = np.delete(starts, k)
            late[row] = max(0, int(starts[k] - np.median(others)))
    kept = np.flatnonzero(use)
    return Arrivals(
        iteration=tree.steps.index[step[kept]],
        rank=comm.rank[kept].astype(np.int64),
        name=tree.name[comm.node[kept]].astype(np.int64),
        late_ns=late[kept].astype(float),
        own_ns=(comm.end_ns[kept] - comm.start_ns[kept]).astype(float),
        node=comm.node[kept],
        is_last=last[kept],
        instance=comm.instance[kept],
        start_ns=comm.start_ns[kept].astype(np.int64),
        end_ns=comm.end_ns[kept].astype(np.int64),
    )


def _one_meeting(starts: np.ndarray, ends: np.ndarray) -> bool:
    """Whether the ranks' spans of one collective instance can be one meeting: the peers wait
    inside the collective for the last to arrive, so every rank is still in it when the last
    one starts. Spans further apart than the longest of them (files of different jobs read as
    one run, or clocks the alignment could not join) would turn into arrivals days late."""
    return int(starts.max() - ends.min()) <= int((ends - starts).max())


@dataclass(frozen=True)
class StepWork:
    """Per step-table row (one rank's step): the work that rank did in it, in ns."""

    gpu_ns: np.ndarray  # kernels and copies on its streams, inclusive time
    host_ns: np.ndarray  # self time of its operators and runtime calls on the CPU
    #: the same, less the calls that mostly wait (`WAITING_CALL`): the localizer's host work
    host_without_waits_ns: np.ndarray
    comm_ns: np.ndarray  # its collectives' time, waiting for the peers included


def step_work(tree: CallTree, waiting: frozenset[int]) -> StepWork:
    """Each rank's `StepWork` per step; `waiting`: the name ids `host_without_waits_ns` leaves out."""
    count = len(tree.steps)
    in_step = tree.step >= 0
    gpu = in_step & np.isin(tree.layer, list(GPU_WORK_CODES)) & (tree.stream >= 0)
    host = in_step & np.isin(tree.layer, list(HOST_WORK_CODES)) & (tree.stream < 0)
    working = host & ~np.isin(tree.name, list(waiting))
    comm = in_step & (tree.layer == LAYER_CODE["comm"])
    return StepWork(
        gpu_ns=np.bincount(tree.step[gpu], weights=tree.dur[gpu], minlength=count),
        host_ns=np.bincount(tree.step[host], weights=tree.self_ns[host], minlength=count),
        host_without_waits_ns=np.bincount(
            tree.step[working], weights=tree.self_ns[working], minlength=count
        ),
        comm_ns=np.bincount(tree.step[comm], weights=tree.dur[comm], minlength=count),
    )


@dataclass(frozen=True)
class Iterations:
    """One row per iteration (the same step on every rank), in iteration order: what a method
    compares steps by.

    The duration is the slowest rank's and the batch is that same rank's: the ranks of one
    engine share a batch, but a run of several engine replicas (data parallelism, or replicas
    traced together) gives each its own, and a step is only slow against the batch it ran."""

    iteration: np.ndarray  # int64
    kind: np.ndarray  # object: the step kind (prefill, decode, mixed, ...), of the batch's rank
    dur_ns: np.ndarray  # float: the slowest rank's duration
    context_tokens: np.ndarray  # float, ≥ 0, the slowest rank's that states a batch
    generation_tokens: np.ndarray  # float, ≥ 0, that rank's
    cached_tokens: np.ndarray  # float, ≥ 0: the KV tokens its decodes read (`kv_load`), estimated
    ranks: list[list[int]]  # the ranks that ran it, ascending
    engine: np.ndarray  # int64: the engine whose iteration it is (`engines.py`); 0 in most runs

    def __len__(self) -> int:
        return len(self.iteration)


def iterations_of(tree: CallTree) -> Iterations:
    """The run's `Iterations`."""
    return iterations_of_steps(tree.steps)


def iterations_of_steps(steps: StepTable) -> Iterations:
    """The `Iterations` of a step table: a run's, or several engines' steps joined, each
    numbered as its run numbers it (`teller.callchain.split`)."""
    by_iteration: dict[int, list[int]] = {}
    for k in range(len(steps)):
        by_iteration.setdefault(int(steps.index[k]), []).append(k)
    ordered = sorted(by_iteration.items())
    duration = steps.dur_ns.astype(np.int64)
    known = (steps.context_tokens >= 0) | (steps.generation_tokens >= 0)
    slowest = [max(members, key=lambda k: duration[k]) for _, members in ordered]
    # the batch of the slowest rank that states one (ranks without an engine annotation do not)
    batch = [
        max([k for k in members if known[k]] or members, key=lambda k: duration[k])
        for _, members in ordered
    ]
    engine = np.array([int(steps.engine[members[0]]) for _, members in ordered], dtype=np.int64)
    rows = np.array(batch, dtype=np.int64)
    cached = np.zeros(len(rows))
    for one in np.unique(engine).tolist():
        mine = np.flatnonzero(engine == one)  # in iteration order
        cached[mine] = cached_tokens(
            steps.context_tokens[rows[mine]],
            steps.context_requests[rows[mine]],
            steps.generation_tokens[rows[mine]],
            steps.generation_requests[rows[mine]],
        )
    return Iterations(
        iteration=np.array([iteration for iteration, _ in ordered], dtype=np.int64),
        kind=np.array([steps.kind[k] for k in batch], dtype=object),
        dur_ns=np.array([float(duration[k]) for k in slowest], dtype=float),
        context_tokens=np.array([float(max(steps.context_tokens[k], 0)) for k in batch]),
        generation_tokens=np.array([float(max(steps.generation_tokens[k], 0)) for k in batch]),
        cached_tokens=cached,
        ranks=[sorted(int(steps.rank[k]) for k in members) for _, members in ordered],
        engine=engine,
    )


@dataclass(frozen=True)
class Setup:
    """A run's setup fingerprint: its rank count and the names of the operators and kernels that
    ran in its steps (the model, engine and kernels chosen)."""

    ranks: int
    names: frozenset[str]


def setup_of(tree: CallTree) -> Setup:
    """The run's `Setup`."""
    work = (tree.step >= 0) & np.isin(tree.layer, list(COMPUTE_CODES))
    names = frozenset(tree.names[n] for n in np.unique(tree.name[work]).tolist())
    return Setup(ranks=len(np.unique(tree.steps.rank)), names=names)


@dataclass
class StepNodes(StepKeyed):
    """The nodes that belong to steps, with their keys, in one flat set of arrays."""

    node: np.ndarray  # node index in the tree
    step: np.ndarray  # step-table row of the node's step
    iteration: np.ndarray  # rank-local step ordinal (the same iteration on every rank)
    rank: np.ndarray
    name: np.ndarray  # name id
    ordinal: np.ndarray  # occurrence of this name within (rank, iteration), in time order
    self_ns: np.ndarray
    layer: np.ndarray
    on_gpu: np.ndarray

    def largest(self, iteration: int, rank: int, name: int) -> int:
        """Position of the longest self-time node of `name` on `rank` in the step (the first
        of equals), -1 where the step has none."""
        where = self.rows_of(iteration, rank, name)
        return int(where[np.argmax(self.self_ns[where])]) if len(where) else -1


def step_nodes(tree: CallTree) -> StepNodes:
    """Every node inside a step, keyed by (name, ordinal) within its (rank, iteration)."""
    inside = np.flatnonzero(tree.step >= 0)
    order = np.lexsort(
        (
            tree.start[inside],
            tree.name[inside],
            tree.stream[inside] >= 0,
            tree.steps.index[tree.step[inside]],
            tree.rank[inside],
        )
    )
    inside = inside[order]
    iteration = tree.steps.index[tree.step[inside]]
    rank, name, on_gpu = tree.rank[inside], tree.name[inside], tree.stream[inside] >= 0
    # kept for the run's lifetime, a row per node in a step: int32 where the values fit
    rows = narrowest(len(tree.start))
    return StepNodes(
        node=inside.astype(rows),
        step=tree.step[inside].astype(narrowest(len(tree.steps))),
        iteration=iteration.astype(narrowest(int(iteration.max(initial=0)) + 1)),
        rank=rank,
        name=name,
        ordinal=run_ordinals(rank, iteration, name, on_gpu).astype(rows),
        self_ns=tree.self_ns[inside],
        layer=tree.layer[inside],
        on_gpu=on_gpu,
    )


def run_ordinals(*keys: np.ndarray) -> np.ndarray:
    """Position of each row within its run of equal keys (rows sorted by the keys)."""
    count = len(keys[0])
    if not count:
        return np.zeros(0, dtype=np.int64)
    same = np.ones(count - 1, dtype=bool)
    for key in keys:
        same &= key[1:] == key[:-1]
    run_start = np.concatenate([[0], np.flatnonzero(~same) + 1])
    run_id = np.cumsum(np.concatenate([[1], (~same).astype(np.int64)])) - 1
    return np.arange(count) - run_start[run_id]


def compute_totals(nodes: StepNodes) -> dict[tuple[int, int, int], float]:
    """(rank, name, iteration) → total self time of the compute nodes of that name there."""
    compute = np.isin(nodes.layer, list(COMPUTE_CODES))
    if not compute.any():
        return {}
    rank, name, iteration = nodes.rank[compute], nodes.name[compute], nodes.iteration[compute]
    unique, inverse = np.unique(packed_keys(rank, name, iteration), return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=nodes.self_ns[compute].astype(float))
    first = np.zeros(len(unique), dtype=np.int64)
    first[inverse.ravel()[::-1]] = np.arange(len(inverse) - 1, -1, -1)
    return {
        (int(r), int(n), int(i)): float(total)
        for r, n, i, total in zip(
            rank[first].tolist(),
            name[first].tolist(),
            iteration[first].tolist(),
            sums.tolist(),
            strict=True,
        )
    }


def narrowest(bound: int) -> type[np.signedinteger]:
    """int32 where every value below `bound` fits it, else int64."""
    return np.int32 if bound <= np.iinfo(np.int32).max else np.int64


def packed_keys(*columns: np.ndarray) -> np.ndarray:
    """One int64 per row that orders as the tuple of its non-negative columns does, so that a
    1-d unique or sort groups rows by several keys (`np.unique(axis=0)` is many times slower)."""
    packed = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:
        column = np.asarray(column, dtype=np.int64)
        packed = packed * (int(column.max(initial=0)) + 1) + column
    return packed


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


class RunFacts:
    """The facts of one run (`tree`), each computed on first use and kept."""

    def __init__(self, tree: CallTree, run_iterations: Iterations | None = None) -> None:
        self.tree = tree
        # where `tree` is one engine of a run analysed one engine at a time: the whole run's
        # iterations, over which the step models are fitted as the whole run's analysis fits
        # them (`teller.localize.step_model.score_steps`)
        self.run_iterations = run_iterations
        self._derived: dict[str, object] = {}

    def derived(self, name: str, compute: Callable[[], T]) -> T:
        """A later stage's own per-run table (the localizer's operator shifts, its candidate
        tables), computed on first use and kept here beside the facts, so every scoring of one
        run shares it however its thresholds differ. `compute` must depend on the tree alone."""
        if name not in self._derived:
            self._derived[name] = compute()
        return self._derived[name]  # type: ignore[return-value]

    def release(self, *names: str) -> None:
        """Forget the facts and derived tables of these `names`; a later use computes them
        again. Why: once every scoring of a run is done, its per-node tables (`step_nodes`, the
        localizer's candidate tables) are the largest things the analysis holds after the tree,
        and what comes next (the model's forward pass, which loads torch) reads none of them."""
        for name in names:
            self.__dict__.pop(name, None)
            self._derived.pop(name, None)

    @classmethod
    def of(cls, tree: CallTree, known: RunFacts | None = None) -> RunFacts:
        """`known` where the caller already has the tree's facts, else new ones."""
        if known is None:
            return cls(tree)
        if known.tree is not tree:
            raise ValueError("these facts belong to another run's tree")
        return known

    @cached_property
    def ranks(self) -> list[int]:
        """The ranks that ran steps, ascending."""
        return np.unique(self.tree.steps.rank).tolist()

    @cached_property
    def waiting(self) -> frozenset[int]:
        """Name ids of the calls that mostly wait (`WAITING_CALL`)."""
        return waiting_names(self.tree)

    @cached_property
    def arrivals(self) -> Arrivals | None:
        """When each rank reached each collective (`arrivals_of`); None without collectives."""
        return arrivals_of(self.tree)

    @cached_property
    def work(self) -> StepWork:
        """Each rank's GPU, host and comm work per step (`step_work`)."""
        return step_work(self.tree, self.waiting)

    @cached_property
    def iterations(self) -> Iterations:
        """One row per iteration: kind, slowest rank's time, batch, ranks (`iterations_of`)."""
        return iterations_of(self.tree)

    @cached_property
    def setup(self) -> Setup:
        """The run's setup fingerprint (`setup_of`)."""
        return setup_of(self.tree)

    @cached_property
    def step_nodes(self) -> StepNodes:
        """Every node inside a step, keyed (`step_nodes`)."""
        return step_nodes(self.tree)

    @cached_property
    def compute_totals(self) -> dict[tuple[int, int, int], float]:
        """(rank, name, iteration) → total self time of the compute nodes of that name there."""
        return compute_totals(self.step_nodes)

    @cached_property
    def kernel_sequences(self) -> dict[int, list[tuple[int, np.ndarray]]]:
        """Each rank's kernels per step, in launch order (`kernel_sequences`)."""
        return kernel_sequences(self.tree)
