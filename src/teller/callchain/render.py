"""Text rendering of call-chain trees, for `teller tree`, and the names and times every report shows.

A step's tree holds thousands of nodes; a person reads a few dozen lines. The renderer folds runs of
same-named siblings into one line with a count, cuts at a depth, and lists the GPU work an
operator launched on the operator's own line so "which kernels did this op run" is one glance.
Names, paths and warnings come from the input files, so every one is shown escaped
(`teller.errors.printable`): a name holding a terminal escape sequence or a carriage return is
printed as `\x1b[31m` or `\r`, never acted on.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from teller.callchain.steps import FOUND_BY_PERIOD
from teller.callchain.tree import EDGE_LAUNCH, CallTree
from teller.errors import printable
from teller.ingest.schema import LAYER_CODE

_GPU_CODES = {LAYER_CODE[n] for n in ("kernel", "memcpy", "memset", "sync")}
_MAX_NAME = 90


def format_ns(value: float) -> str:
    """Human units: 950 ns, 12.3 µs, 4.56 ms, 1.23 s."""
    value = float(value)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(value) >= scale:
            return (
                f"{value / scale:.3g} {unit}"
                if value / scale < 100
                else f"{value / scale:.0f} {unit}"
            )
    return f"{value:.0f} ns"


def short_name(name: str, limit: int = _MAX_NAME) -> str:
    """Kernel names run to kilobytes of template arguments; keep the readable head."""
    name = name.removeprefix("void ")
    cut = name.find("<")
    if cut > 0 and len(name) > limit:
        name = name[:cut] + "<…>"
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _node_name(tree: CallTree, node: int, limit: int = _MAX_NAME) -> str:
    return short_name(printable(tree.node_name(node), one_line=True), limit)


def render_tree(
    tree: CallTree,
    root: int,
    max_depth: int = 4,
    max_children: int = 40,
    show_python: bool = False,
) -> str:
    """Indented text of the subtree at `root`, to `max_depth` levels below it.

    Python frames (with_stack traces hold tens of thousands) are see-through unless `show_python`:
    their children are shown in their place, so the operators stay a few levels deep.
    """
    hidden = set() if show_python else {LAYER_CODE["python"]}
    return "\n".join(_lines(tree, root, 0, max_depth, max_children, hidden))


def render_step(tree: CallTree, row: int, max_depth: int = 4, show_python: bool = False) -> str:
    """The tree of one step (a row of `tree.steps`).

    An annotated step is its annotation's subtree. A step found from the period of the top-level
    sequence has no node above its work: a header line says how it was found, then each of its
    top-level operations follows in time order.
    """
    steps = tree.steps
    if steps.found_by[row] != FOUND_BY_PERIOD:
        return render_tree(tree, int(steps.node[row]), max_depth=max_depth, show_python=show_python)
    members = tree.step == row
    parent_in_step = np.zeros(len(tree), dtype=bool)
    has_parent = tree.parent >= 0
    parent_in_step[has_parent] = members[tree.parent[has_parent]]
    roots = np.flatnonzero(members & ~parent_in_step & (tree.stream < 0))
    roots = roots[np.argsort(tree.start[roots], kind="stable")]
    hidden = set() if show_python else {LAYER_CODE["python"]}
    tops = [n for r in roots.tolist() for n in _visible_roots(tree, r, hidden)]
    header = (
        f"step {int(steps.index[row])} on rank {int(steps.rank[row])}: "
        f"{format_ns(steps.dur_ns[row])}, {len(tops)} top-level operations "
        f"(found by {steps.found_by[row]})"
    )
    lines = [header]
    for top in tops:
        lines.extend(_lines(tree, top, 1, max_depth, 40, hidden))
    return "\n".join(lines)


def _visible_roots(tree: CallTree, node: int, hidden: set[int]) -> list[int]:
    return _visible_children(tree, node, hidden) if tree.layer[node] in hidden else [node]


def _visible_children(tree: CallTree, node: int, hidden: set[int]) -> list[int]:
    out: list[int] = []
    for child in tree.children(node).tolist():
        if tree.layer[child] in hidden:
            out.extend(_visible_children(tree, child, hidden))
        else:
            out.append(child)
    return out


def _lines(
    tree: CallTree, node: int, level: int, max_depth: int, max_children: int, hidden: set[int]
) -> Iterator[str]:
    children = np.asarray(_visible_children(tree, node, hidden), dtype=np.int64)
    gpu = [
        c for c in children.tolist() if tree.edge[c] == EDGE_LAUNCH and tree.layer[c] in _GPU_CODES
    ]
    launched = ""
    if gpu:
        kernel_names = sorted({_node_name(tree, c, 50) for c in gpu})
        gpu_ns = int(tree.dur[gpu].sum())
        shown = ", ".join(kernel_names[:3]) + (
            f", +{len(kernel_names) - 3}" if len(kernel_names) > 3 else ""
        )
        launched = f"  ⇒ GPU {format_ns(gpu_ns)} [{shown}]"
    yield (
        f"{'  ' * level}{_node_name(tree, node)}  "
        f"{format_ns(tree.dur[node])} (self {format_ns(tree.self_ns[node])}) "
        f"[{tree.layer_name(node)}]{launched}"
    )
    if level >= max_depth:
        return
    launched_set = set(gpu)
    rest = [c for c in children.tolist() if c not in launched_set]
    groups = _fold(tree, rest)
    for first, count, total in groups[:max_children]:
        if count == 1:
            yield from _lines(tree, first, level + 1, max_depth, max_children, hidden)
        else:
            yield (
                f"{'  ' * (level + 1)}{_node_name(tree, first)}  ×{count}  "
                f"total {format_ns(total)} [{tree.layer_name(first)}]"
            )
    if len(groups) > max_children:
        yield f"{'  ' * (level + 1)}… {len(groups) - max_children} more"


def _fold(tree: CallTree, nodes: list[int]) -> list[tuple[int, int, int]]:
    """Runs of consecutive same-named leaves fold into (first node, count, total duration)."""
    groups: list[tuple[int, int, int]] = []
    for node in nodes:
        is_leafish = tree.child_offsets[node + 1] == tree.child_offsets[node]
        if groups and is_leafish and tree.name[groups[-1][0]] == tree.name[node]:
            first, count, total = groups[-1]
            groups[-1] = (first, count + 1, total + int(tree.dur[node]))
        else:
            groups.append((node, 1, int(tree.dur[node])))
    return groups


def _shown(text: object) -> str:
    return printable(str(text), one_line=True)
