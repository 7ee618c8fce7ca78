"""Causal-context slices cut from real call-chain trees: closure, steps, ranks, budgets, relations."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import real_trace
from teller.callchain.tree import EDGE_LAUNCH, CallTree, build_tree
from teller.ingest import read_run, read_trace
from teller.ingest.schema import LAYER_CODE
from teller.slices import (
    context_slice,
    horizontal_slice,
    request_slice,
    root_slices,
    step_slice,
    step_slices,
)
from teller.slices.slice import Slice

DDP = "hta/df_index_resolver_rank1_of2_216k_events.json.gz"  # 5 steps, 4,040 NCCL collectives
TWO_RANKS = ("hta/sampled_rank0_of128.json.gz", "hta/sampled_rank1_of128.json.gz")
VLLM = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"


@pytest.fixture(scope="module")
def ddp_tree() -> CallTree:
    return build_tree(read_trace(real_trace(DDP)))


@pytest.fixture(scope="module")
def two_rank_tree() -> CallTree:
    return build_tree(read_run([real_trace(p) for p in TWO_RANKS]))


def assert_closed_and_faithful(tree: CallTree, piece: Slice) -> None:
    """Every node's parent is in the slice and every column matches the tree node it came from."""
    piece.validate()
    source = piece.tree_node
    has_parent = piece.parent >= 0
    assert np.array_equal(source[piece.parent[has_parent]], tree.parent[source[has_parent]])
    assert np.all(tree.parent[source[~has_parent]] < 0), "a slice root has a parent in the tree"
    assert [piece.names[i] for i in piece.name] == [tree.names[i] for i in tree.name[source]]
    assert np.array_equal(piece.start, tree.start[source])
    assert np.array_equal(piece.dur, tree.dur[source])
    assert np.array_equal(piece.self_ns, tree.self_ns[source])
    assert np.array_equal(piece.edge[has_parent], tree.edge[source[has_parent]])


def test_vertical_step_slice_holds_the_whole_step_and_its_collectives(ddp_tree: CallTree) -> None:
    slices = step_slices(ddp_tree)

    assert len(slices) == len(ddp_tree.steps) == 5
    for k, piece in enumerate(slices):
        assert_closed_and_faithful(ddp_tree, piece)
        members = np.flatnonzero(ddp_tree.step == k)
        assert np.isin(members, piece.tree_node).all()
        assert piece.kind == "step" and piece.steps == (k,)
        assert piece.ranks == [1]
        # C: each collective root of the step is related to its instance
        collective_roots = np.intersect1d(ddp_tree.comm.node, piece.tree_node)
        assert len(piece.comm) == len(collective_roots) > 0
        assert np.array_equal(np.sort(piece.tree_node[piece.comm.node]), collective_roots)
    assert step_slice(ddp_tree, 2) == slices[2]


def test_step_slice_keeps_launched_gpu_work_under_its_launcher(ddp_tree: CallTree) -> None:
    piece = step_slice(ddp_tree, 0)
    kernels = np.flatnonzero(piece.layer == LAYER_CODE["kernel"])

    assert len(kernels) > 1000
    launched = kernels[piece.edge[kernels] == EDGE_LAUNCH]
    assert len(launched) > 0.9 * len(kernels)
    assert np.all(piece.layer[piece.parent[launched]] == LAYER_CODE["runtime"])


def test_request_slice_is_the_union_of_its_steps(ddp_tree: CallTree) -> None:
    one, three = step_slice(ddp_tree, 1), step_slice(ddp_tree, 3)
    request = request_slice(ddp_tree, [1, 3])

    assert_closed_and_faithful(ddp_tree, request)
    assert np.array_equal(request.tree_node, np.union1d(one.tree_node, three.tree_node))
    assert request.steps == (1, 3)
    with pytest.raises(ValueError, match="step 99"):
        request_slice(ddp_tree, [99])


def test_horizontal_slice_ties_ranks_by_collective_and_names_the_last_arriver(
    two_rank_tree: CallTree,
) -> None:
    piece = horizontal_slice(two_rank_tree, 0)

    assert_closed_and_faithful(two_rank_tree, piece)
    assert piece.ranks == [0, 1]
    assert len(piece.comm) >= 2
    comm = two_rank_tree.comm
    for row in range(len(piece.comm)):
        node = int(piece.comm.node[row])
        partners = piece.comm.partners(node)
        instance = piece.comm.instance[row]
        members = comm.node[comm.instance == instance]
        # partners are the same instance on the other rank, when that rank's node is in the slice
        assert set(piece.tree_node[partners].tolist()) <= set(members.tolist())
        assert all(piece.rank[p] != piece.rank[node] for p in partners)
        last = members[np.argmax(comm.start_ns[comm.instance == instance])]
        assert piece.comm.last_rank[row] == two_rank_tree.rank[last]
        if piece.comm.last_node[row] >= 0:
            assert piece.tree_node[piece.comm.last_node[row]] == last
    assert (piece.comm.last_node >= 0).any()


def test_context_slice_spends_its_budget_on_ancestors_subtree_partners_then_siblings(
    two_rank_tree: CallTree,
) -> None:
    comm = two_rank_tree.comm
    focus = int(comm.node[0])
    partner = int(comm.node[(comm.instance == comm.instance[0]) & (comm.rank != comm.rank[0])][0])

    piece = context_slice(two_rank_tree, focus, budget=64)

    assert_closed_and_faithful(two_rank_tree, piece)
    assert len(piece) <= 64
    assert piece.tree_node[piece.focus] == focus
    assert partner in piece.tree_node.tolist(), "the collective's partner on the other rank"
    ancestors = []
    node = focus
    while two_rank_tree.parent[node] >= 0:
        node = int(two_rank_tree.parent[node])
        ancestors.append(node)
    assert set(ancestors) <= set(piece.tree_node.tolist())
    bigger = context_slice(two_rank_tree, focus, budget=400)
    assert len(piece) < len(bigger) <= 400
    assert set(piece.tree_node.tolist()) <= set(bigger.tree_node.tolist())


def test_budget_cuts_breadth_first_and_keeps_collectives(ddp_tree: CallTree) -> None:
    full = step_slice(ddp_tree, 0)
    cut = step_slice(ddp_tree, 0, budget=500)

    assert_closed_and_faithful(ddp_tree, cut)
    collectives = np.intersect1d(ddp_tree.comm.node, full.tree_node)
    assert np.isin(collectives, cut.tree_node).all()
    assert len(cut) < len(full)
    # apart from the collectives and their ancestors, the budget decides the size
    assert len(cut) <= 500 + len(collectives) * (int(full.depth.max()) + 1)
    assert cut.depth.max() <= full.depth.max()


def test_root_slices_partition_a_trace_without_steps() -> None:
    # a step regex that names nothing: the run has no steps
    tree = build_tree(
        read_trace(real_trace("hta/cupti_profiler_counters.json.gz")), step_regex="^no such step$"
    )
    assert len(tree.steps) == 0

    slices = root_slices(tree)

    assert sum(len(s) for s in slices) == len(tree)
    for piece in slices:
        assert_closed_and_faithful(tree, piece)
        assert len(piece.roots()) == 1


def test_single_step_llm_trace_is_one_slice() -> None:
    tree = build_tree(read_trace(real_trace(VLLM)))
    piece = step_slice(tree, 0)

    assert_closed_and_faithful(tree, piece)
    assert piece.node_name(0).startswith("execute_8192_context_9(")
    assert len(piece) == int((tree.step == 0).sum())


def _comm_rows_by_scan(tree: CallTree, picked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The collective rows of `picked` and their instances' last arrivers, found by scanning
    the whole table (what `_comm_relations` did for every slice before the table kept its
    lookups)."""
    comm = tree.comm
    rows = np.flatnonzero(np.isin(comm.node, picked))
    by_start = np.lexsort((comm.start_ns, comm.instance))
    last_of_instance = np.full(comm.num_instances, -1, dtype=np.int64)
    last_of_instance[comm.instance[by_start]] = by_start
    rows = rows[np.argsort(comm.node[rows], kind="stable")]
    return rows, last_of_instance[comm.instance[rows]]


@pytest.mark.parametrize("which", ["ddp", "two ranks"])
def test_collective_members_of_every_step_slice_are_those_a_whole_table_scan_finds(
    which: str, ddp_tree: CallTree, two_rank_tree: CallTree
) -> None:
    tree = ddp_tree if which == "ddp" else two_rank_tree
    assert len(tree.comm) and len(tree.steps)
    for row in range(len(tree.steps)):
        piece = step_slice(tree, row)
        rows, last_rows = _comm_rows_by_scan(tree, piece.tree_node)
        comm = tree.comm
        assert len(rows) == len(piece.comm)
        assert np.array_equal(piece.tree_node[piece.comm.node], comm.node[rows])
        assert np.array_equal(piece.comm.instance, comm.instance[rows])
        assert np.array_equal(piece.comm.last_rank, comm.rank[last_rows])
        assert np.array_equal(piece.comm.last_start_ns, comm.start_ns[last_rows])
