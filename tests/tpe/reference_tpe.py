"""The TPE forest and trainer as they were before they were made fast (commit a7cad4a), kept as
the reference the fast path must match token for token and merge for merge
(`test_fast_path_equivalence.py`). Plain dicts and lists, one Python step per merge applied.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence

import numpy as np

from teller.ingest.schema import LAYERS
from teller.slices.slice import Slice
from teller.tpe.normalize import normalize
from teller.tpe.tokenizer import (
    DEFAULT_MIN_COUNT,
    DEFAULT_WEIGHTING,
    SIBLING,
    TPE,
    UNK_NAMES,
    Key,
    Merge,
    Pair,
    Tokens,
    _node_weights,
)


def reference_train(
    slices: Iterable[Slice],
    vocab_size: int,
    min_count: int = DEFAULT_MIN_COUNT,
    max_token_nodes: int | None = None,
    weighting: str = DEFAULT_WEIGHTING,
) -> TPE:
    """`TPE.train` as it was: the same base alphabet, merges learned by `_Trainer`."""
    slices = list(slices)
    tpe = TPE()
    layer_codes, kind_names = _node_kinds(slices)
    weights = _node_weights(slices, weighting)
    counts: dict[tuple[int, str], int] = {}
    for layers, kinds in zip(layer_codes, kind_names, strict=True):
        for key in zip(layers.tolist(), kinds, strict=True):
            counts[key] = counts.get(key, 0) + 1
    kept = [k for k, c in counts.items() if c >= min_count]
    room = vocab_size - len(UNK_NAMES)
    if len(kept) > room // 2:
        room = room // 2
    tpe.base = sorted(kept, key=lambda k: (-counts[k], k))[:room]
    tpe._rebuild_indexes()
    forest = _Forest.from_slices(tpe, slices, layer_codes, kind_names)
    _Trainer(tpe, forest, max_token_nodes, weights).run(vocab_size - tpe.num_base, min_count, False)
    tpe._rebuild_indexes()
    return tpe


def reference_encode(tpe: TPE, piece: Slice) -> Tokens:
    """`TPE.encode` as it was."""
    layer_codes, kind_names = _node_kinds([piece])
    forest = _Forest.from_slices(tpe, [piece], layer_codes, kind_names)
    forest.apply_merges(tpe)
    return forest.emit(piece)


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
        if merge.slot == SIBLING:
            gone_kind = self.kind[self.next[token]]
            up_keys = list(
                dict.fromkeys(
                    (self.slot[token], self.edge[token], k) for k in (merge.parent, gone_kind)
                )
            )
            self.join(token, new_kind)
            affected: list[tuple[int, Sequence[Key] | None]] = [(token, None)]
        else:
            key = (merge.slot, merge.edge, merge.child)
            child = self.children[token][key][0]  # type: ignore[index]
            child_before = self.prev[child]
            up_keys = [(self.slot[token], self.edge[token], merge.parent)]
            self.absorb(token, key, new_kind)
            affected = [(token, None)]
            if child_before >= 0:
                affected.append((child_before, ()))
        if before >= 0:
            affected.append((before, ()))
        if up >= 0:
            new_key = (self.slot[token], self.edge[token], new_kind)
            affected.append((up, list(dict.fromkeys([*up_keys, new_key]))))
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
        """Apply `tpe`'s merges in rank order with one heap of (rank, owner token) candidates.

        A merge only creates candidates of higher rank (it makes a new kind) except where it
        makes two old tokens adjacent; training never revisits an earlier merge, so such
        candidates are dropped. Popping the heap thus visits merges in rank order and, within a
        rank, owners in token order: the order training applied them in.
        """
        ranks = tpe._ranks
        if not ranks:
            return
        heap: list[tuple[int, int]] = []
        for token in range(len(self.kind)):
            for pair in self.owned(token):
                rank = ranks.get(pair)
                if rank is not None:
                    heap.append((rank, token))
        heapq.heapify(heap)
        merges = tpe.merges
        num_base = tpe.num_base
        current = -1
        while heap:
            rank, token = heapq.heappop(heap)
            if rank < current:
                continue
            current = rank
            merge = merges[rank]
            if not self.applicable(token, merge):
                continue
            for owner, keys in self.apply(token, merge, num_base + rank):
                for pair in self.pairs_of(owner, keys):
                    found = ranks.get(pair)
                    if found is not None and found > rank:
                        heapq.heappush(heap, (found, owner))

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


def _remove_sorted(table: dict[Key, list[int]], key: Key, token: int) -> None:
    ids = table[key]
    del ids[bisect_left(ids, token)]
    if not ids:
        del table[key]


class _Trainer:
    """Greedy merge learning with incremental pair counts.

    `count[pair]` is the number of owner tokens that have the pair (a parent with a child under
    the pair's key, or a left sibling next to a right one); `where[pair]` holds those owners;
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
        self.count: dict[Pair, int] = {}
        self.score: dict[Pair, float] = {}
        self.where: dict[Pair, set[int]] = {}
        self.merged: set[Pair] = set()
        self.touched: set[Pair] = set()
        for token in range(len(forest.kind)):
            for pair in forest.owned(token):
                self._add(pair, token)
        self.heap = [(-self.score[pair], pair) for pair in self.count]
        heapq.heapify(self.heap)
        self.touched.clear()

    def _add(self, pair: Pair, token: int) -> None:
        self.count[pair] = self.count.get(pair, 0) + 1
        self.score[pair] = self.score.get(pair, 0.0) + self.weight[token]
        self.where.setdefault(pair, set()).add(token)
        self.touched.add(pair)

    def _remove(self, pair: Pair, token: int) -> None:
        remaining = self.count[pair] - 1
        if remaining:
            self.count[pair] = remaining
            self.score[pair] -= self.weight[token]
            self.where[pair].discard(token)
        else:  # deleted, not decremented: float sums must not leave a ghost of a gone pair
            del self.count[pair]
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
                elif self.count[pair] >= min_count:
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
            keys = list(dict.fromkeys((slot, edge, k) for k in [*kinds, new_kind]))
            affected.append((forest.parent[token], keys))
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
