"""Cut causal-context slices out of a call-chain tree: per step, across ranks, per request, per node.

Every cut ends in `slice_of_nodes`, which closes the node set under ancestors (a node never arrives
without what called it), keeps tree order, compacts the symbol table and attaches the collective
relations. The cuts differ only in which nodes they pick and in what order they spend a size budget:

* `step_slice`: one step on one rank (the vertical view): every node the tree puts in the step;
* `horizontal_slice`: one rank-local step ordinal on every rank, tied by their collectives;
* `request_slice`: the union of the steps a request was batched in (the request → step mapping
  comes from the alignment stage; here it is a list of step indices);
* `context_slice`: the context that explains one node, spent in priority order: its ancestors,
  its own subtree (the GPU work it launched), the same collective on the other ranks, then its
  siblings nearest in time;
* `root_slices`: each root's subtree, for traces without step annotations.

A budget is a node count. Ancestors (and for a step, its collective nodes) are kept even past the
budget, since a slice without them cannot be read; the rest is cut breadth-first, so what is left
out is the deepest detail.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from teller.callchain.tree import CallTree
from teller.slices.slice import CommRelations, Slice

#: Default size of a context slice around one node (nodes).
DEFAULT_CONTEXT_BUDGET = 512


def slice_of_nodes(
    tree: CallTree,
    nodes: Iterable[int] | np.ndarray,
    kind: str = "nodes",
    steps: Sequence[int] = (),
    focus: int = -1,
) -> Slice:
    """The slice holding `nodes` (tree indices) and all their ancestors, in tree order."""
    wanted = np.asarray(list(nodes) if not isinstance(nodes, np.ndarray) else nodes, np.int64)
    if len(wanted) <= FEW_NODES and (wanted >= 0).all():
        picked = _with_ancestors(tree, wanted.tolist())
    else:
        mask = np.zeros(len(tree), dtype=bool)
        mask[wanted] = True
        _close_under_ancestors(tree, mask)
        picked = np.flatnonzero(mask)  # tree order: parents before children
    tree_parent = tree.parent[picked]
    parent = np.searchsorted(picked, tree_parent).astype(np.int32)
    parent[tree_parent < 0] = -1
    depth = np.zeros(len(picked), dtype=np.int32)
    parents = parent.tolist()
    depth_list = depth.tolist()
    for i, p in enumerate(parents):
        if p >= 0:
            depth_list[i] = depth_list[p] + 1
    depth = np.asarray(depth_list, dtype=np.int32)
    used, name = np.unique(tree.name[picked], return_inverse=True)
    edge = tree.edge[picked].astype(np.int8)
    edge[parent < 0] = 0
    focus_index = int(np.searchsorted(picked, focus)) if focus >= 0 else -1
    return Slice(
        parent=parent,
        edge=edge,
        depth=depth,
        layer=tree.layer[picked].astype(np.int8),
        name=name.astype(np.int32).reshape(-1),
        rank=tree.rank[picked].astype(np.int32),
        stream=tree.stream[picked].astype(np.int32),
        start=tree.start[picked].astype(np.int64),
        dur=tree.dur[picked].astype(np.int64),
        self_ns=tree.self_ns[picked].astype(np.int64),
        tree_node=picked.astype(np.int64),
        names=[tree.names[i] for i in used.tolist()],
        comm=_comm_relations(tree, picked),
        kind=kind,
        steps=tuple(int(s) for s in steps),
        focus=focus_index,
    )


def step_slice(tree: CallTree, step: int, budget: int | None = None) -> Slice:
    """Vertical slice: one step (a row of `tree.steps`) on its own rank."""
    _check_step(tree, step)
    nodes = np.flatnonzero(tree.step == step)
    return slice_of_nodes(tree, _spend(tree, nodes, budget), kind="step", steps=(step,))


def step_slices(tree: CallTree, budget: int | None = None) -> list[Slice]:
    """Every step of the tree as a vertical slice, in step-table order."""
    if not len(tree.steps):
        return []
    members = _members_by_step(tree)
    return [
        slice_of_nodes(tree, _spend(tree, members[k], budget), kind="step", steps=(k,))
        for k in range(len(tree.steps))
    ]


def horizontal_slice(tree: CallTree, index: int, budget: int | None = None) -> Slice:
    """One step across ranks: rank-local step ordinal `index` on every rank that has it.

    With tensor or pipeline parallelism every rank runs every iteration, so one ordinal names the
    same iteration everywhere; the ranks' collective nodes are tied in `comm` (C). A budget is
    shared equally among the ranks.
    """
    steps = np.flatnonzero(tree.steps.index == index)
    if not len(steps):
        raise ValueError(f"no rank has a step with ordinal {index}")
    per_rank = None if budget is None else max(1, budget // len(steps))
    nodes = [_spend(tree, np.flatnonzero(tree.step == s), per_rank) for s in steps.tolist()]
    return slice_of_nodes(
        tree, np.concatenate(nodes), kind="horizontal", steps=tuple(steps.tolist())
    )


def request_slice(tree: CallTree, steps: Sequence[int], budget: int | None = None) -> Slice:
    """A request's slice: the union of the steps (rows of `tree.steps`) it was batched in."""
    if not len(steps):
        raise ValueError("a request slice needs at least one step")
    for step in steps:
        _check_step(tree, step)
    nodes = np.flatnonzero(np.isin(tree.step, np.asarray(steps, dtype=np.int64)))
    return slice_of_nodes(tree, _spend(tree, nodes, budget), kind="request", steps=tuple(steps))


def context_slice(tree: CallTree, node: int, budget: int = DEFAULT_CONTEXT_BUDGET) -> Slice:
    """The context that explains `node`, spent in priority order up to `budget` nodes.

    1. the node and its ancestors (always, even past the budget);
    2. its subtree, breadth-first: the calls it made and the GPU work it launched;
    3. the same collective instance on the other ranks (for a collective node or one inside a
       collective), each with its ancestors and subtree;
    4. its siblings, nearest in time first, each with its subtree breadth-first; then its
       parent's siblings, and so on up the chain of ancestors.
    """
    if not 0 <= node < len(tree):
        raise ValueError(f"node {node} is not in the tree ({len(tree)} nodes)")
    mask = np.zeros(len(tree), dtype=bool)
    mask[node] = True
    _close_under_ancestors(tree, mask)
    size = int(mask.sum())
    for candidate in _context_candidates(tree, node):
        if mask[candidate]:
            continue
        chain = _missing_ancestors(tree, mask, candidate)
        if size + len(chain) + 1 > budget:
            break
        mask[chain] = True
        mask[candidate] = True
        size += len(chain) + 1
    return slice_of_nodes(
        tree, np.flatnonzero(mask), kind="context", steps=_steps_of(tree, mask), focus=node
    )


def root_slices(tree: CallTree, min_nodes: int = 1, budget: int | None = None) -> list[Slice]:
    """Each root's subtree (for traces without steps), roots with fewer than `min_nodes` left out."""
    out = []
    for root in tree.roots().tolist():
        nodes = _subtree_bfs(tree, root)
        if len(nodes) >= min_nodes:
            nodes = nodes if budget is None else nodes[:budget]
            out.append(slice_of_nodes(tree, nodes, kind="root"))
    return out


# --- helpers -------------------------------------------------------------------------------------


def _check_step(tree: CallTree, step: int) -> None:
    if not 0 <= step < len(tree.steps):
        raise ValueError(f"step {step} is not in the tree ({len(tree.steps)} steps)")


def _members_by_step(tree: CallTree) -> list[np.ndarray]:
    in_step = np.flatnonzero(tree.step >= 0)
    order = in_step[np.argsort(tree.step[in_step], kind="stable")]
    bounds = np.searchsorted(tree.step[order], np.arange(len(tree.steps) + 1))
    return [order[bounds[k] : bounds[k + 1]] for k in range(len(tree.steps))]


#: Up to this many nodes, a slice's ancestors are walked up from them: a mask over the whole
#: tree would make one small slice per candidate cost the run's size each.
FEW_NODES = 64


def _with_ancestors(tree: CallTree, nodes: list[int]) -> np.ndarray:
    """`nodes` and all their ancestors, ascending (tree order), without touching the rest."""
    seen: set[int] = set()
    for node in nodes:
        while node >= 0 and node not in seen:
            seen.add(node)
            node = int(tree.parent[node])
    return np.array(sorted(seen), dtype=np.int64)


def _close_under_ancestors(tree: CallTree, mask: np.ndarray) -> None:
    frontier = np.flatnonzero(mask)
    while len(frontier):
        parents = tree.parent[frontier]
        parents = parents[parents >= 0]
        parents = parents[~mask[parents]]
        parents = np.unique(parents)
        mask[parents] = True
        frontier = parents


def _missing_ancestors(tree: CallTree, mask: np.ndarray, node: int) -> list[int]:
    chain = []
    parent = int(tree.parent[node])
    while parent >= 0 and not mask[parent]:
        chain.append(parent)
        parent = int(tree.parent[parent])
    return chain


def _spend(tree: CallTree, nodes: np.ndarray, budget: int | None) -> np.ndarray:
    """Cut `nodes` to `budget` breadth-first (by depth, then start), keeping collective nodes.

    Breadth-first keeps closure: a node of depth d is only kept when every node of depth d-1 is.
    """
    if budget is None or len(nodes) <= budget:
        return nodes
    order = np.lexsort((tree.start[nodes], tree.depth[nodes]))
    kept = nodes[order[:budget]]
    collective = np.intersect1d(nodes, tree.comm.node) if len(tree.comm) else nodes[:0]
    return np.union1d(kept, collective)


def _subtree_bfs(tree: CallTree, root: int) -> list[int]:
    out = [root]
    head = 0
    while head < len(out):
        out.extend(tree.children(out[head]).tolist())
        head += 1
    return out


def _context_candidates(tree: CallTree, node: int) -> Iterator[int]:
    """Candidate nodes after the ancestors, in priority order (see `context_slice`), lazily:
    a small budget around a node of a huge tree only walks what it keeps."""
    subtree = _subtree_bfs(tree, node)
    yield from subtree[1:]
    comm = tree.comm
    if len(comm):
        chain = {node, *_ancestor_list(tree, node), *subtree}
        rows = np.flatnonzero(np.isin(comm.node, list(chain)))
        for instance in np.unique(comm.instance[rows]).tolist():
            for peer in comm.node[comm.instance == instance].tolist():
                if peer not in chain:
                    yield from _subtree_bfs(tree, int(peer))
    # the node's own siblings first, then its parent's, and so on up: what ran around it
    for level in [node, *_ancestor_list(tree, node)]:
        parent = int(tree.parent[level])
        if parent < 0:
            break
        others = [s for s in tree.children(parent).tolist() if s != level]
        others.sort(key=lambda s, at=int(tree.start[level]): abs(int(tree.start[s]) - at))
        for sibling in others:
            yield from _subtree_bfs(tree, sibling)


def _ancestor_list(tree: CallTree, node: int) -> list[int]:
    out = []
    parent = int(tree.parent[node])
    while parent >= 0:
        out.append(parent)
        parent = int(tree.parent[parent])
    return out


def _steps_of(tree: CallTree, mask: np.ndarray) -> tuple[int, ...]:
    steps = np.unique(tree.step[mask])
    return tuple(steps[steps >= 0].tolist())


def _comm_relations(tree: CallTree, picked: np.ndarray) -> CommRelations:
    """C for the picked nodes: their collective instance and the member that arrived last."""
    comm = tree.comm
    if not len(comm):
        return CommRelations.empty()
    rows = comm.rows_of_nodes(picked)
    if not len(rows):
        return CommRelations.empty()
    last_rows = comm.last_arrival[comm.instance[rows]]
    last_tree_node = comm.node[last_rows]
    position = np.searchsorted(picked, last_tree_node)
    inside = (position < len(picked)) & (
        picked[np.minimum(position, len(picked) - 1)] == last_tree_node
    )
    return CommRelations(
        node=np.searchsorted(picked, comm.node[rows]).astype(np.int64),
        instance=comm.instance[rows].astype(np.int64),
        last_rank=comm.rank[last_rows].astype(np.int32),
        last_node=np.where(inside, position, -1).astype(np.int64),
        last_start_ns=comm.start_ns[last_rows].astype(np.int64),
    )
