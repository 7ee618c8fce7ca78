"""Build call-chain trees from an event table: nesting, launches, steps and collective instances.

A tree is columns, not objects (DESIGN.md §2): `parent`, `depth`, `layer`, `name`, `rank`, `start`,
`dur`, `self` arrays over the event table's call-chain rows, with three kinds of edge:

* *call*: an event nested inside another on the same CPU thread (or GPU annotation on a stream);
* *launch*: a runtime call → the GPU work it launched, by correlation id (a CUDA/HIP graph launch
  shares its id with every kernel it replays, so it fans out naturally);
* *comm*: the same collective instance on every rank of its group (`CommInstances`).

Node order puts every parent before its children, so depth, step membership and self time are
one pass each. One function builds it all and keeps one stack per (rank, pid, tid).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from teller.callchain.engines import EnginePlace, StepNumbering
from teller.callchain.steps import StepTable, find_steps
from teller.ingest.comm_names import collective_kind
from teller.ingest.schema import LAYER_CODE, LAYERS, TREE_LAYERS, EventTable, SourceInfo

#: Real Kineto files round start and duration separately (to µs, or ns in "ns" files), so a child
#: can end up to a rounding step after its parent. Ends within this much still nest.
NESTING_TOLERANCE_NS = 1_000

EDGE_ROOT, EDGE_CALL, EDGE_LAUNCH = 0, 1, 2
EDGE_KINDS = ("root", "call", "launch")


@dataclass
class CommInstances:
    """One row per (collective instance, rank): the comm edges of the horizontal view.

    `instance` numbers the collective instances of the run; all rows with one instance number are
    the same collective seen from each rank, and `node` is that rank's root node of it.
    """

    instance: np.ndarray
    rank: np.ndarray
    node: np.ndarray
    kind: list[str]
    group: list[str]
    seq: np.ndarray
    bytes: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.instance)

    @property
    def num_instances(self) -> int:
        return int(self.instance.max()) + 1 if len(self.instance) else 0

    # Built on first use and kept: every step's slice asks which of its nodes are collective
    # members and who arrived last, and sorting the whole run's table for each step would grow
    # as steps × collectives.
    @cached_property
    def last_arrival(self) -> np.ndarray:
        """Per instance: the row of its member that arrived last (the latest start; of equal
        starts, the last row)."""
        by_start = np.lexsort((self.start_ns, self.instance))
        last = np.full(self.num_instances, -1, dtype=np.int64)
        last[self.instance[by_start]] = by_start  # later rows overwrite: latest start wins
        return last

    @cached_property
    def rows_by_node(self) -> np.ndarray:
        """Row numbers in the order of their nodes (rows of one node in row order)."""
        return np.argsort(self.node, kind="stable")

    @cached_property
    def sorted_nodes(self) -> np.ndarray:
        """`node` in `rows_by_node`'s order, for searching."""
        return self.node[self.rows_by_node]

    def rows_of_nodes(self, nodes: np.ndarray) -> np.ndarray:
        """The rows whose node is one of `nodes` (ascending, distinct), in node order, rows of
        one node in row order."""
        low = np.searchsorted(self.sorted_nodes, nodes, "left")
        counts = np.searchsorted(self.sorted_nodes, nodes, "right") - low
        if not counts.any():
            return np.zeros(0, dtype=np.int64)
        starts = np.repeat(low - np.cumsum(counts) + counts, counts)
        return self.rows_by_node[starts + np.arange(int(counts.sum()))]

    def to_arrow(self) -> pa.Table:
        return pa.table(
            {
                "instance": self.instance,
                "rank": self.rank,
                "node": self.node,
                "kind": self.kind,
                "group": self.group,
                "seq": self.seq,
                "bytes": self.bytes,
                "start_ns": self.start_ns,
                "end_ns": self.end_ns,
            }
        )


@dataclass
class CallTree:
    """Call-chain forest of a run: struct-of-arrays, one entry per node, parents before children."""

    row: np.ndarray  # index of the node's row in the event table
    parent: np.ndarray  # -1 for roots
    edge: np.ndarray  # EDGE_* kind of the edge to the parent
    depth: np.ndarray
    layer: np.ndarray  # codes into LAYERS
    name: np.ndarray  # ids into `names`
    rank: np.ndarray
    stream: np.ndarray  # -1 on the CPU
    start: np.ndarray  # ns
    dur: np.ndarray  # inclusive ns
    self_ns: np.ndarray  # dur minus the call-children's durations
    step: np.ndarray  # index into `steps`, -1 outside any step
    names: list[str]
    steps: StepTable
    comm: CommInstances
    child_offsets: np.ndarray = field(repr=False)
    child_index: np.ndarray = field(repr=False)
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.parent)

    def children(self, node: int) -> np.ndarray:
        return self.child_index[self.child_offsets[node] : self.child_offsets[node + 1]]

    def roots(self) -> np.ndarray:
        return np.flatnonzero(self.parent < 0)

    def node_name(self, node: int) -> str:
        return self.names[self.name[node]]

    def layer_name(self, node: int) -> str:
        return LAYERS[self.layer[node]]

    def to_arrow(self) -> pa.Table:
        return pa.table(
            {
                "row": self.row,
                "parent": self.parent,
                "edge": pa.DictionaryArray.from_arrays(
                    pa.array(self.edge, pa.int8()), pa.array(EDGE_KINDS)
                ),
                "depth": self.depth,
                "layer": pa.DictionaryArray.from_arrays(
                    pa.array(self.layer, pa.int8()), pa.array(LAYERS)
                ),
                "name": pa.DictionaryArray.from_arrays(
                    pa.array(self.name, pa.int32()), pa.array(self.names, pa.string())
                ),
                "rank": self.rank,
                "stream": self.stream,
                "start_ns": self.start,
                "dur_ns": self.dur,
                "self_ns": self.self_ns,
                "step": self.step,
            }
        )


@dataclass
class CommRoots:
    """Per collective root node of a forest (its outermost comm node, or a GPU collective
    kernel): what any node inside it says of the collective, or None / -1 where none does."""

    node: np.ndarray
    kind: list[str | None]
    group: list[str | None]
    seq: np.ndarray
    bytes: np.ndarray


@dataclass
class RankForest:
    """One trace file's part of the call-chain forest: its nodes nested, launched and sorted as
    `build_tree` sorts them, with the facts of its collectives, before any rank is joined.

    Ranks are independent until the horizontal join (DESIGN.md §6), so each file's forest is
    built where the file was read (`teller.callchain.per_rank`) and only these arrays cross to
    the process that joins them; `row` is the node's row in the file's own table."""

    row: np.ndarray
    parent: np.ndarray
    edge: np.ndarray
    layer: np.ndarray
    name: np.ndarray  # ids into `names`
    rank: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    stream: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    names: list[str]
    table_rows: int  # rows of the file's table: where the next file's rows start
    overlaps: int  # CPU events placed as siblings though they overlapped beyond the tolerance
    unlaunched: int  # GPU activities with no launching runtime call in the file
    comm: CommRoots

    def __len__(self) -> int:
        return len(self.parent)


@dataclass
class FileForest:
    """One file's forest with what the file said about itself."""

    path: Path  # the trace file it was read from
    forest: RankForest
    sources: list[SourceInfo]
    traced_pids: frozenset[int]  # the host process ids the file recorded
    span: tuple[int, int] | None  # when its events begin and end (ns)


def build_tree(events: EventTable, step_regex: str | re.Pattern[str] | None = None) -> CallTree:
    """Build the call-chain forest of every rank in `events`.

    `step_regex` overrides the built-in step annotations (ProfilerStep#N, vLLM execute_…, SGLang
    step[…]): any engine-layer node whose name matches it is a step. Without either, steps come
    from repeated ranges or the period of the top-level sequence (`steps.py`).
    """
    return join_forests([forest_of(events)], step_regex)


def forest_of(events: EventTable) -> RankForest:
    """The nodes of one table (a file's, or a whole run's) nested, launched and sorted."""
    table = events.table
    layer_codes = table.column("layer").combine_chunks().indices.to_numpy().astype(np.int8)
    tree_codes = np.array([LAYER_CODE[name] for name in TREE_LAYERS], dtype=np.int8)
    selected = np.flatnonzero(np.isin(layer_codes, tree_codes))

    def col(name: str) -> np.ndarray:
        return table.column(name).to_numpy()[selected]

    rank, pid, tid = col("rank"), col("pid"), col("tid")
    stream = col("stream")
    start, dur = col("ts_ns"), col("dur_ns")
    correlation, external = col("correlation"), col("external_id")
    layer = layer_codes[selected]
    names_column = table.column("name").combine_chunks()
    names = names_column.dictionary.to_pylist()
    name = names_column.indices.to_numpy(zero_copy_only=False)[selected]

    on_gpu = stream >= 0
    # CPU rows first, grouped by thread, in time order, outer before inner; then GPU rows.
    order = np.lexsort((layer, -dur, start, tid, pid, rank, on_gpu))
    count = len(order)
    rank, pid, tid, stream = rank[order], pid[order], tid[order], stream[order]
    start, dur, layer, name = start[order], dur[order], layer[order], name[order]
    correlation, external, on_gpu = correlation[order], external[order], on_gpu[order]
    rows = selected[order]

    parent = np.full(count, -1, dtype=np.int64)
    edge = np.zeros(count, dtype=np.int8)
    num_cpu = int(np.count_nonzero(~on_gpu))
    overlaps = _nest_cpu(rank, pid, tid, start, dur, parent, edge, num_cpu)
    unlaunched = _attach_gpu(
        rank, layer, correlation, external, start, dur, stream, parent, edge, num_cpu, name, names
    )
    return RankForest(
        row=rows,
        parent=parent,
        edge=edge,
        layer=layer,
        name=name.astype(np.int32),
        rank=rank.astype(np.int32),
        pid=pid,
        tid=tid,
        stream=stream.astype(np.int32),
        start=start,
        dur=dur,
        names=names,
        table_rows=table.num_rows,
        overlaps=overlaps,
        unlaunched=unlaunched,
        comm=_comm_roots(parent, edge, layer, stream, rows, table),
    )


def join_forests(
    forests: list[RankForest],
    step_regex: str | re.Pattern[str] | None = None,
    place: EnginePlace | None = None,
    numbering: StepNumbering | None = None,
) -> CallTree:
    """The run's call-chain forest from its files' forests, in file order: nodes in the order
    one table of all the files would give them (CPU rows first, by rank, thread and time, then
    GPU rows), names as one symbol table, then steps and collective instances across ranks.

    The forests' node arrays are taken: each is emptied once its joined array is built, so the
    join holds the run's nodes about once, not once in the forests and again in the tree.
    `place`: the forests are one engine of a larger run, `numbering`: one time window of one
    (`find_steps`)."""
    names, name_maps = _joined_names([f.names for f in forests])
    row_base = np.cumsum([0] + [f.table_rows for f in forests[:-1]])
    node_base = np.cumsum([0] + [len(f) for f in forests[:-1]])

    def taken(
        field: str, each: Callable[[np.ndarray, int], np.ndarray] | None = None
    ) -> np.ndarray:
        parts = []
        for index, forest in enumerate(forests):
            array = getattr(forest, field)
            parts.append(array if each is None else each(array, index))
            setattr(forest, field, array[:0].copy())
        return np.concatenate(parts)

    rank, pid, tid, stream = taken("rank"), taken("pid"), taken("tid"), taken("stream")
    start, dur, layer = taken("start"), taken("dur"), taken("layer")
    name = taken("name", lambda ids, i: name_maps[i][ids])
    rows = taken("row", lambda row, i: row + row_base[i])
    parent = taken("parent", lambda up, i: np.where(up >= 0, up + node_base[i], -1))
    edge = taken("edge")
    if len(forests) > 1:  # one file is already in this order
        order = np.lexsort((layer, -dur, start, tid, pid, rank, stream >= 0))
        del pid, tid
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        rank, stream, start, dur = rank[order], stream[order], start[order], dur[order]
        layer, name, rows, edge = layer[order], name[order], rows[order], edge[order]
        parent = parent[order]
        parent = np.where(parent >= 0, position[np.maximum(parent, 0)], -1)
        del order
    else:
        position = np.arange(len(rank))
        del pid, tid
    count = len(rank)

    warnings: list[str] = []
    overlaps = sum(f.overlaps for f in forests)
    if overlaps:
        warnings.append(
            f"{overlaps} CPU events overlap a sibling beyond {NESTING_TOLERANCE_NS} ns "
            "and were placed as siblings"
        )
    unlaunched = sum(f.unlaunched for f in forests)
    if unlaunched:
        warnings.append(
            f"{unlaunched} GPU activities have no launching runtime call in the trace "
            "(launched before the profiling window or by an untraced thread)"
        )

    depth = depths_of(parent)
    call_child = (parent >= 0) & (edge == EDGE_CALL)
    self_ns = dur.copy()
    np.subtract.at(self_ns, parent[call_child], dur[call_child])
    np.maximum(self_ns, 0, out=self_ns)

    child_offsets, child_index = _children_csr(parent)
    tree = CallTree(
        row=rows,
        parent=parent,
        edge=edge,
        depth=depth,
        layer=layer,
        name=name.astype(np.int32),
        rank=rank.astype(np.int32),
        stream=stream.astype(np.int32),
        start=start,
        dur=dur,
        self_ns=self_ns,
        step=np.full(count, -1, dtype=np.int64),
        names=names,
        steps=StepTable.empty(),
        comm=_empty_comm(),
        child_offsets=child_offsets,
        child_index=child_index,
        warnings=warnings,
    )
    tree.steps, tree.step, step_notes = find_steps(
        tree, step_regex=step_regex, place=place, numbering=numbering
    )
    warnings.extend(step_notes)
    roots = _joined_roots(forests, node_base, position)
    tree.comm = _comm_instances(tree, roots)
    return tree


def _joined_names(each: list[list[str]]) -> tuple[list[str], list[np.ndarray]]:
    """One symbol table for the files' names, in the order Arrow unifies dictionaries (each
    file's names in order, the ones not seen before appended), and each file's id map."""
    index: dict[str, int] = {}
    maps = []
    for names in each:
        maps.append(np.asarray([index.setdefault(n, len(index)) for n in names], dtype=np.int32))
    return list(index), maps


def _joined_roots(
    forests: list[RankForest], node_base: np.ndarray, position: np.ndarray
) -> CommRoots:
    """The forests' collective roots with the joined tree's node ids, in node order."""
    node = np.concatenate(
        [f.comm.node + base for f, base in zip(forests, node_base, strict=True)]
    ).astype(np.int64)
    node = position[node] if len(node) else node
    order = np.argsort(node, kind="stable")
    kind = [k for f in forests for k in f.comm.kind]
    group = [g for f in forests for g in f.comm.group]
    return CommRoots(
        node=node[order],
        kind=[kind[i] for i in order.tolist()],
        group=[group[i] for i in order.tolist()],
        seq=np.concatenate([f.comm.seq for f in forests])[order],
        bytes=np.concatenate([f.comm.bytes for f in forests])[order],
    )


def _nest_cpu(
    rank: np.ndarray,
    pid: np.ndarray,
    tid: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    edge: np.ndarray,
    num_cpu: int,
) -> int:
    """Nest CPU events per thread with one stack, tolerating rounding overlaps; returns how many
    events overlapped a sibling beyond the tolerance. Rows are grouped by thread, in time order,
    outer before inner (`build_tree`'s sort)."""
    return int(
        _nest_cpu_rows(
            rank, pid, tid, start, dur, parent, edge, num_cpu, NESTING_TOLERANCE_NS, EDGE_CALL
        )
    )


@njit(cache=True)
def _nest_cpu_rows(rank, pid, tid, start, dur, parent, edge, num_cpu, tolerance, edge_call):
    """`_nest_cpu`'s loop, compiled: one pass, one stack per thread (a run has millions of CPU
    events, and the loop in Python was the tree build's largest cost)."""
    overlaps = 0
    stack = np.empty(max(num_cpu, 1), dtype=np.int64)
    top = 0
    for i in range(num_cpu):
        if i == 0 or rank[i] != rank[i - 1] or pid[i] != pid[i - 1] or tid[i] != tid[i - 1]:
            top = 0
        s = start[i]
        e = s + dur[i]
        while top > 0:
            above = stack[top - 1]
            above_end = start[above] + dur[above]
            if s >= above_end:
                top -= 1
            elif e > above_end + tolerance:
                overlaps += 1
                top -= 1
            else:
                break
        if top > 0:
            parent[i] = stack[top - 1]
            edge[i] = edge_call
        stack[top] = i
        top += 1
    return overlaps


@njit(cache=True)
def depths_of(parent):
    """Each node's depth in a forest whose parents precede their children (a tree, a slice, a
    token forest): one pass."""
    depth = np.zeros(len(parent), dtype=np.int32)
    for i in range(len(parent)):
        if parent[i] >= 0:
            depth[i] = depth[parent[i]] + 1
    return depth


def _attach_gpu(
    rank: np.ndarray,
    layer: np.ndarray,
    correlation: np.ndarray,
    external: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    stream: np.ndarray,
    parent: np.ndarray,
    edge: np.ndarray,
    num_cpu: int,
    name: np.ndarray,
    names: list[str],
) -> int:
    """Launch edges by correlation id; GPU annotations hang under their CPU annotation."""
    runtime_code, engine_code = LAYER_CODE["runtime"], LAYER_CODE["engine"]
    launcher: dict[tuple[int, int], int] = {}
    annotation: dict[tuple[int, int, int], int] = {}
    cpu_rank, cpu_layer = rank[:num_cpu].tolist(), layer[:num_cpu].tolist()
    cpu_corr, cpu_ext, cpu_name = (
        correlation[:num_cpu].tolist(),
        external[:num_cpu].tolist(),
        name[:num_cpu].tolist(),
    )
    for i in range(num_cpu):
        if cpu_layer[i] == runtime_code and cpu_corr[i] >= 0:
            launcher.setdefault((cpu_rank[i], cpu_corr[i]), i)
        elif cpu_layer[i] == engine_code and cpu_ext[i] >= 0:
            annotation.setdefault((cpu_rank[i], cpu_name[i], cpu_ext[i]), i)
    unlaunched = 0
    gpu_rank, gpu_layer = rank[num_cpu:].tolist(), layer[num_cpu:].tolist()
    gpu_corr, gpu_ext, gpu_name = (
        correlation[num_cpu:].tolist(),
        external[num_cpu:].tolist(),
        name[num_cpu:].tolist(),
    )
    for k in range(len(gpu_rank)):
        i = num_cpu + k
        if gpu_layer[k] == engine_code:
            p = annotation.get((gpu_rank[k], gpu_name[k], gpu_ext[k]), -1)
        else:
            p = launcher.get((gpu_rank[k], gpu_corr[k]), -1) if gpu_corr[k] >= 0 else -1
            if p < 0:
                unlaunched += 1
        if p >= 0:
            parent[i] = p
            edge[i] = EDGE_LAUNCH
    return unlaunched


def _children_csr(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    count = len(parent)
    has_parent = parent >= 0
    counts = np.bincount(parent[has_parent], minlength=count)
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    children = np.flatnonzero(has_parent)
    # stable sort by parent keeps children in node order (time order within a thread)
    index = children[np.argsort(parent[children], kind="stable")]
    return offsets, index


def _empty_comm() -> CommInstances:
    empty = np.zeros(0, dtype=np.int64)
    return CommInstances(empty, empty, empty, [], [], empty, empty, empty, empty)


def _comm_roots(
    parent: np.ndarray,
    edge: np.ndarray,
    layer: np.ndarray,
    stream: np.ndarray,
    rows: np.ndarray,
    table: pa.Table,
) -> CommRoots:
    """Each collective's root and what the nodes inside it say of it.

    A collective's root is its outermost comm node (the annotation, c10d op or record_param_comms
    on the host, or a bare comm kernel). Its kind, group and sequence number come from any node
    inside it that carries them (record_param_comms); a GPU collective launched by a host one
    takes what the host side says where it says nothing itself."""
    comm_code = LAYER_CODE["comm"]
    count = len(parent)
    is_comm = layer == comm_code
    empty = np.zeros(0, dtype=np.int64)
    if not is_comm.any():
        return CommRoots(empty, [], [], empty, empty)
    parents = parent.tolist()
    comm_flags = is_comm.tolist()
    roots_list = [-1] * count
    launched_by: dict[int, int] = {}  # GPU collective root → the host collective that launched it
    gpu_comm = (is_comm & (stream >= 0) & (edge == EDGE_LAUNCH)).tolist()
    for i, p in enumerate(parents):
        if gpu_comm[i]:  # the kernel is its own instance: it arrives and leaves on the GPU
            roots_list[i] = i
            if p >= 0 and roots_list[p] >= 0:
                launched_by[i] = roots_list[p]
        elif p >= 0 and roots_list[p] >= 0:
            roots_list[i] = roots_list[p]
        elif comm_flags[i]:
            roots_list[i] = i
    root_of = np.asarray(roots_list, dtype=np.int64)
    coll_col = table.column("coll_name").combine_chunks()
    group_col = table.column("group").combine_chunks()
    seq_col = table.column("seq").to_numpy()
    bytes_col = table.column("bytes").to_numpy()
    coll_values = coll_col.dictionary.to_pylist()
    group_values = group_col.dictionary.to_pylist()
    coll_idx = coll_col.indices.fill_null(0).to_numpy()
    coll_valid = pc.is_valid(coll_col).to_numpy(zero_copy_only=False)
    group_idx = group_col.indices.fill_null(0).to_numpy()
    group_valid = pc.is_valid(group_col).to_numpy(zero_copy_only=False)

    info: dict[int, dict] = {}
    for i in np.flatnonzero(root_of >= 0).tolist():
        root = int(root_of[i])
        facts = info.setdefault(root, {"kind": None, "group": None, "seq": -1, "bytes": -1})
        row = rows[i]
        if group_valid[row] and facts["group"] is None:
            facts["group"] = group_values[group_idx[row]]
            if coll_valid[row]:
                facts["kind"] = coll_values[coll_idx[row]]
        if seq_col[row] >= 0 and facts["seq"] < 0:
            facts["seq"] = int(seq_col[row])
        if bytes_col[row] >= 0 and facts["bytes"] < 0 and stream[i] < 0:
            facts["bytes"] = int(bytes_col[row])
    for gpu_root, host_root in launched_by.items():  # group, seq and size come from the host side
        facts, host = info[gpu_root], info.get(host_root, {})
        for fact in ("group", "kind"):
            facts[fact] = facts[fact] or host.get(fact)
        for fact in ("seq", "bytes"):
            if facts[fact] < 0:
                facts[fact] = host.get(fact, -1)
    return CommRoots(
        node=np.fromiter(info, dtype=np.int64, count=len(info)),
        kind=[f["kind"] for f in info.values()],
        group=[f["group"] for f in info.values()],
        seq=np.asarray([f["seq"] for f in info.values()], dtype=np.int64),
        bytes=np.asarray([f["bytes"] for f in info.values()], dtype=np.int64),
    )


def _comm_instances(tree: CallTree, roots: CommRoots) -> CommInstances:
    """Group each rank's collectives into instances shared across the ranks of their group.

    Without a sequence number, the n-th collective of a (group, kind) on each rank is the same
    instance. Only ranks of one engine (`engines.py`) share an instance.
    """
    if not len(roots.node):
        return _empty_comm()
    facts_of = {
        int(node): (kind, group, int(seq), int(size))
        for node, kind, group, seq, size in zip(
            roots.node.tolist(), roots.kind, roots.group, roots.seq, roots.bytes, strict=True
        )
    }
    ordered = sorted(facts_of, key=lambda r: (tree.rank[r], tree.start[r]))
    # engines' process groups reuse names and sequence numbers: a collective joins its own engine's
    engine_of = dict(zip(tree.steps.rank.tolist(), tree.steps.engine.tolist(), strict=True))
    ordinal: dict[tuple, int] = {}
    instance_of_key: dict[tuple, int] = {}
    out: dict[str, list] = {k: [] for k in CommInstances.__dataclass_fields__}
    for root in ordered:
        stated_kind, stated_group, seq, size = facts_of[root]
        kind = stated_kind or collective_kind(tree.names[tree.name[root]])
        group = stated_group or ""
        r = int(tree.rank[root])
        engine = engine_of.get(r, 0)
        # host-side roots of one collective can be several (gloo: the c10d op on the caller's
        # thread and the gloo:* range on a worker thread); each family is joined on its own
        family = "gpu" if tree.stream[root] >= 0 else tree.names[tree.name[root]]
        if seq >= 0:
            key = (engine, group, family, "seq", seq)
        else:
            counter_key = (r, group, kind, family)
            n = ordinal.get(counter_key, 0)
            ordinal[counter_key] = n + 1
            key = (engine, group, kind, family, n)
        instance = instance_of_key.setdefault(key, len(instance_of_key))
        out["instance"].append(instance)
        out["rank"].append(r)
        out["node"].append(root)
        out["kind"].append(kind)
        out["group"].append(group)
        out["seq"].append(seq)
        out["bytes"].append(size)
        out["start_ns"].append(int(tree.start[root]))
        out["end_ns"].append(int(tree.start[root] + tree.dur[root]))
    return CommInstances(
        instance=np.asarray(out["instance"], dtype=np.int64),
        rank=np.asarray(out["rank"], dtype=np.int32),
        node=np.asarray(out["node"], dtype=np.int64),
        kind=out["kind"],
        group=out["group"],
        seq=np.asarray(out["seq"], dtype=np.int64),
        bytes=np.asarray(out["bytes"], dtype=np.int64),
        start_ns=np.asarray(out["start_ns"], dtype=np.int64),
        end_ns=np.asarray(out["end_ns"], dtype=np.int64),
    )
