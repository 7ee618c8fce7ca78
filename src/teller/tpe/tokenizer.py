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
token) candidates, so both run in time near-linear in the number of nodes. The forest and both
merge loops are flat arrays and compiled code (`teller.tpe.kernels`): a merge applied costs a few
array writes, not tens of microseconds of Python.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from teller.atomic import write_text_atomic
from teller.callchain.tree import depths_of
from teller.errors import TraceError
from teller.ingest.schema import LAYERS
from teller.slices.slice import CommRelations, Slice
from teller.tpe import kernels
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
        # the merges as columns (parent, slot, edge, child) and a pair -> rank table, for kernels
        self._merge_columns = np.zeros((4, 0), dtype=np.int64)
        self._rank_table: kernels.Table | None = None

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
        self._merge_columns = np.asarray([m.pair for m in self.merges], dtype=np.int64).T.reshape(
            4, -1
        )
        self._rank_table = kernels.rank_table(*self._merge_columns)

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
        distinct = [_distinct_kinds(piece) for piece in slices]
        weights = _node_weights(slices, weighting)
        counts: dict[tuple[int, str], int] = {}
        for kinds, _, kind_counts in distinct:
            for key, seen in zip(kinds, kind_counts.tolist(), strict=True):
                counts[key] = counts.get(key, 0) + seen
        # a kind seen fewer than `min_count` times can join no merge; as `<unk-LAYER>` it shares
        # a token with the layer's other rare kinds, which can merge, and frees a vocabulary entry
        kept = [k for k, c in counts.items() if c >= min_count]
        room = vocab_size - len(UNK_NAMES)
        if len(kept) > room // 2:
            room = room // 2
        ranked = sorted(kept, key=lambda k: (-counts[k], k))
        tpe.base = ranked[:room]
        tpe._rebuild_indexes()
        forest = _forest(tpe, slices, distinct)
        bar = None
        if progress:  # the merges are learned in one compiled call: a bar of one step
            from tqdm import tqdm

            bar = tqdm(total=1, desc="learning merges", leave=False)
        learned, _ = kernels.train_merges(
            forest,
            weights,
            tpe.num_base,
            vocab_size - tpe.num_base,
            min_count,
            -1 if max_token_nodes is None else max_token_nodes,
        )
        if bar is not None:
            bar.update(1)
            bar.close()
        tpe.merges = [Merge(*row[:4]) for row in learned.tolist()]
        tpe.merge_counts = [row[4] for row in learned.tolist()]
        tpe._rebuild_indexes()
        return tpe

    # --- encoding / decoding ---------------------------------------------------------------

    def encode(self, piece: Slice) -> Tokens:
        """Tokens of one slice: merges applied in rank order, residuals kept for `decode`."""
        forest = _forest(self, [piece], [_distinct_kinds(piece)])
        kernels.encode_merges(forest, self._rank_table, *self._merge_columns, self.num_base)
        return _tokens(piece, forest)

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
            depth=depths_of(parent),
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


def _distinct_kinds(piece: Slice) -> tuple[list[tuple[int, str]], np.ndarray, np.ndarray]:
    """A slice's (layer, normalised kind) per distinct (layer, name id), each node's index into
    that list, and how many nodes each has: normalising once per name, not once per node."""
    codes = piece.name.astype(np.int64) * len(LAYERS) + piece.layer
    size = int(codes.max()) + 1 if len(codes) else 0
    if size <= 4 * len(codes) + 4096 and (size == 0 or codes.min() >= 0):  # small: count, not sort
        per_code = np.bincount(codes, minlength=size)
        unique = np.flatnonzero(per_code)
        dense = np.zeros(size, dtype=np.int64)
        dense[unique] = np.arange(len(unique))
        inverse, counts = dense[codes], per_code[unique]
    else:
        unique, inverse, counts = np.unique(codes, return_inverse=True, return_counts=True)
    kinds = [
        (layer, normalize(LAYERS[layer], piece.names[name]))
        for name, layer in zip(
            (unique // len(LAYERS)).tolist(), (unique % len(LAYERS)).tolist(), strict=True
        )
    ]
    return kinds, inverse.reshape(-1), counts


def _forest(
    tpe: TPE,
    slices: Sequence[Slice],
    distinct: Sequence[tuple[list[tuple[int, str]], np.ndarray, np.ndarray]],
) -> kernels.Forest:
    """The slices as one forest of one token per node, node ids global across the slices."""
    ids = tpe._kind_ids
    sizes = np.asarray([len(piece) for piece in slices], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    kind, parent, edge = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)], []
    for piece, (kinds, inverse, _), offset in zip(slices, distinct, offsets.tolist(), strict=False):
        kind_ids = np.asarray([ids.get(k, k[0]) for k in kinds], dtype=np.int64)
        kind.append(kind_ids[inverse])
        up = piece.parent.astype(np.int64)
        parent.append(np.where(up >= 0, up + offset, -1))
        edge.append(piece.edge.astype(np.int64))
    count = int(offsets[-1])
    is_start = np.zeros(count, dtype=np.bool_)
    is_start[offsets[:-1][offsets[:-1] < count]] = True
    return kernels.build_forest(
        np.concatenate(kind),
        np.concatenate(parent),
        np.concatenate([np.zeros(0, dtype=np.int64), *edge]),
        is_start,
    )


def _tokens(piece: Slice, forest: kernels.Forest) -> Tokens:
    """The `Tokens` of a slice's forest after merging."""
    kind, parent, slot, edge, roots, offsets, position = kernels.emit(forest)
    start = piece.start[position]
    end = start + piece.dur[position]
    if len(kind):
        span_start = np.minimum.reduceat(start, offsets[:-1])
        span_end = np.maximum.reduceat(end, offsets[:-1])
    else:
        span_start = span_end = np.zeros(0, dtype=np.int64)
    return Tokens(
        kind=kind.astype(np.int32),
        parent=parent.astype(np.int32),
        slot=slot.astype(np.int32),
        edge=edge.astype(np.int8),
        depth=piece.depth[roots].astype(np.int32),
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
