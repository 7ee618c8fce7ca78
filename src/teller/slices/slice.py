"""The causal-context slice S = (V, E, T, C): the unit a diagnosis (and the TPE tokenizer) reads.

A slice is a small call-chain forest cut out of a `CallTree`: one step on one rank (vertical), one
step across ranks (horizontal), a request's steps, or the context around one node. It is stored as
columns like the tree itself, so a slice of 50k nodes costs a handful of numpy arrays:

* V, the nodes: `layer`, `name` (ids into the slice's own compact `names`), `rank`, `stream`;
* E, the edges: `parent` (index within the slice, -1 for a root) and `edge` (call or launch, the
  tree's EDGE_* codes), with `depth` measured inside the slice;
* T, the times: `start`, `dur` and `self_ns` in ns, copied from the tree (`self_ns` is exclusive
  time in the *whole* tree, so trimming context never changes a node's own cost);
* C, the communication relations (`CommRelations`): every collective node of the slice, the
  collective instance it belongs to, and which peer rank arrived last, since a straggler is the
  rank that arrives last while its peers' collective time inflates.

Nodes are in tree order (every parent before its children, siblings in time order on a thread), and
every node's ancestors are in the slice: a diagnosis never sees a node without what called it.
`tree_node` keeps the provenance (the node's index in the tree it was cut from).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from teller.callchain.tree import EDGE_KINDS
from teller.ingest.schema import LAYERS


@dataclass(eq=False)
class CommRelations:
    """C: one row per collective node of a slice.

    `instance` is the run-wide collective instance (`CallTree.comm`); the other rows of the slice
    with the same instance are the node's partners on other ranks. `last_rank`/`last_start_ns` name
    the member of the instance (on any rank of the run) that started last, and `last_node` is its
    index in this slice, or -1 when that peer's node is outside the slice (a vertical slice).
    """

    node: np.ndarray  # slice index of this rank's collective root
    instance: np.ndarray
    last_rank: np.ndarray
    last_node: np.ndarray  # slice index, -1 when the last arriver is not in the slice
    last_start_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.node)

    @classmethod
    def empty(cls) -> CommRelations:
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, none.astype(np.int32), none, none)

    def partners(self, node: int) -> np.ndarray:
        """Slice indices of the same collective instance on the other ranks in this slice."""
        rows = np.flatnonzero(self.node == node)
        if not len(rows):
            return np.zeros(0, dtype=np.int64)
        same = self.instance == self.instance[rows[0]]
        return self.node[same & (self.node != node)]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CommRelations):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)
        )


#: Columns that hold one value per node, in the order they are stored and compared.
NODE_COLUMNS: tuple[str, ...] = (
    "parent",
    "edge",
    "depth",
    "layer",
    "name",
    "rank",
    "stream",
    "start",
    "dur",
    "self_ns",
    "tree_node",
)


@dataclass(eq=False)
class Slice:
    """S = (V, E, T, C) as columns. `kind` says how it was cut; `steps` which tree steps it covers."""

    parent: np.ndarray  # int32, index within the slice, -1 for a root
    edge: np.ndarray  # int8, EDGE_* code of the edge to the parent (0 = root)
    depth: np.ndarray  # int32, depth within the slice
    layer: np.ndarray  # int8, codes into LAYERS
    name: np.ndarray  # int32, ids into `names`
    rank: np.ndarray  # int32
    stream: np.ndarray  # int32, -1 on the CPU
    start: np.ndarray  # int64 ns
    dur: np.ndarray  # int64 ns, inclusive
    self_ns: np.ndarray  # int64 ns, exclusive time in the whole tree
    tree_node: np.ndarray  # int64, the node's index in the CallTree it came from (-1 unknown)
    names: list[str]
    comm: CommRelations = field(default_factory=CommRelations.empty)
    kind: str = "nodes"  # step | horizontal | request | context | root | nodes
    steps: tuple[int, ...] = ()
    focus: int = -1  # slice index of the node a context slice was cut around

    def __len__(self) -> int:
        return len(self.parent)

    @property
    def end(self) -> np.ndarray:
        return self.start + self.dur

    def roots(self) -> np.ndarray:
        return np.flatnonzero(self.parent < 0)

    def node_name(self, node: int) -> str:
        return self.names[self.name[node]]

    def layer_name(self, node: int) -> str:
        return LAYERS[self.layer[node]]

    def edge_name(self, node: int) -> str:
        return EDGE_KINDS[self.edge[node]]

    def children(self, node: int) -> np.ndarray:
        return np.flatnonzero(self.parent == node)

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self.rank.tolist()))

    def __eq__(self, other: object) -> bool:
        """Same nodes, edges, names (as strings), times and comm relations, in the same order."""
        if not isinstance(other, Slice):
            return NotImplemented
        if len(self) != len(other):
            return False
        for column in NODE_COLUMNS:
            if column == "name":
                continue
            if not np.array_equal(getattr(self, column), getattr(other, column)):
                return False
        mine = [self.names[i] for i in self.name.tolist()]
        theirs = [other.names[i] for i in other.name.tolist()]
        return mine == theirs and self.comm == other.comm

    def validate(self) -> None:
        """Check the invariants every slice keeps; raises ValueError naming the first broken one."""
        count = len(self)
        for column in NODE_COLUMNS:
            if len(getattr(self, column)) != count:
                raise ValueError(
                    f"column {column} has {len(getattr(self, column))} rows, not {count}"
                )
        index = np.arange(count)
        if np.any(self.parent >= index):
            raise ValueError("a node comes before its parent")
        has_parent = self.parent >= 0
        expected_depth = np.zeros(count, dtype=np.int64)
        for i in np.flatnonzero(has_parent).tolist():
            expected_depth[i] = expected_depth[self.parent[i]] + 1
        if not np.array_equal(expected_depth, self.depth):
            raise ValueError("depth does not match the parent column")
        if np.any((self.edge == 0) != ~has_parent):
            raise ValueError("roots must have edge 0 and other nodes a call or launch edge")
        if count and (self.name.min() < 0 or self.name.max() >= len(self.names)):
            raise ValueError("a name id is outside the symbol table")
