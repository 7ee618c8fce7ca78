"""Trace Pair Encoding (TPE): byte-pair encoding for call-chain slices, lossless.

BPE joins the most frequent pair of *adjacent* symbols into a new symbol, again and again. A slice
is a tree, so TPE joins the most frequent *parent → child* pair of token kinds instead, and, so
that a run of a thousand identical siblings (an optimizer's per-parameter ops, a backward pass's
kernels) costs log₂ 1000 merges rather than a thousand, also adjacent *sibling* pairs:

* the base alphabet is node kinds: a layer plus the normalised name (`teller.tpe.normalize`), and
  one `<unk-LAYER>` token per layer for kinds training never saw (or left out of a small
  vocabulary); the node's exact name always travels in the residual, so an unknown kind is never
  an error;
* a token covers a piece of the tree, its *pattern*: base kinds with parent links inside the
  piece; its roots (one, or several siblings) hang from one node of the parent token's pattern
  (`slot`) by one edge kind (call or launch);
* a pair is `(parent kind, slot, edge, child kind)`: a child token hanging from that slot of a
  parent token; or `(left kind, SIBLING, edge, right kind)`: two tokens next to each other under
  the same node by the same edge;
* a merge turns such a pair into one token of a new kind C = A + B. A parent absorbs one child
  per merge (the first in slice order); a sibling run "BBB" holds one "BB", as in BPE;
* the next merge is the pair of highest *score*: with the default "slice" weighting an
  occurrence in a slice of n nodes scores 1/n, its gain in that slice's R, so a structure that
  recurs in many small steps is not starved by the deep repeats of one huge step (plain BPE
  counting, "node" weighting, maximises the tokens saved over all nodes instead);
* merges are an ordered table; encoding applies them in that order, like minbpe's `encode`.

`Tokens` keeps, besides the token columns a model reads (kind, parent token, depth, span), the
per-node residuals that normalisation and merging drop: each node's original position, exact name,
rank, stream, start, duration and self time. `decode` rebuilds the slice from those exactly.

Training keeps a pair → count table and a pair → owner-token index and updates them only around
each merge (a lazy max-heap picks the next pair); encoding uses one heap of (merge rank, owner
token) candidates, so both run in time near-linear in the number of nodes.
"""

from __future__ import annotations

import heapq
import json
from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from teller.atomic import write_text_atomic
from teller.errors import TraceError
from teller.ingest.schema import LAYERS
from teller.slices.slice import CommRelations, Slice
from teller.tpe.normalize import normalize

FORMAT = "teller.tpe/1"
#: One unknown-kind token per layer, ids 0..len(LAYERS)-1, so unseen names keep their layer.
UNK_NAMES: tuple[str, ...] = tuple(f"<unk-{layer}>" for layer in LAYERS)
#: A merge must be seen at least this often (BPE on trees overfits singletons otherwise).
DEFAULT_MIN_COUNT = 2

#: How merge selection weighs a pair occurrence (`_node_weights`): per node or per slice.
WEIGHTINGS = ("slice", "node")
DEFAULT_WEIGHTING = "slice"

#: The `slot` of a sibling merge: the child token is the parent token's next sibling.
SIBLING = -1

Key = tuple[int, int, int]  # (slot, edge, child kind) as seen from a parent token
Pair = tuple[int, int, int, int]  # (parent kind, slot, edge, child kind)


@dataclass(frozen=True)
class Merge:
    """A merge: a `parent` kind token absorbs a `child` kind token hanging from its `slot` by
    `edge`, or, with `slot` = SIBLING, the `child` kind token right after it under one node."""

    parent: int
    slot: int
    edge: int
    child: int

    @property
    def pair(self) -> Pair:
        return (self.parent, self.slot, self.edge, self.child)


@dataclass(eq=False)
class Tokens:
    """An encoded slice: token columns plus the per-node residuals that make decoding exact.

    Token `i` covers residual rows `offsets[i]:offsets[i+1]`, one per node of its pattern in
    pattern order. `parent` is a token index (-1 for a root token), `slot` the node of the parent
    token's pattern it hangs from, `depth` the depth of its root node in the slice, and
    `start_ns`/`dur_ns` the span of all its nodes.
    """

    kind: np.ndarray  # int32 vocabulary ids
    parent: np.ndarray  # int32
    slot: np.ndarray  # int32
    edge: np.ndarray  # int8
    depth: np.ndarray  # int32
    start_ns: np.ndarray  # int64
    dur_ns: np.ndarray  # int64
    offsets: np.ndarray  # int64, len(tokens) + 1
    # residuals, one row per node, token by token
    position: np.ndarray  # int32, the node's index in the slice
    name: np.ndarray  # int32 ids into `names`
    rank: np.ndarray  # int32
    stream: np.ndarray  # int32
    node_start_ns: np.ndarray  # int64
    node_dur_ns: np.ndarray  # int64
    node_self_ns: np.ndarray  # int64
    tree_node: np.ndarray  # int64 provenance (not needed to decode the slice itself)
    names: list[str]
    comm: CommRelations = field(default_factory=CommRelations.empty)
    slice_kind: str = "nodes"
    steps: tuple[int, ...] = ()
    focus: int = -1

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def num_nodes(self) -> int:
        return len(self.position)

    @property
    def reduction(self) -> float:
        """R = 1 - tokens / nodes (0 for an empty slice)."""
        return 1.0 - len(self) / self.num_nodes if self.num_nodes else 0.0

    def residual_bytes(self, provenance: bool = False) -> int:
        """Bytes of the per-node residual columns (plus the names table as UTF-8)."""
        columns = [
            self.position,
            self.name,
            self.rank,
            self.stream,
            self.node_start_ns,
            self.node_dur_ns,
            self.node_self_ns,
        ]
        if provenance:
            columns.append(self.tree_node)
        return sum(c.nbytes for c in columns) + sum(len(n.encode()) for n in self.names)


class TPE:
    """A trained Trace Pair Encoding vocabulary: base kinds, then merges, in id order."""

    def __init__(self) -> None:
        self.base: list[tuple[int, str]] = []  # (layer code, kind name) for ids after the unks
        self.merges: list[Merge] = []
        self.merge_counts: list[int] = []  # how often each merge applied in training
        self._kind_ids: dict[tuple[int, str], int] = {}
        self._ranks: dict[Pair, int] = {}
        self._pattern_cache: dict[int, tuple[list[int], list[int], list[int]]] = {}
        # merges a fresh forest can hold (slot 0 or SIBLING) as sorted `_fresh_pair_keys`, ranks
        self._fresh_keys = np.zeros(0, dtype=np.int64)
        self._fresh_ranks = np.zeros(0, dtype=np.int64)

    # --- vocabulary ------------------------------------------------------------------------

    @property
    def num_base(self) -> int:
        return len(UNK_NAMES) + len(self.base)

    @property
    def vocab_size(self) -> int:
        return self.num_base + len(self.merges)

    def merge_id(self, rank: int) -> int:
        return self.num_base + rank

    def _rebuild_indexes(self) -> None:
        self._kind_ids = {kind: len(UNK_NAMES) + i for i, kind in enumerate(self.base)}
        self._ranks = {m.pair: r for r, m in enumerate(self.merges)}
        self._pattern_cache = {}
        fresh = [(r, m) for r, m in enumerate(self.merges) if m.slot in (0, SIBLING)]
        keys = _fresh_pair_keys(
            np.asarray([m.parent for _, m in fresh], dtype=np.int64),
            np.asarray([m.slot == SIBLING for _, m in fresh], dtype=bool),
            np.asarray([m.edge for _, m in fresh], dtype=np.int64),
            np.asarray([m.child for _, m in fresh], dtype=np.int64),
            self.vocab_size,
        )
        order = np.argsort(keys, kind="stable")
        self._fresh_keys = keys[order]
        self._fresh_ranks = np.asarray([r for r, _ in fresh], dtype=np.int64)[order]

    def kind_id(self, layer: int, name: str) -> int:
        """Base token of a node: its kind's id, or its layer's `<unk-…>` token."""
        return self._kind_ids.get((layer, normalize(LAYERS[layer], name)), layer)

    def base_layer(self, token: int) -> int:
        return token if token < len(UNK_NAMES) else self.base[token - len(UNK_NAMES)][0]

    def token_name(self, token: int) -> str:
        """Readable name of a base token (`layer:kind`) or `merge#N` for merged tokens."""
        if token < len(UNK_NAMES):
            return UNK_NAMES[token]
        if token < self.num_base:
            layer, name = self.base[token - len(UNK_NAMES)]
            return f"{LAYERS[layer]}:{name}"
        return f"merge#{token - self.num_base}"

    def pattern(self, token: int) -> tuple[list[int], list[int], list[int]]:
        """The nodes a token stands for: base kinds, parent within the pattern (-1 root), edges."""
        cached = self._pattern_cache.get(token)
        if cached is not None:
            return cached
        if token < self.num_base:
            result: tuple[list[int], list[int], list[int]] = ([token], [-1], [0])
        else:
            merge = self.merges[token - self.num_base]
            kinds, parents, edges = (list(x) for x in self.pattern(merge.parent))
            offset = len(kinds)
            child_kinds, child_parents, child_edges = self.pattern(merge.child)
            kinds.extend(child_kinds)
            if merge.slot == SIBLING:  # a second root beside the first: same parent node, edge
                parents.extend(-1 if p < 0 else p + offset for p in child_parents)
                edges.extend(child_edges)
            else:
                parents.extend(merge.slot if p < 0 else p + offset for p in child_parents)
                edges.extend(
                    merge.edge if p < 0 else e
                    for p, e in zip(child_parents, child_edges, strict=True)
                )
            result = (kinds, parents, edges)
        self._pattern_cache[token] = result
        return result

    def pattern_length(self, token: int) -> int:
        return len(self.pattern(token)[0])

    # --- training --------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        slices: Iterable[Slice],
        vocab_size: int,
        min_count: int = DEFAULT_MIN_COUNT,
        progress: bool = False,
        max_token_nodes: int | None = None,
        weighting: str = DEFAULT_WEIGHTING,
    ) -> TPE:
        """Learn a vocabulary of at most `vocab_size` tokens from `slices`.

        The base alphabet is every node kind seen at least `min_count` times, most frequent
        first; when there are more kinds than half of the vocabulary leaves room for, the rarest
        become `<unk-LAYER>` (their exact names still round-trip) so the other half is left for
        merges. Merges are then learned until the vocabulary is full or no pair is seen
        `min_count` times. `max_token_nodes` caps the nodes one token may stand for (None: no
        cap; very regular traces then learn whole steps as one token). `weighting` picks what the next merge maximises: "slice" (default)
        the mean reduction per slice, "node" the tokens saved over all nodes (`_node_weights`).
        """
        slices = list(slices)
        if vocab_size < len(UNK_NAMES):
            raise ValueError(f"vocab_size must be at least {len(UNK_NAMES)} (one <unk> per layer)")
        tpe = cls()
        layer_codes, kind_names = _node_kinds(slices)
        weights = _node_weights(slices, weighting)
        counts: dict[tuple[int, str], int] = {}
        for layers, kinds in zip(layer_codes, kind_names, strict=True):
            for key in zip(layers.tolist(), kinds, strict=True):
                counts[key] = counts.get(key, 0) + 1
        # a kind seen fewer than `min_count` times can join no merge; as `<unk-LAYER>` it shares
        # a token with the layer's other rare kinds, which can merge, and frees a vocabulary entry
        kept = [k for k, c in counts.items() if c >= min_count]
        room = vocab_size - len(UNK_NAMES)
        if len(kept) > room // 2:
            room = room // 2
        ranked = sorted(kept, key=lambda k: (-counts[k], k))
        tpe.base = ranked[:room]
        tpe._rebuild_indexes()
        forest = _Forest.from_slices(tpe, slices, layer_codes, kind_names)
        trainer = _Trainer(tpe, forest, max_token_nodes, weights)
        trainer.run(vocab_size - tpe.num_base, min_count, progress)
        tpe._rebuild_indexes()
        return tpe

    # --- encoding / decoding ---------------------------------------------------------------

    def encode(self, piece: Slice) -> Tokens:
        """Tokens of one slice: merges applied in rank order, residuals kept for `decode`."""
        layer_codes, kind_names = _node_kinds([piece])
        forest = _Forest.from_slices(self, [piece], layer_codes, kind_names)
        forest.apply_merges(self)
        return forest.emit(piece)

    def decode(self, tokens: Tokens) -> Slice:
        """The slice `tokens` came from, exactly: structure, names, times, ranks and relations."""
        count_tokens = len(tokens)
        count_nodes = tokens.num_nodes
        kinds = tokens.kind.astype(np.int64)
        lengths = np.diff(tokens.offsets)
        unique = np.unique(kinds)
        flat_kinds: list[int] = []
        flat_parents: list[int] = []
        flat_edges: list[int] = []
        pattern_start = np.zeros(self.vocab_size + 1, dtype=np.int64)
        for token in unique.tolist():
            if token >= self.vocab_size:
                raise ValueError(f"token id {token} is outside this vocabulary ({self.vocab_size})")
            kinds_t, parents_t, edges_t = self.pattern(token)
            pattern_start[token] = len(flat_kinds)
            flat_kinds.extend(kinds_t)
            flat_parents.extend(parents_t)
            flat_edges.extend(edges_t)
        expected = np.asarray([self.pattern_length(t) for t in kinds.tolist()], dtype=np.int64)
        if not np.array_equal(expected, lengths):
            raise ValueError("token lengths do not match this vocabulary's patterns")
        pat_kind = np.asarray(flat_kinds, dtype=np.int64)
        pat_parent = np.asarray(flat_parents, dtype=np.int64)
        pat_edge = np.asarray(flat_edges, dtype=np.int8)
        owner = np.repeat(np.arange(count_tokens), lengths)
        within = np.arange(count_nodes) - tokens.offsets[:-1][owner]
        source = pattern_start[kinds][owner] + within
        parent_token = tokens.parent.astype(np.int64)
        root_parent_row = np.where(
            parent_token >= 0, tokens.offsets[:-1][np.maximum(parent_token, 0)] + tokens.slot, -1
        )
        is_root = pat_parent[source] < 0  # a token's roots all hang from its slot by its edge
        parent_row = np.where(
            is_root, root_parent_row[owner], tokens.offsets[:-1][owner] + pat_parent[source]
        )
        edge_row = np.where(is_root, tokens.edge[owner], pat_edge[source]).astype(np.int8)
        base_layers = np.asarray([self.base_layer(t) for t in range(self.num_base)], dtype=np.int8)
        layer_row = base_layers[pat_kind[source]] if count_nodes else np.zeros(0, np.int8)
        position = tokens.position.astype(np.int64)
        parent = np.full(count_nodes, -1, dtype=np.int32)
        has_parent = parent_row >= 0
        parent[position[has_parent]] = position[parent_row[has_parent]]
        edge = np.zeros(count_nodes, dtype=np.int8)
        edge[position] = edge_row
        layer = np.zeros(count_nodes, dtype=np.int8)
        layer[position] = layer_row

        def scatter(values: np.ndarray, dtype: type) -> np.ndarray:
            out = np.zeros(count_nodes, dtype=dtype)
            out[position] = values
            return out

        return Slice(
            parent=parent,
            edge=edge,
            depth=_depths(parent),
            layer=layer,
            name=scatter(tokens.name, np.int32),
            rank=scatter(tokens.rank, np.int32),
            stream=scatter(tokens.stream, np.int32),
            start=scatter(tokens.node_start_ns, np.int64),
            dur=scatter(tokens.node_dur_ns, np.int64),
            self_ns=scatter(tokens.node_self_ns, np.int64),
            tree_node=scatter(tokens.tree_node, np.int64),
            names=list(tokens.names),
            comm=tokens.comm,
            kind=tokens.slice_kind,
            steps=tokens.steps,
            focus=tokens.focus,
        )

    # --- persistence -----------------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "layers": list(LAYERS),
            "base": [[LAYERS[layer], name] for layer, name in self.base],
            "merges": [[m.parent, m.slot, m.edge, m.child] for m in self.merges],
            "merge_counts": self.merge_counts,
        }

    def save(self, path: str | Path) -> None:
        """Write the vocabulary as JSON, atomically (a failed write leaves no file behind)."""
        write_text_atomic(path, json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: str | Path) -> TPE:
        """Read a vocabulary written by `save`; a bad file raises TraceError naming what is wrong."""
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise TraceError(path, "no such vocabulary file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise TraceError(path, f"not a TPE vocabulary (invalid JSON: {error})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise TraceError(path, f"not a TPE vocabulary (expected format {FORMAT!r})")
        if data.get("layers") != list(LAYERS):
            raise TraceError(path, "vocabulary was written for another set of layers")
        tpe = cls()
        try:
            tpe.base = [(LAYERS.index(layer), str(name)) for layer, name in data["base"]]
            tpe.merges = [Merge(*(int(v) for v in m)) for m in data["merges"]]
            tpe.merge_counts = [int(c) for c in data.get("merge_counts", [])]
        except (KeyError, TypeError, ValueError) as error:
            raise TraceError(path, f"malformed vocabulary: {error}") from None
        for rank, merge in enumerate(tpe.merges):
            limit = tpe.merge_id(rank)
            if not (0 <= merge.parent < limit and 0 <= merge.child < limit):
                raise TraceError(path, f"merge {rank} refers to a token not defined before it")
            if merge.slot != SIBLING and not 0 <= merge.slot < tpe.pattern_length(merge.parent):
                raise TraceError(path, f"merge {rank} hangs from a slot outside its parent")
        tpe._rebuild_indexes()
        return tpe


# --- the token forest both training and encoding work on ----------------------------------------


def _node_kinds(slices: Sequence[Slice]) -> tuple[list[np.ndarray], list[list[str]]]:
    """Per slice, the layer codes and normalised kind names of its nodes."""
    layers_out, kinds_out = [], []
    for piece in slices:
        layer_names = [LAYERS[code] for code in range(len(LAYERS))]
        by_name: dict[tuple[int, int], str] = {}
        kinds: list[str] = []
        for layer, name in zip(piece.layer.tolist(), piece.name.tolist(), strict=True):
            key = (layer, name)
            kind = by_name.get(key)
            if kind is None:
                kind = by_name[key] = normalize(layer_names[layer], piece.names[name])
            kinds.append(kind)
        layers_out.append(piece.layer)
        kinds_out.append(kinds)
    return layers_out, kinds_out


class _Forest:
    """Tokens as a mutable forest. A token is named by its first root node's index (global across
    the slices), so the order of tokens is the order of their root nodes.

    Tokens hanging from the same node (the same parent token and slot; for slice roots, the same
    slice) are linked in slice order (`prev`/`next`), so sibling merges see who is adjacent.
    """

    def __init__(
        self, kind: list[int], parent: list[int], edge: list[int], slice_starts: list[int]
    ) -> None:
        count = len(kind)
        self.kind = kind
        self.parent = parent
        self.slot = [0] * count
        self.edge = edge
        self.alive = [True] * count
        self.nodes: list[list[int]] = [[i] for i in range(count)]
        self.children: list[dict[Key, list[int]] | None] = [None] * count
        self.prev = [-1] * count
        self.next = [-1] * count
        last_child = [-1] * count
        starts = set(slice_starts)
        last_root = -1
        for node, p in enumerate(parent):  # node order: children and roots arrive sorted
            if node in starts:
                last_root = -1
            if p >= 0:
                table = self.children[p]
                if table is None:
                    table = self.children[p] = {}
                table.setdefault((0, edge[node], kind[node]), []).append(node)
                before = last_child[p]
                last_child[p] = node
            else:
                before = last_root
                last_root = node
            if before >= 0:
                self.prev[node] = before
                self.next[before] = node

    @classmethod
    def from_slices(
        cls,
        tpe: TPE,
        slices: Sequence[Slice],
        layer_codes: Sequence[np.ndarray],
        kind_names: Sequence[list[str]],
    ) -> _Forest:
        kind: list[int] = []
        parent: list[int] = []
        edge: list[int] = []
        starts: list[int] = []
        offset = 0
        ids = tpe._kind_ids
        for piece, layers, names in zip(slices, layer_codes, kind_names, strict=True):
            starts.append(offset)
            kind.extend(
                ids.get((layer, name), layer)
                for layer, name in zip(layers.tolist(), names, strict=True)
            )
            parent.extend(p + offset if p >= 0 else -1 for p in piece.parent.tolist())
            edge.extend(piece.edge.tolist())
            offset += len(piece)
        return cls(kind, parent, edge, starts)

    # --- the pairs a token owns: as a parent (one per child key) and as a left sibling ---------

    def child_pairs(self, token: int, keys: Sequence[Key] | None = None) -> list[Pair]:
        table = self.children[token]
        if not table:
            return []
        kind = self.kind[token]
        if keys is None:
            return [(kind, *key) for key in table]
        return [(kind, *key) for key in keys if key in table]

    def sibling_pair(self, token: int) -> list[Pair]:
        after = self.next[token]
        if after < 0 or self.edge[after] != self.edge[token]:
            return []
        return [(self.kind[token], SIBLING, self.edge[token], self.kind[after])]

    def owned(self, token: int) -> list[Pair]:
        return self.child_pairs(token) + self.sibling_pair(token)

    def applicable(self, token: int, merge: Merge) -> bool:
        """Whether `merge` applies with `token` as its parent (or left sibling) right now."""
        if not self.alive[token] or self.kind[token] != merge.parent:
            return False
        if merge.slot == SIBLING:
            after = self.next[token]
            return (
                after >= 0
                and self.kind[after] == merge.child
                and self.edge[token] == merge.edge == self.edge[after]
            )
        table = self.children[token]
        return bool(table) and (merge.slot, merge.edge, merge.child) in table

    # --- the two merges ------------------------------------------------------------------------

    def absorb(self, token: int, key: Key, new_kind: int) -> int:
        """Merge the first child of `token` under `key` into it; returns the absorbed child."""
        table = self.children[token]
        assert table is not None
        siblings = table[key]
        child = siblings.pop(0)
        if not siblings:
            del table[key]
        self._unlink(child)
        self._take_over(token, child)
        self._rekind(token, new_kind)
        return child

    def join(self, token: int, new_kind: int) -> int:
        """Merge `token` with its next sibling into one token; returns the sibling."""
        sibling = self.next[token]
        up = self.parent[token]
        if up >= 0:
            up_table = self.children[up]
            assert up_table is not None
            key = (self.slot[sibling], self.edge[sibling], self.kind[sibling])
            _remove_sorted(up_table, key, sibling)
        self._unlink(sibling)
        self._take_over(token, sibling)
        self._rekind(token, new_kind)
        return sibling

    def _unlink(self, token: int) -> None:
        before, after = self.prev[token], self.next[token]
        if before >= 0:
            self.next[before] = after
        if after >= 0:
            self.prev[after] = before
        self.prev[token] = self.next[token] = -1

    def _take_over(self, token: int, other: int) -> None:
        """`token` takes `other`'s nodes and children (their slots shift past its own nodes)."""
        offset = len(self.nodes[token])
        self.nodes[token].extend(self.nodes[other])
        self.nodes[other] = []
        grandchildren = self.children[other]
        if grandchildren:
            table = self.children[token]
            if table is None:
                table = self.children[token] = {}
            for (slot, edge, kind), ids in grandchildren.items():
                for g in ids:
                    self.parent[g] = token
                    self.slot[g] = slot + offset
                table[(slot + offset, edge, kind)] = ids
        self.children[other] = None
        self.alive[other] = False

    def _rekind(self, token: int, new_kind: int) -> None:
        old_kind = self.kind[token]
        self.kind[token] = new_kind
        up = self.parent[token]
        if up >= 0:
            up_table = self.children[up]
            assert up_table is not None
            _remove_sorted(up_table, (self.slot[token], self.edge[token], old_kind), token)
            insort(up_table.setdefault((self.slot[token], self.edge[token], new_kind), []), token)

    def apply(
        self, token: int, merge: Merge, new_kind: int
    ) -> list[tuple[int, Sequence[Key] | None]]:
        """Apply `merge` at `token`; returns the owners whose pairs changed (with the parent keys
        that changed for the parent above, None meaning all of a token's pairs)."""
        up = self.parent[token]
        before = self.prev[token]
        slot, edge = self.slot[token], self.edge[token]
        if merge.slot == SIBLING:
            gone_kind = self.kind[self.next[token]]
            up_keys = [(slot, edge, merge.parent)]
            if gone_kind != merge.parent:
                up_keys.append((slot, edge, gone_kind))
            self.join(token, new_kind)
            affected: list[tuple[int, Sequence[Key] | None]] = [(token, None)]
        else:
            key = (merge.slot, merge.edge, merge.child)
            child = self.children[token][key][0]  # type: ignore[index]
            child_before = self.prev[child]
            up_keys = [(slot, edge, merge.parent)]
            self.absorb(token, key, new_kind)
            affected = [(token, None)]
            if child_before >= 0:
                affected.append((child_before, ()))
        if before >= 0:
            affected.append((before, ()))
        if up >= 0:  # the new kind is none of the old ones: the keys stay distinct
            affected.append((up, [*up_keys, (slot, edge, new_kind)]))
        return affected

    def pairs_of(self, token: int, keys: Sequence[Key] | None) -> list[Pair]:
        """Pairs owned by `token`: all (keys None), its sibling pair only (keys empty), or its
        child pairs under `keys`."""
        if not self.alive[token]:
            return []
        if keys is None:
            return self.owned(token)
        if not keys:
            return self.sibling_pair(token)
        return self.child_pairs(token, keys)

    def apply_merges(self, tpe: TPE) -> None:
        """Apply `tpe`'s merges in rank order with one heap of (rank, owner token) candidates, on
        a fresh forest (one token per node).

        A merge only creates candidates of higher rank (it makes a new kind) except where it
        makes two old tokens adjacent; training never revisits an earlier merge, so such
        candidates are dropped. Popping the heap thus visits merges in rank order and, within a
        rank, owners in token order: the order training applied them in.
        """
        ranks = tpe._ranks
        if not ranks:
            return
        heap = self._fresh_candidates(tpe)
        merges = tpe.merges
        num_base = tpe.num_base
        current = -1
        rank_of = ranks.get
        pop, push = heapq.heappop, heapq.heappush
        applicable, apply, pairs_of = self.applicable, self.apply, self.pairs_of
        while heap:
            rank, token = pop(heap)
            if rank < current:
                continue
            current = rank
            merge = merges[rank]
            if not applicable(token, merge):
                continue
            for owner, keys in apply(token, merge, num_base + rank):
                for pair in pairs_of(owner, keys):
                    found = rank_of(pair)
                    if found is not None and found > rank:
                        push(heap, (found, owner))

    def _fresh_candidates(self, tpe: TPE) -> list[tuple[int, int]]:
        """(rank, owner) of each merge a fresh forest holds, sorted (so already a heap).

        One Python step per node was a sixth of encoding; here every parent → child and
        sibling pair is packed into one integer key and looked up in the sorted merge keys at
        once.
        """
        if not len(tpe._fresh_keys):
            return []
        kind = np.asarray(self.kind, dtype=np.int64)
        parent = np.asarray(self.parent, dtype=np.int64)
        edge = np.asarray(self.edge, dtype=np.int64)
        after = np.asarray(self.next, dtype=np.int64)
        child = np.flatnonzero(parent >= 0)
        left = np.flatnonzero(after >= 0)
        left = left[edge[after[left]] == edge[left]]
        owners = np.concatenate([parent[child], left])
        keys = _fresh_pair_keys(
            kind[owners],
            np.repeat([False, True], [len(child), len(left)]),
            np.concatenate([edge[child], edge[left]]),
            np.concatenate([kind[child], kind[after[left]]]),
            tpe.vocab_size,
        )
        found = np.minimum(np.searchsorted(tpe._fresh_keys, keys), len(tpe._fresh_keys) - 1)
        hit = tpe._fresh_keys[found] == keys
        count = len(self.kind)
        candidates = np.unique(tpe._fresh_ranks[found[hit]] * count + owners[hit])
        return list(zip((candidates // count).tolist(), (candidates % count).tolist(), strict=True))

    def emit(self, piece: Slice) -> Tokens:
        roots = [t for t, alive in enumerate(self.alive) if alive]
        index = {t: i for i, t in enumerate(roots)}
        rows = [n for t in roots for n in self.nodes[t]]
        lengths = [len(self.nodes[t]) for t in roots]
        offsets = np.zeros(len(roots) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        position = np.asarray(rows, dtype=np.int64)
        start = piece.start[position]
        end = start + piece.dur[position]
        root_array = np.asarray(roots, dtype=np.int64)
        if len(roots):
            span_start = np.minimum.reduceat(start, offsets[:-1])
            span_end = np.maximum.reduceat(end, offsets[:-1])
        else:
            span_start = span_end = np.zeros(0, dtype=np.int64)
        parents = [self.parent[t] for t in roots]
        return Tokens(
            kind=np.asarray([self.kind[t] for t in roots], dtype=np.int32),
            parent=np.asarray([index[p] if p >= 0 else -1 for p in parents], dtype=np.int32),
            slot=np.asarray([self.slot[t] for t in roots], dtype=np.int32),
            edge=np.asarray([self.edge[t] for t in roots], dtype=np.int8),
            depth=piece.depth[root_array].astype(np.int32),
            start_ns=span_start.astype(np.int64),
            dur_ns=(span_end - span_start).astype(np.int64),
            offsets=offsets,
            position=position.astype(np.int32),
            name=piece.name[position].astype(np.int32),
            rank=piece.rank[position].astype(np.int32),
            stream=piece.stream[position].astype(np.int32),
            node_start_ns=start.astype(np.int64),
            node_dur_ns=piece.dur[position].astype(np.int64),
            node_self_ns=piece.self_ns[position].astype(np.int64),
            tree_node=piece.tree_node[position].astype(np.int64),
            names=list(piece.names),
            comm=piece.comm,
            slice_kind=piece.kind,
            steps=piece.steps,
            focus=piece.focus,
        )


def _fresh_pair_keys(
    parent: np.ndarray, sibling: np.ndarray, edge: np.ndarray, child: np.ndarray, vocab_size: int
) -> np.ndarray:
    """One int64 per pair of slot 0 or SIBLING (the only slots a fresh forest has): kinds are
    below `vocab_size`, edges fit a byte."""
    return ((parent * 2 + sibling) * 256 + (edge & 0xFF)) * vocab_size + child


def _remove_sorted(table: dict[Key, list[int]], key: Key, token: int) -> None:
    ids = table[key]
    del ids[bisect_left(ids, token)]
    if not ids:
        del table[key]


class _Trainer:
    """Greedy merge learning with incremental pair counts.

    `where[pair]` holds the owner tokens that have the pair (a parent with a child under the
    pair's key, or a left sibling next to a right one), so its size is the pair's count;
    `score[pair]` is the sum of the owners' weights (their slice's weight, `_node_weights`), which
    is what the next merge maximises. A merge changes the pairs of a handful of owners (the token,
    the one it absorbed, the parent above, the left neighbours), so only theirs are taken out
    before and put back after.
    """

    def __init__(
        self,
        tpe: TPE,
        forest: _Forest,
        max_token_nodes: int | None = None,
        weights: np.ndarray | None = None,
    ) -> None:
        self.tpe = tpe
        self.forest = forest
        self.max_token_nodes = max_token_nodes
        self.token_nodes = [1] * tpe.num_base  # nodes per vocabulary entry, merges appended
        # a token is named by one of its slice's nodes, so a node's weight is its token's
        self.weight: list[float] = [1.0] * len(forest.kind) if weights is None else weights.tolist()
        self.score: dict[Pair, float] = {}
        self.where: dict[Pair, set[int]] = {}
        self.merged: set[Pair] = set()
        self.touched: set[Pair] = set()
        for token in range(len(forest.kind)):
            for pair in forest.owned(token):
                self._add(pair, token)
        self.heap = [(-score, pair) for pair, score in self.score.items()]
        heapq.heapify(self.heap)
        self.touched.clear()

    @property
    def count(self) -> dict[Pair, int]:
        """How many owners have each pair (for tests; training reads `where` sizes)."""
        return {pair: len(owners) for pair, owners in self.where.items()}

    def _add(self, pair: Pair, token: int) -> None:
        owners = self.where.get(pair)
        if owners is None:
            self.where[pair] = {token}
            self.score[pair] = self.weight[token]
        else:
            owners.add(token)
            self.score[pair] += self.weight[token]
        self.touched.add(pair)

    def _remove(self, pair: Pair, token: int) -> None:
        owners = self.where[pair]
        if len(owners) > 1:
            owners.discard(token)
            self.score[pair] -= self.weight[token]
        else:  # deleted, not decremented: float sums must not leave a ghost of a gone pair
            del self.score[pair]
            del self.where[pair]
        self.touched.add(pair)

    def _best(self, min_count: int) -> Pair | None:
        """The unmerged pair of highest score seen at least `min_count` times, or None.

        Heap entries are lazy: one is current when its score is the pair's score now. A pair seen
        too rarely is dropped from the heap; if it grows later it is touched and pushed again.
        """
        while self.heap:
            negative, pair = self.heap[0]
            if pair not in self.merged and self.score.get(pair) == -negative:
                if not self._fits(pair):
                    self.merged.add(pair)  # too big now, too big forever: kinds never grow
                elif len(self.where[pair]) >= min_count:
                    return pair
            heapq.heappop(self.heap)
        return None

    def _fits(self, pair: Pair) -> bool:
        if self.max_token_nodes is None:
            return True
        size = self.token_nodes[pair[0]] + self.token_nodes[pair[3]]
        return size <= self.max_token_nodes

    def run(self, max_merges: int, min_count: int, progress: bool) -> None:
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=max_merges, desc="learning merges", unit="merge", leave=False)
        tpe = self.tpe
        while len(tpe.merges) < max_merges:
            best = self._best(min_count)
            if best is None:
                break
            merge = Merge(*best)
            new_kind = tpe.num_base + len(tpe.merges)
            tpe.merges.append(merge)
            self.merged.add(merge.pair)
            self.token_nodes.append(self.token_nodes[merge.parent] + self.token_nodes[merge.child])
            tpe.merge_counts.append(self._merge(merge, new_kind))
            for changed in self.touched:
                score = self.score.get(changed)
                if score is not None and changed not in self.merged:
                    heapq.heappush(self.heap, (-score, changed))
            self.touched.clear()
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()

    def _merge(self, merge: Merge, new_kind: int) -> int:
        """Apply one merge everywhere, in token order; returns how often it applied (fewer than
        counted when a run of same-kind tokens shares occurrences, as "aaa" holds one "aa")."""
        forest = self.forest
        applied = 0
        for token in sorted(self.where.get(merge.pair, ())):
            if not forest.applicable(token, merge):
                continue
            affected = self._predict(token, merge, new_kind)
            for owner, keys in affected:
                for pair in forest.pairs_of(owner, keys):
                    self._remove(pair, owner)
            dead = forest.next[token] if merge.slot == SIBLING else None
            if dead is None:
                table = forest.children[token]
                assert table is not None
                dead = table[(merge.slot, merge.edge, merge.child)][0]
            for pair in forest.owned(dead):
                self._remove(pair, dead)
            after = forest.apply(token, merge, new_kind)
            applied += 1
            for owner, keys in after:
                for pair in forest.pairs_of(owner, keys):
                    self._add(pair, owner)
        return applied

    def _predict(
        self, token: int, merge: Merge, new_kind: int
    ) -> list[tuple[int, Sequence[Key] | None]]:
        """The owners (and parent keys) `forest.apply` will report, before applying it."""
        forest = self.forest
        affected: list[tuple[int, Sequence[Key] | None]] = [(token, None)]
        slot, edge = forest.slot[token], forest.edge[token]
        kinds = [merge.parent]
        if merge.slot == SIBLING:
            kinds.append(merge.child)
        else:
            table = forest.children[token]
            assert table is not None
            child = table[(merge.slot, merge.edge, merge.child)][0]
            if forest.prev[child] >= 0:
                affected.append((forest.prev[child], ()))
        if forest.prev[token] >= 0:
            affected.append((forest.prev[token], ()))
        if forest.parent[token] >= 0:
            keys = [(slot, edge, kind) for kind in dict.fromkeys(kinds)]
            affected.append((forest.parent[token], [*keys, (slot, edge, new_kind)]))
        return affected

    def recount_scores(self) -> dict[Pair, float]:
        """Pair scores from scratch (for tests: the incremental scores must match this)."""
        scores: dict[Pair, float] = {}
        for token in range(len(self.forest.kind)):
            for pair in self.forest.pairs_of(token, None):
                scores[pair] = scores.get(pair, 0.0) + self.weight[token]
        return scores

    def recount(self) -> dict[Pair, int]:
        """Pair counts from scratch (for tests: the incremental table must always equal this)."""
        counts: dict[Pair, int] = {}
        for token in range(len(self.forest.kind)):
            for pair in self.forest.pairs_of(token, None):
                counts[pair] = counts.get(pair, 0) + 1
        return counts


def _node_weights(slices: Sequence[Slice], weighting: str) -> np.ndarray:
    """Each node's weight in merge selection, by `weighting` (see `WEIGHTINGS`).

    "node": every pair occurrence counts 1, so merges maximise the tokens saved over the whole
    corpus; its biggest slices (a 58k-node serving step) then take the vocabulary, and the
    small steps' structures, seen a few times each, never reach the top. "slice": an occurrence
    in a slice of n nodes counts 1/n, the gain in that slice's R = 1 - tokens/nodes, so merges
    maximise the mean R per slice (per step), which is what a model reading one step sees.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, not {weighting!r}")
    sizes = [len(piece) for piece in slices]
    if weighting == "node":
        return np.ones(sum(sizes), dtype=np.float64)
    return np.repeat([1.0 / max(n, 1) for n in sizes], sizes).astype(np.float64)


def _depths(parent: np.ndarray) -> np.ndarray:
    """Depth of every node when parents come before children."""
    depth = [0] * len(parent)
    for i, p in enumerate(parent.tolist()):
        if p >= 0:
            depth[i] = depth[p] + 1
    return np.asarray(depth, dtype=np.int32)
