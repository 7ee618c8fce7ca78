"""TPE's token forest as flat arrays, and the merge loops of encoding and training compiled with
numba.

Applying a merge touches a handful of tokens (the owner, the token it absorbs, the parent above,
the left neighbours); in Python each of those steps cost tens of microseconds, about one per node
of a trace. Here a token is a row of integer arrays and each step a few array reads and writes.

The forest (`Forest`):
* a token is named by its first root node (so token order is slice order) and has a kind, a
  parent token, the `slot` (node of the parent's pattern) and `edge` it hangs by, its nodes (a
  linked list, pattern order) and its neighbours `prev`/`next` among the tokens hanging from the
  same node;
* a *record* is one key (slot, edge, child kind) of a parent token: the list of its children
  under that key, in token order. Records are found by (owner, slot, edge, kind) in an
  open-addressing hash table (`Table`) and chained per owner.

Pairs are the same as in `teller.tpe.tokenizer`: a record is one parent → child pair occurrence,
a token with a same-edge next sibling one sibling pair occurrence. The trainer keeps, per pair,
the list of its occurrences, their count and their score, and updates them in exactly the order
the readable version of the algorithm does (`tests/tpe/reference_tpe.py`), so that the float
scores, and hence the merges picked, are the same bit for bit.

All kernels live in this one file because numba's on-disk cache only notices changes to the file
a function is defined in: a kernel calling kernels from another file could run stale code.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

SIBLING = -1
NONE = -1
#: Table keys: (owner or parent kind) << 32 | (slot + 1), and kind << 8 | edge byte.
SHIFT = 4294967296

Table = namedtuple("Table", ["k1", "k2", "val", "used"])
Forest = namedtuple(
    "Forest",
    [
        "kind",
        "parent",
        "slot",
        "edge",
        "alive",
        "prev",
        "next",
        "size",
        "node_head",
        "node_tail",
        "node_next",
        "rec_of",  # the record a token is a child in (NONE for a root)
        "mem_prev",  # neighbours in that record's children, token order
        "mem_next",
        "own_head",  # first record a token owns; records chained by rec_onext/rec_oprev
        "own_count",
        "rec_owner",
        "rec_slot",
        "rec_edge",
        "rec_kind",
        "rec_head",
        "rec_tail",
        "rec_count",
        "rec_onext",
        "rec_oprev",
        "free",  # stack of unused record ids, meta[0] of them
        "meta",
        "records",
    ],
)
#: Training's pairs, by id (dense, never reused): the pair, how many occurrences it has, their
#: score, the first of them (`Occurrences`), whether it was merged, whether it changed this merge.
Pairs = namedtuple(
    "Pairs",
    [
        "table",
        "parent",
        "slot",
        "edge",
        "child",
        "count",
        "score",
        "head",
        "merged",
        "touched",
        "touched_ids",
        "meta",  # [number of touched ids]
    ],
)
#: Pair occurrences: record r is occurrence r, token t's sibling pair occurrence R + t (R records).
Occurrences = namedtuple("Occurrences", ["pair", "prev", "next"])

# --- a hash table of two int64 keys to a non-negative int64 (linear probing) ----------------------


@njit(cache=True)
def _home(k1: int, k2: int, mask: int) -> int:
    h = k1 * -7046029254386353131 + k2 * -4658895280553007687
    h ^= h >> 31
    h *= -7723592293110705685
    h ^= h >> 29
    return h & mask


@njit(cache=True)
def new_table(entries: int) -> Table:
    """A table with room for `entries` keys at most half full."""
    capacity = 16
    while capacity < 2 * entries:
        capacity *= 2
    k1 = np.zeros(capacity, dtype=np.int64)
    return Table(
        k1,
        np.zeros(capacity, dtype=np.int64),
        np.full(capacity, NONE, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
    )


@njit(cache=True)
def table_find(table: Table, k1: int, k2: int) -> int:
    mask = len(table.val) - 1
    i = _home(k1, k2, mask)
    while True:
        value = table.val[i]
        if value == NONE or (table.k1[i] == k1 and table.k2[i] == k2):
            return value
        i = (i + 1) & mask


@njit(cache=True)
def table_put(table: Table, k1: int, k2: int, value: int) -> None:
    """Insert a key that is not in the table."""
    mask = len(table.val) - 1
    i = _home(k1, k2, mask)
    while table.val[i] != NONE:
        i = (i + 1) & mask
    table.k1[i] = k1
    table.k2[i] = k2
    table.val[i] = value
    table.used[0] += 1


@njit(cache=True)
def table_delete(table: Table, k1: int, k2: int) -> None:
    """Remove a key that is in the table, shifting later keys of its probe run back."""
    mask = len(table.val) - 1
    i = _home(k1, k2, mask)
    while not (table.k1[i] == k1 and table.k2[i] == k2 and table.val[i] != NONE):
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        if table.val[j] == NONE:
            break
        home = _home(table.k1[j], table.k2[j], mask)
        if (j > i and (home <= i or home > j)) or (j < i and home <= i and home > j):
            table.k1[i] = table.k1[j]
            table.k2[i] = table.k2[j]
            table.val[i] = table.val[j]
            i = j
    table.val[i] = NONE
    table.used[0] -= 1


@njit(cache=True)
def table_grown(table: Table) -> Table:
    grown = new_table(len(table.val))
    for i in range(len(table.val)):
        if table.val[i] != NONE:
            table_put(grown, table.k1[i], table.k2[i], table.val[i])
    return grown


@njit(cache=True)
def pair_keys(parent_kind: int, slot: int, edge: int, child_kind: int) -> tuple[int, int]:
    return parent_kind * SHIFT + slot + 1, child_kind * 256 + (edge & 255)


# --- the forest -------------------------------------------------------------------------------


@njit(cache=True)
def build_forest(
    kind: np.ndarray, parent: np.ndarray, edge: np.ndarray, is_start: np.ndarray
) -> Forest:
    """One token per node; children keyed by (slot 0, edge, kind); siblings linked in slice order.

    Nodes come parents first, so children and roots arrive in order. `is_start` marks each
    slice's first node: roots of different slices are not siblings.
    """
    count = len(kind)
    records = count + 1  # a live record has a child, so there are never more
    forest = Forest(
        kind.copy(),
        parent.copy(),
        np.zeros(count, dtype=np.int64),
        edge.copy(),
        np.ones(count, dtype=np.bool_),
        np.full(count, NONE, dtype=np.int64),
        np.full(count, NONE, dtype=np.int64),
        np.ones(count, dtype=np.int64),
        np.arange(count, dtype=np.int64),
        np.arange(count, dtype=np.int64),
        np.full(count, NONE, dtype=np.int64),
        np.full(count, NONE, dtype=np.int64),
        np.full(count, NONE, dtype=np.int64),
        np.full(count, NONE, dtype=np.int64),
        np.full(count, NONE, dtype=np.int64),
        np.zeros(count, dtype=np.int64),
        np.zeros(records, dtype=np.int64),
        np.zeros(records, dtype=np.int64),
        np.zeros(records, dtype=np.int64),
        np.zeros(records, dtype=np.int64),
        np.full(records, NONE, dtype=np.int64),
        np.full(records, NONE, dtype=np.int64),
        np.zeros(records, dtype=np.int64),
        np.full(records, NONE, dtype=np.int64),
        np.full(records, NONE, dtype=np.int64),
        np.arange(records - 1, -1, -1).astype(np.int64),
        np.full(1, records, dtype=np.int64),
        new_table(records),
    )
    last_child = np.full(count, NONE, dtype=np.int64)
    last_root = NONE
    for node in range(count):
        if is_start[node]:
            last_root = NONE
        up = parent[node]
        if up >= 0:
            record = find_record(forest, up, 0, edge[node], kind[node])
            if record == NONE:
                record = _new_record(forest, up, 0, edge[node], kind[node])
            _insert_member(forest, record, node)
            before = last_child[up]
            last_child[up] = node
        else:
            before = last_root
            last_root = node
        if before >= 0:
            forest.prev[node] = before
            forest.next[before] = node
    return forest


@njit(cache=True)
def find_record(forest: Forest, owner: int, slot: int, edge: int, kind: int) -> int:
    return table_find(forest.records, owner * SHIFT + slot, kind * 256 + (edge & 255))


@njit(cache=True)
def _new_record(forest: Forest, owner: int, slot: int, edge: int, kind: int) -> int:
    top = forest.meta[0] - 1
    forest.meta[0] = top
    record = forest.free[top]
    forest.rec_owner[record] = owner
    forest.rec_slot[record] = slot
    forest.rec_edge[record] = edge
    forest.rec_kind[record] = kind
    forest.rec_head[record] = NONE
    forest.rec_tail[record] = NONE
    forest.rec_count[record] = 0
    _chain_record(forest, record, owner)
    table_put(forest.records, owner * SHIFT + slot, kind * 256 + (edge & 255), record)
    return record


@njit(cache=True)
def _chain_record(forest: Forest, record: int, owner: int) -> None:
    first = forest.own_head[owner]
    forest.rec_oprev[record] = NONE
    forest.rec_onext[record] = first
    if first >= 0:
        forest.rec_oprev[first] = record
    forest.own_head[owner] = record
    forest.own_count[owner] += 1


@njit(cache=True)
def _unchain_record(forest: Forest, record: int) -> None:
    owner = forest.rec_owner[record]
    before, after = forest.rec_oprev[record], forest.rec_onext[record]
    if before >= 0:
        forest.rec_onext[before] = after
    else:
        forest.own_head[owner] = after
    if after >= 0:
        forest.rec_oprev[after] = before
    forest.own_count[owner] -= 1


@njit(cache=True)
def _record_keys(forest: Forest, record: int) -> tuple[int, int]:
    return (
        forest.rec_owner[record] * SHIFT + forest.rec_slot[record],
        forest.rec_kind[record] * 256 + (forest.rec_edge[record] & 255),
    )


@njit(cache=True)
def _insert_member(forest: Forest, record: int, token: int) -> None:
    """Add `token` to the record's children, keeping token order (it nearly always goes last)."""
    after = NONE
    before = forest.rec_tail[record]
    while before > token:
        after = before
        before = forest.mem_prev[before]
    forest.mem_prev[token] = before
    forest.mem_next[token] = after
    if before >= 0:
        forest.mem_next[before] = token
    else:
        forest.rec_head[record] = token
    if after >= 0:
        forest.mem_prev[after] = token
    else:
        forest.rec_tail[record] = token
    forest.rec_count[record] += 1
    forest.rec_of[token] = record


@njit(cache=True)
def _remove_member(forest: Forest, token: int) -> None:
    """Take `token` out of its record; an emptied record is dropped."""
    record = forest.rec_of[token]
    before, after = forest.mem_prev[token], forest.mem_next[token]
    if before >= 0:
        forest.mem_next[before] = after
    else:
        forest.rec_head[record] = after
    if after >= 0:
        forest.mem_prev[after] = before
    else:
        forest.rec_tail[record] = before
    forest.mem_prev[token] = forest.mem_next[token] = forest.rec_of[token] = NONE
    forest.rec_count[record] -= 1
    if forest.rec_count[record] == 0:
        k1, k2 = _record_keys(forest, record)
        table_delete(forest.records, k1, k2)
        _unchain_record(forest, record)
        forest.free[forest.meta[0]] = record
        forest.meta[0] += 1


@njit(cache=True)
def _unlink(forest: Forest, token: int) -> None:
    before, after = forest.prev[token], forest.next[token]
    if before >= 0:
        forest.next[before] = after
    if after >= 0:
        forest.prev[after] = before
    forest.prev[token] = forest.next[token] = NONE


@njit(cache=True)
def _take_over(forest: Forest, token: int, other: int) -> None:
    """`token` takes `other`'s nodes and children (their slots shift past its own nodes)."""
    offset = forest.size[token]
    forest.node_next[forest.node_tail[token]] = forest.node_head[other]
    forest.node_tail[token] = forest.node_tail[other]
    forest.size[token] += forest.size[other]
    forest.size[other] = 0
    forest.node_head[other] = forest.node_tail[other] = NONE
    record = forest.own_head[other]
    while record >= 0:
        following = forest.rec_onext[record]
        k1, k2 = _record_keys(forest, record)
        table_delete(forest.records, k1, k2)
        child = forest.rec_head[record]
        while child >= 0:
            forest.parent[child] = token
            forest.slot[child] += offset
            child = forest.mem_next[child]
        forest.rec_owner[record] = token
        forest.rec_slot[record] += offset
        k1, k2 = _record_keys(forest, record)
        table_put(forest.records, k1, k2, record)
        _chain_record(forest, record, token)
        record = following
    forest.own_head[other] = NONE
    forest.own_count[other] = 0
    forest.alive[other] = False


@njit(cache=True)
def _rekind(forest: Forest, token: int, new_kind: int) -> None:
    forest.kind[token] = new_kind
    up = forest.parent[token]
    if up >= 0:
        _remove_member(forest, token)
        slot, edge = forest.slot[token], forest.edge[token]
        record = find_record(forest, up, slot, edge, new_kind)
        if record == NONE:
            record = _new_record(forest, up, slot, edge, new_kind)
        _insert_member(forest, record, token)


@njit(cache=True)
def match(forest: Forest, token: int, parent: int, slot: int, edge: int, child: int) -> int:
    """Where merge (parent, slot, edge, child) applies at `token`: the record of the child key,
    or for a sibling merge the next sibling; NONE where it does not apply."""
    if not forest.alive[token] or forest.kind[token] != parent:
        return NONE
    if slot == SIBLING:
        after = forest.next[token]
        if (
            after >= 0
            and forest.kind[after] == child
            and forest.edge[token] == edge
            and forest.edge[after] == edge
        ):
            return after
        return NONE
    return find_record(forest, token, slot, edge, child)


@njit(cache=True)
def apply_merge(forest: Forest, token: int, sibling: bool, where: int, new_kind: int) -> int:
    """Apply a merge `match` found at `token` (`where` is its result); returns the dead token."""
    if sibling:
        dead = where
        if forest.rec_of[dead] >= 0:
            _remove_member(forest, dead)
    else:
        dead = forest.rec_head[where]
        _remove_member(forest, dead)
    _unlink(forest, dead)
    _take_over(forest, token, dead)
    _rekind(forest, token, new_kind)
    return dead


@njit(cache=True)
def sibling_pair(forest: Forest, token: int) -> tuple[int, int]:
    """Table keys of `token`'s sibling pair, or (NONE, NONE) when it has none."""
    after = forest.next[token]
    if after < 0 or forest.edge[after] != forest.edge[token]:
        return NONE, NONE
    return pair_keys(forest.kind[token], SIBLING, forest.edge[token], forest.kind[after])


@njit(cache=True)
def record_pair(forest: Forest, record: int) -> tuple[int, int]:
    return pair_keys(
        forest.kind[forest.rec_owner[record]],
        forest.rec_slot[record],
        forest.rec_edge[record],
        forest.rec_kind[record],
    )


@njit(cache=True)
def emit(forest: Forest) -> tuple:
    """The live tokens in order: kind, parent (token index), slot, edge, and their nodes."""
    count = len(forest.kind)
    index = np.full(count, NONE, dtype=np.int64)
    tokens = 0
    for token in range(count):
        if forest.alive[token]:
            index[token] = tokens
            tokens += 1
    kind = np.empty(tokens, dtype=np.int64)
    parent = np.empty(tokens, dtype=np.int64)
    slot = np.empty(tokens, dtype=np.int64)
    edge = np.empty(tokens, dtype=np.int64)
    root = np.empty(tokens, dtype=np.int64)
    offsets = np.zeros(tokens + 1, dtype=np.int64)
    rows = np.empty(count, dtype=np.int64)
    i = 0
    row = 0
    for token in range(count):
        if not forest.alive[token]:
            continue
        kind[i] = forest.kind[token]
        up = forest.parent[token]
        parent[i] = index[up] if up >= 0 else NONE
        slot[i] = forest.slot[token]
        edge[i] = forest.edge[token]
        root[i] = token
        node = forest.node_head[token]
        while node >= 0:
            rows[row] = node
            row += 1
            node = forest.node_next[node]
        i += 1
        offsets[i] = row
    return kind, parent, slot, edge, root, offsets, rows


# --- encoding ---------------------------------------------------------------------------------


@njit(cache=True)
def rank_table(parent: np.ndarray, slot: np.ndarray, edge: np.ndarray, child: np.ndarray) -> Table:
    """Merge rank by pair."""
    table = new_table(len(parent))
    for rank in range(len(parent)):
        k1, k2 = pair_keys(parent[rank], slot[rank], edge[rank], child[rank])
        table_put(table, k1, k2, rank)
    return table


@njit(cache=True)
def _heap_push(heap: np.ndarray, size: int, item: int) -> np.ndarray:
    if size == len(heap):
        grown = np.empty(2 * len(heap) + 16, dtype=np.int64)
        grown[:size] = heap[:size]
        heap = grown
    i = size
    while i > 0:
        up = (i - 1) >> 1
        if heap[up] <= item:
            break
        heap[i] = heap[up]
        i = up
    heap[i] = item
    return heap


@njit(cache=True)
def _heap_pop(heap: np.ndarray, size: int) -> int:
    """Remove and return the smallest of `heap[:size]` (the caller shrinks `size`)."""
    top = heap[0]
    last = heap[size - 1]
    size -= 1
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= last:
            break
        heap[i] = heap[child]
        i = child
    if size > 0:
        heap[i] = last
    return top


@njit(cache=True)
def _push_pair(
    heap: np.ndarray,
    size: int,
    ranks: Table,
    keys: tuple[int, int],
    above: int,
    owner: int,
    count: int,
) -> tuple[np.ndarray, int]:
    if keys[0] == NONE:
        return heap, size
    rank = table_find(ranks, keys[0], keys[1])
    if rank > above:
        heap = _heap_push(heap, size, rank * count + owner)
        size += 1
    return heap, size


@njit(cache=True)
def encode_merges(
    forest: Forest,
    ranks: Table,
    merge_parent: np.ndarray,
    merge_slot: np.ndarray,
    merge_edge: np.ndarray,
    merge_child: np.ndarray,
    num_base: int,
) -> None:
    """Apply the merges in rank order with one heap of (rank, owner) candidates.

    A merge only creates candidates of higher rank (it makes a new kind) except where it makes
    two old tokens adjacent; training never revisits an earlier merge, so such candidates are
    dropped. Popping the heap thus visits merges in rank order and, within a rank, owners in
    token order: the order training applied them in.
    """
    count = len(forest.kind)
    if len(merge_parent) == 0:
        return
    heap = np.empty(count + 16, dtype=np.int64)
    size = 0
    for token in range(count):
        record = forest.own_head[token]
        while record >= 0:
            heap, size = _push_pair(
                heap, size, ranks, record_pair(forest, record), -1, token, count
            )
            record = forest.rec_onext[record]
        heap, size = _push_pair(heap, size, ranks, sibling_pair(forest, token), -1, token, count)
    heap[:size] = np.sort(heap[:size])  # sorted is a heap
    current = -1
    while size > 0:
        item = _heap_pop(heap, size)
        size -= 1
        rank, token = item // count, item % count
        if rank < current:
            continue
        current = rank
        parent_kind, slot, edge, child_kind = (
            merge_parent[rank],
            merge_slot[rank],
            merge_edge[rank],
            merge_child[rank],
        )
        where = match(forest, token, parent_kind, slot, edge, child_kind)
        if where == NONE:
            continue
        sibling = slot == SIBLING
        up, before = forest.parent[token], forest.prev[token]
        token_slot, token_edge = forest.slot[token], forest.edge[token]
        child_before = NONE if sibling else forest.prev[forest.rec_head[where]]
        new_kind = num_base + rank
        apply_merge(forest, token, sibling, where, new_kind)
        record = forest.own_head[token]
        while record >= 0:
            heap, size = _push_pair(
                heap, size, ranks, record_pair(forest, record), rank, token, count
            )
            record = forest.rec_onext[record]
        heap, size = _push_pair(heap, size, ranks, sibling_pair(forest, token), rank, token, count)
        if child_before >= 0:
            heap, size = _push_pair(
                heap, size, ranks, sibling_pair(forest, child_before), rank, child_before, count
            )
        if before >= 0:
            heap, size = _push_pair(
                heap, size, ranks, sibling_pair(forest, before), rank, before, count
            )
        if up >= 0:
            record = find_record(forest, up, token_slot, token_edge, new_kind)
            if record >= 0:
                heap, size = _push_pair(
                    heap, size, ranks, record_pair(forest, record), rank, up, count
                )
            record = find_record(forest, up, token_slot, token_edge, parent_kind)
            if record >= 0:
                heap, size = _push_pair(
                    heap, size, ranks, record_pair(forest, record), rank, up, count
                )
            if sibling and child_kind != parent_kind:
                record = find_record(forest, up, token_slot, token_edge, child_kind)
                if record >= 0:
                    heap, size = _push_pair(
                        heap, size, ranks, record_pair(forest, record), rank, up, count
                    )


# --- training ---------------------------------------------------------------------------------


@njit(cache=True)
def _new_pairs(capacity: int) -> Pairs:
    return Pairs(
        new_table(capacity),
        np.zeros(capacity, dtype=np.int64),
        np.zeros(capacity, dtype=np.int64),
        np.zeros(capacity, dtype=np.int64),
        np.zeros(capacity, dtype=np.int64),
        np.zeros(capacity, dtype=np.int64),
        np.zeros(capacity, dtype=np.float64),
        np.full(capacity, NONE, dtype=np.int64),
        np.zeros(capacity, dtype=np.bool_),
        np.zeros(capacity, dtype=np.bool_),
        np.zeros(capacity, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
    )


@njit(cache=True)
def _pairs_with_room(pairs: Pairs, more: int) -> Pairs:
    """`pairs`, or a copy with twice the room when `more` new pairs might not fit."""
    used = pairs.table.used[0]
    if used + more <= len(pairs.parent):
        return pairs
    grown = _new_pairs(2 * (used + more))
    for i in range(len(pairs.table.val)):
        if pairs.table.val[i] != NONE:
            table_put(grown.table, pairs.table.k1[i], pairs.table.k2[i], pairs.table.val[i])
    for old, new in (
        (pairs.parent, grown.parent),
        (pairs.slot, grown.slot),
        (pairs.edge, grown.edge),
        (pairs.child, grown.child),
        (pairs.count, grown.count),
        (pairs.head, grown.head),
        (pairs.touched_ids, grown.touched_ids),
    ):
        new[:used] = old[:used]
    grown.score[:used] = pairs.score[:used]
    grown.merged[:used] = pairs.merged[:used]
    grown.touched[:used] = pairs.touched[:used]
    grown.meta[0] = pairs.meta[0]
    return grown


@njit(cache=True)
def _touch(pairs: Pairs, pair: int) -> None:
    if not pairs.touched[pair]:
        pairs.touched[pair] = True
        pairs.touched_ids[pairs.meta[0]] = pair
        pairs.meta[0] += 1


@njit(cache=True)
def _add(
    pairs: Pairs,
    occurrences: Occurrences,
    occurrence: int,
    keys: tuple[int, int],
    pair: tuple[int, int, int, int],
    weight: float,
) -> None:
    """Count `occurrence` for the pair with table `keys` (added if new)."""
    found = table_find(pairs.table, keys[0], keys[1])
    if found == NONE:
        found = pairs.table.used[0]
        table_put(pairs.table, keys[0], keys[1], found)
        pairs.parent[found], pairs.slot[found], pairs.edge[found], pairs.child[found] = pair
    first = pairs.head[found]
    occurrences.prev[occurrence] = NONE
    occurrences.next[occurrence] = first
    if first >= 0:
        occurrences.prev[first] = occurrence
    pairs.head[found] = occurrence
    occurrences.pair[occurrence] = found
    pairs.count[found] += 1
    pairs.score[found] += weight
    _touch(pairs, found)


@njit(cache=True)
def _remove(pairs: Pairs, occurrences: Occurrences, occurrence: int, weight: float) -> None:
    """Stop counting `occurrence` (if it is a pair occurrence now)."""
    found = occurrences.pair[occurrence]
    if found == NONE:
        return
    before, after = occurrences.prev[occurrence], occurrences.next[occurrence]
    if before >= 0:
        occurrences.next[before] = after
    else:
        pairs.head[found] = after
    if after >= 0:
        occurrences.prev[after] = before
    occurrences.pair[occurrence] = NONE
    if pairs.count[found] > 1:
        pairs.count[found] -= 1
        pairs.score[found] -= weight
    else:  # zeroed, not decremented: float sums must not leave a ghost of a gone pair
        pairs.count[found] = 0
        pairs.score[found] = 0.0
    _touch(pairs, found)


@njit(cache=True)
def _add_record(
    forest: Forest, pairs: Pairs, occurrences: Occurrences, record: int, weight: np.ndarray
) -> None:
    owner = forest.rec_owner[record]
    pair = (
        forest.kind[owner],
        forest.rec_slot[record],
        forest.rec_edge[record],
        forest.rec_kind[record],
    )
    _add(pairs, occurrences, record, pair_keys(*pair), pair, weight[owner])


@njit(cache=True)
def _add_sibling(
    forest: Forest, pairs: Pairs, occurrences: Occurrences, token: int, weight: np.ndarray
) -> None:
    after = forest.next[token]
    if after < 0 or forest.edge[after] != forest.edge[token]:
        return
    pair = (forest.kind[token], SIBLING, forest.edge[token], forest.kind[after])
    occurrence = len(forest.rec_owner) + token
    _add(pairs, occurrences, occurrence, pair_keys(*pair), pair, weight[token])


@njit(cache=True)
def _add_owned(
    forest: Forest, pairs: Pairs, occurrences: Occurrences, token: int, weight: np.ndarray
) -> None:
    record = forest.own_head[token]
    while record >= 0:
        _add_record(forest, pairs, occurrences, record, weight)
        record = forest.rec_onext[record]
    _add_sibling(forest, pairs, occurrences, token, weight)


@njit(cache=True)
def _remove_owned(
    forest: Forest, pairs: Pairs, occurrences: Occurrences, token: int, weight: np.ndarray
) -> None:
    record = forest.own_head[token]
    while record >= 0:
        _remove(pairs, occurrences, record, weight[token])
        record = forest.rec_onext[record]
    _remove(pairs, occurrences, len(forest.rec_owner) + token, weight[token])


@njit(cache=True)
def _above(scores: np.ndarray, ids: np.ndarray, a: int, b: int, pairs: Pairs) -> bool:
    """Whether heap entry a comes before b: higher score, then the smaller pair tuple."""
    if scores[a] != scores[b]:
        return scores[a] < scores[b]  # scores are stored negated
    x, y = ids[a], ids[b]
    if pairs.parent[x] != pairs.parent[y]:
        return pairs.parent[x] < pairs.parent[y]
    if pairs.slot[x] != pairs.slot[y]:
        return pairs.slot[x] < pairs.slot[y]
    if pairs.edge[x] != pairs.edge[y]:
        return pairs.edge[x] < pairs.edge[y]
    return pairs.child[x] < pairs.child[y]


@njit(cache=True)
def _swap(scores: np.ndarray, ids: np.ndarray, a: int, b: int) -> None:
    scores[a], scores[b] = scores[b], scores[a]
    ids[a], ids[b] = ids[b], ids[a]


@njit(cache=True)
def _sift_down(scores: np.ndarray, ids: np.ndarray, i: int, size: int, pairs: Pairs) -> None:
    while True:
        child = 2 * i + 1
        if child >= size:
            return
        if child + 1 < size and _above(scores, ids, child + 1, child, pairs):
            child += 1
        if not _above(scores, ids, child, i, pairs):
            return
        _swap(scores, ids, i, child)
        i = child


@njit(cache=True)
def _sift_up(scores: np.ndarray, ids: np.ndarray, i: int, pairs: Pairs) -> None:
    while i > 0:
        up = (i - 1) >> 1
        if not _above(scores, ids, i, up, pairs):
            return
        _swap(scores, ids, i, up)
        i = up


@njit(cache=True)
def train_merges(
    forest: Forest,
    weight: np.ndarray,
    num_base: int,
    max_merges: int,
    min_count: int,
    max_token_nodes: int,
) -> tuple:
    """Greedy merge learning with incremental pair counts; returns the merges (parent, slot,
    edge, child, times applied) and the final pair table.

    The next merge is the unmerged pair of highest score (ties: the smallest pair) seen at least
    `min_count` times whose token fits `max_token_nodes` (negative: no cap), from a lazy heap
    whose entries are current while their score is the pair's score now. A merge is applied at
    its owners in token order; each application takes out the pairs of the tokens it changes
    (the owner, the left neighbours, the parent's keys, the token absorbed) and puts back
    theirs after, in the order of `tests/tpe/reference_tpe.py`, so float scores match.
    """
    count = len(forest.kind)
    records = len(forest.rec_owner)
    occurrences = Occurrences(
        np.full(records + count, NONE, dtype=np.int64),
        np.full(records + count, NONE, dtype=np.int64),
        np.full(records + count, NONE, dtype=np.int64),
    )
    pairs = _new_pairs(max(1024, count // 4))
    for token in range(count):
        pairs = _pairs_with_room(pairs, forest.own_count[token] + 1)
        _add_owned(forest, pairs, occurrences, token, weight)
    used = pairs.table.used[0]
    scores = np.empty(max(16, 2 * used), dtype=np.float64)
    ids = np.empty(max(16, 2 * used), dtype=np.int64)
    size = 0
    for pair in range(used):
        pairs.touched[pair] = False
        if pairs.count[pair] > 0:
            scores[size] = -pairs.score[pair]
            ids[size] = pair
            size += 1
    pairs.meta[0] = 0
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(scores, ids, i, size, pairs)

    max_merges = max(max_merges, 0)
    token_nodes = np.ones(num_base + max_merges, dtype=np.int64)
    merges = np.zeros((max_merges, 5), dtype=np.int64)
    learned = 0
    while learned < max_merges:
        best = NONE
        while size > 0:
            pair = ids[0]
            if not pairs.merged[pair] and pairs.count[pair] > 0 and pairs.score[pair] == -scores[0]:
                nodes = token_nodes[pairs.parent[pair]] + token_nodes[pairs.child[pair]]
                if max_token_nodes >= 0 and nodes > max_token_nodes:
                    pairs.merged[pair] = True  # too big now, too big forever: kinds never grow
                elif pairs.count[pair] >= min_count:
                    best = pair
                    break
            size -= 1
            scores[0], ids[0] = scores[size], ids[size]
            _sift_down(scores, ids, 0, size, pairs)
        if best == NONE:
            break
        parent_kind, slot, edge, child_kind = (
            pairs.parent[best],
            pairs.slot[best],
            pairs.edge[best],
            pairs.child[best],
        )
        new_kind = num_base + learned
        pairs.merged[best] = True
        token_nodes[new_kind] = token_nodes[parent_kind] + token_nodes[child_kind]
        owners = np.empty(pairs.count[best], dtype=np.int64)
        occurrence = pairs.head[best]
        for i in range(len(owners)):
            owners[i] = (
                forest.rec_owner[occurrence] if occurrence < records else occurrence - records
            )
            occurrence = occurrences.next[occurrence]
        owners.sort()
        sibling = slot == SIBLING
        applied = 0
        for token in owners:
            where = match(forest, token, parent_kind, slot, edge, child_kind)
            if where == NONE:
                continue
            dead = where if sibling else forest.rec_head[where]
            pairs = _pairs_with_room(pairs, forest.own_count[token] + forest.own_count[dead] + 8)
            up, before = forest.parent[token], forest.prev[token]
            token_slot, token_edge = forest.slot[token], forest.edge[token]
            child_before = NONE if sibling else forest.prev[dead]
            up_kinds = (parent_kind, child_kind if sibling else parent_kind, new_kind)
            _remove_owned(forest, pairs, occurrences, token, weight)
            if child_before >= 0:
                _remove(pairs, occurrences, records + child_before, weight[child_before])
            if before >= 0:
                _remove(pairs, occurrences, records + before, weight[before])
            if up >= 0:
                for i, kind in enumerate(up_kinds):
                    if i == 1 and kind == parent_kind:
                        continue
                    record = find_record(forest, up, token_slot, token_edge, kind)
                    if record >= 0:
                        _remove(pairs, occurrences, record, weight[up])
            _remove_owned(forest, pairs, occurrences, dead, weight)
            apply_merge(forest, token, sibling, where, new_kind)
            applied += 1
            _add_owned(forest, pairs, occurrences, token, weight)
            if child_before >= 0:
                _add_sibling(forest, pairs, occurrences, child_before, weight)
            if before >= 0:
                _add_sibling(forest, pairs, occurrences, before, weight)
            if up >= 0:
                for i, kind in enumerate(up_kinds):
                    if i == 1 and kind == parent_kind:
                        continue
                    record = find_record(forest, up, token_slot, token_edge, kind)
                    if record >= 0:
                        _add_record(forest, pairs, occurrences, record, weight)
        merges[learned, 0] = parent_kind
        merges[learned, 1] = slot
        merges[learned, 2] = edge
        merges[learned, 3] = child_kind
        merges[learned, 4] = applied
        learned += 1
        for i in range(pairs.meta[0]):
            pair = pairs.touched_ids[i]
            pairs.touched[pair] = False
            if pairs.count[pair] > 0 and not pairs.merged[pair]:
                if size == len(scores):
                    scores = np.concatenate((scores, np.empty(len(scores), dtype=np.float64)))
                    ids = np.concatenate((ids, np.empty(len(ids), dtype=np.int64)))
                scores[size] = -pairs.score[pair]
                ids[size] = pair
                _sift_up(scores, ids, size, pairs)
                size += 1
        pairs.meta[0] = 0
    return merges[:learned], pairs
