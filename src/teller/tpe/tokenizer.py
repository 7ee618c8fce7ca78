"""Trace Pair Encoding (TPE): byte-pair encoding for call-chain slices, lossless.

BPE joins the most frequent pair of *adjacent* symbols into a new symbol, again and again. A slice
is a tree, so TPE joins the most frequent *parent → child* pair of token kinds instead:

* the base alphabet is node kinds: a layer plus the normalised name (`teller.tpe.normalize`), and
  one `<unk-LAYER>` token per layer for kinds training never saw (or left out of a small
  vocabulary); the node's exact name always travels in the residual, so an unknown kind is never
  an error;
* a token covers a connected piece of the tree, its *pattern*: base kinds with parent links inside
  the piece. A token hangs from one node of its parent token's pattern (`slot`) by a call or launch
  edge, so a pair is `(parent kind, slot, edge, child kind)`;
* a merge turns a parent token of kind A with a child of kind B at (slot, edge) into one token of a
  new kind C = A + B; a parent absorbs one such child per merge (the first in slice order), as BPE
  joins "aa" once per position;
* merges are an ordered table; encoding applies them in that order, like minbpe's `encode`.

`Tokens` keeps, besides the token columns a model reads (kind, parent token, depth, span), the
per-node residuals that normalisation and merging drop: each node's original position, exact name,
rank, stream, start, duration and self time. `decode` rebuilds the slice from those exactly.

Training keeps a pair → count table and a pair → parent-token index and updates them only around
each merge (a lazy max-heap picks the next pair); encoding uses one heap of (merge rank, parent
token) candidates, so both run in time near-linear in the number of nodes.
"""

from __future__ import annotations

import heapq
import json
import os
import tempfile
from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from teller.errors import TraceError
from teller.ingest.schema import LAYERS
from teller.slices.slice import CommRelations, Slice
from teller.tpe.normalize import normalize

FORMAT = "teller.tpe/1"
#: One unknown-kind token per layer, ids 0..len(LAYERS)-1, so unseen names keep their layer.
UNK_NAMES: tuple[str, ...] = tuple(f"<unk-{layer}>" for layer in LAYERS)
#: A merge must be seen at least this often (BPE on trees overfits singletons otherwise).
DEFAULT_MIN_COUNT = 2

Key = tuple[int, int, int]  # (slot, edge, child kind) as seen from a parent token
Pair = tuple[int, int, int, int]  # (parent kind, slot, edge, child kind)


@dataclass(frozen=True)
class Merge:
    """Merge `rank`: a `parent` kind token absorbs a `child` kind token hanging from `slot`."""

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
            parents.extend(merge.slot if p < 0 else p + offset for p in child_parents)
            edges.extend(
                merge.edge if p < 0 else e for p, e in zip(child_parents, child_edges, strict=True)
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
    ) -> TPE:
        """Learn a vocabulary of at most `vocab_size` tokens from `slices`.

        The base alphabet is every node kind seen, most frequent first; when there are more kinds
        than half of the vocabulary leaves room for, the rarest become `<unk-LAYER>` (their exact
        names still round-trip) so the other half is left for merges. Merges are then learned
        until the vocabulary is full or no pair is seen `min_count` times.
        """
        slices = list(slices)
        if vocab_size < len(UNK_NAMES):
            raise ValueError(f"vocab_size must be at least {len(UNK_NAMES)} (one <unk> per layer)")
        tpe = cls()
        layer_codes, kind_names = _node_kinds(slices)
        counts: dict[tuple[int, str], int] = {}
        for layers, kinds in zip(layer_codes, kind_names, strict=True):
            for key in zip(layers.tolist(), kinds, strict=True):
                counts[key] = counts.get(key, 0) + 1
        room = vocab_size - len(UNK_NAMES)
        if len(counts) > room // 2:
            room = room // 2
        ranked = sorted(counts, key=lambda k: (-counts[k], k))
        tpe.base = ranked[:room]
        tpe._rebuild_indexes()
        forest = _Forest.from_slices(tpe, slices, layer_codes, kind_names)
        _Trainer(tpe, forest).run(vocab_size - tpe.num_base, min_count, progress)
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
        is_root = within == 0
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
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(self.to_json(), handle)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

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
            if not 0 <= merge.slot < tpe.pattern_length(merge.parent):
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
    """Tokens as a mutable forest. A token is named by its root node's index (global across the
    slices), so the order of tokens is the order of their root nodes."""

    def __init__(self, kind: list[int], parent: list[int], edge: list[int]) -> None:
        count = len(kind)
        self.kind = kind
        self.parent = parent
        self.slot = [0] * count
        self.edge = edge
        self.alive = [True] * count
        self.nodes: list[list[int]] = [[i] for i in range(count)]
        self.children: list[dict[Key, list[int]] | None] = [None] * count
        for child, p in enumerate(parent):  # node order: children arrive sorted
            if p >= 0:
                table = self.children[p]
                if table is None:
                    table = self.children[p] = {}
                table.setdefault((0, edge[child], kind[child]), []).append(child)

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
        offset = 0
        ids = tpe._kind_ids
        for piece, layers, names in zip(slices, layer_codes, kind_names, strict=True):
            kind.extend(
                ids.get((layer, name), layer)
                for layer, name in zip(layers.tolist(), names, strict=True)
            )
            parent.extend(p + offset if p >= 0 else -1 for p in piece.parent.tolist())
            edge.extend(piece.edge.tolist())
            offset += len(piece)
        return cls(kind, parent, edge)

    def absorb(self, token: int, key: Key, new_kind: int) -> int:
        """Merge the first child of `token` under `key` into it; returns the absorbed child."""
        table = self.children[token]
        assert table is not None
        siblings = table[key]
        child = siblings.pop(0)
        if not siblings:
            del table[key]
        offset = len(self.nodes[token])
        self.nodes[token].extend(self.nodes[child])
        self.nodes[child] = []
        grandchildren = self.children[child]
        if grandchildren:
            for (slot, edge, kind), ids in grandchildren.items():
                for g in ids:
                    self.parent[g] = token
                    self.slot[g] = slot + offset
                table[(slot + offset, edge, kind)] = ids
        self.children[child] = None
        self.alive[child] = False
        old_kind = self.kind[token]
        self.kind[token] = new_kind
        up = self.parent[token]
        if up >= 0:
            up_table = self.children[up]
            assert up_table is not None
            old_key = (self.slot[token], self.edge[token], old_kind)
            old_list = up_table[old_key]
            del old_list[bisect_left(old_list, token)]
            if not old_list:
                del up_table[old_key]
            insort(up_table.setdefault((old_key[0], old_key[1], new_kind), []), token)
        return child

    def apply_merges(self, tpe: TPE) -> None:
        """Apply `tpe`'s merges in rank order with one heap of (rank, parent token) candidates.

        A merge only creates candidates of higher rank (it makes a new kind), so popping the heap
        visits merges in rank order and, within a rank, parents in token order: the same order
        training applied them in.
        """
        ranks = tpe._ranks
        if not ranks:
            return
        heap: list[tuple[int, int]] = []
        for token, table in enumerate(self.children):
            if table:
                kind = self.kind[token]
                for key in table:
                    rank = ranks.get((kind, *key))
                    if rank is not None:
                        heap.append((rank, token))
        heapq.heapify(heap)
        merges = tpe.merges
        num_base = tpe.num_base
        while heap:
            rank, token = heapq.heappop(heap)
            merge = merges[rank]
            table = self.children[token]
            key = (merge.slot, merge.edge, merge.child)
            if not self.alive[token] or self.kind[token] != merge.parent or not table:
                continue
            if key not in table:
                continue
            new_kind = num_base + rank
            self.absorb(token, key, new_kind)
            for other in self.children[token] or ():
                found = ranks.get((new_kind, *other))
                if found is not None:
                    heapq.heappush(heap, (found, token))
            up = self.parent[token]
            if up >= 0:
                found = ranks.get((self.kind[up], self.slot[token], self.edge[token], new_kind))
                if found is not None:
                    heapq.heappush(heap, (found, up))

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


class _Trainer:
    """Greedy merge learning with incremental pair counts.

    `count[pair]` is the number of parent tokens that have at least one child under the pair's
    key (the number of times the merge would apply); `where[pair]` holds those parents. A merge
    touches only the parent, its parent and the absorbed child, so only their pairs are updated.
    """

    def __init__(self, tpe: TPE, forest: _Forest) -> None:
        self.tpe = tpe
        self.forest = forest
        self.count: dict[Pair, int] = {}
        self.where: dict[Pair, set[int]] = {}
        self.touched: set[Pair] = set()
        for token, table in enumerate(forest.children):
            if table:
                kind = forest.kind[token]
                for key in table:
                    self._add((kind, *key), token)
        self.heap = [(-c, pair) for pair, c in self.count.items()]
        heapq.heapify(self.heap)
        self.touched.clear()

    def _add(self, pair: Pair, token: int) -> None:
        self.count[pair] = self.count.get(pair, 0) + 1
        self.where.setdefault(pair, set()).add(token)
        self.touched.add(pair)

    def _remove(self, pair: Pair, token: int) -> None:
        remaining = self.count[pair] - 1
        if remaining:
            self.count[pair] = remaining
            self.where[pair].discard(token)
        else:
            del self.count[pair]
            del self.where[pair]
        self.touched.add(pair)

    def _best(self) -> tuple[Pair, int] | None:
        while self.heap:
            negative, pair = self.heap[0]
            if self.count.get(pair, 0) == -negative:
                return pair, -negative
            heapq.heappop(self.heap)
        return None

    def run(self, max_merges: int, min_count: int, progress: bool) -> None:
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=max_merges, desc="learning merges", unit="merge", leave=False)
        tpe = self.tpe
        while len(tpe.merges) < max_merges:
            best = self._best()
            if best is None or best[1] < min_count:
                break
            pair = best[0]
            new_kind = tpe.num_base + len(tpe.merges)
            tpe.merges.append(Merge(*pair))
            tpe.merge_counts.append(self._merge(pair, new_kind))
            for changed in self.touched:
                current = self.count.get(changed)
                if current:
                    heapq.heappush(self.heap, (-current, changed))
            self.touched.clear()
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()

    def _merge(self, pair: Pair, new_kind: int) -> int:
        """Apply one merge everywhere, in token order; returns how often it applied (fewer than
        counted when a chain of same-kind tokens shares occurrences)."""
        forest = self.forest
        applied = 0
        parent_kind, slot, edge, child_kind = pair
        key = (slot, edge, child_kind)
        for token in sorted(self.where.get(pair, ())):
            table = forest.children[token]
            if not forest.alive[token] or forest.kind[token] != parent_kind or not table:
                continue
            if key not in table:
                continue
            for other in table:
                self._remove((parent_kind, *other), token)
            up = forest.parent[token]
            if up >= 0:
                up_key = (forest.slot[token], forest.edge[token], parent_kind)
                up_table = forest.children[up]
                assert up_table is not None
                if len(up_table[up_key]) == 1:
                    self._remove((forest.kind[up], *up_key), up)
            child = table[key][0]
            for other in forest.children[child] or ():
                self._remove((child_kind, *other), child)
            forest.absorb(token, key, new_kind)
            applied += 1
            for other in forest.children[token] or ():
                self._add((new_kind, *other), token)
            if up >= 0:
                new_up_key = (forest.slot[token], forest.edge[token], new_kind)
                up_table = forest.children[up]
                assert up_table is not None
                if len(up_table[new_up_key]) == 1:
                    self._add((forest.kind[up], *new_up_key), up)
        return applied


def _depths(parent: np.ndarray) -> np.ndarray:
    """Depth of every node when parents come before children."""
    depth = [0] * len(parent)
    for i, p in enumerate(parent.tolist()):
        if p >= 0:
            depth[i] = depth[p] + 1
    return np.asarray(depth, dtype=np.int32)
