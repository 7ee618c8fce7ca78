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

# Columns of a token row (`Forest.tok`, int32: one 64-byte cache line per token).
KIND, PARENT, SLOT, EDGE, PREV, NEXT, ALIVE, OWN_HEAD = range(8)
SIZE, NODE_HEAD, NODE_TAIL, REC_OF, MEM_PREV, MEM_NEXT, OWN_COUNT, HASHED = range(8, 16)
TOKEN_COLUMNS = 16
#: A token's records are found by walking its chain of them while it owns at most this many (no
#: hash table traffic for the common narrow node); from then on, through `Forest.records`.
CHAIN_RECORDS = 4
# Columns of a record row (`Forest.rec`): the key, its children list, the owner's chain of records.
OWNER, RSLOT, REDGE, RKIND, HEAD, TAIL, ONEXT, OPREV = range(8)
RECORD_COLUMNS = 8
# Columns of a pair row (`Pairs.data`) and of an occurrence row (`Pairs.occurrences`).
P_PARENT, P_SLOT, P_EDGE, P_CHILD, P_COUNT, P_HEAD = range(6)
PAIR_COLUMNS = 8
O_PAIR, O_PREV, O_NEXT = range(3)
OCCURRENCE_COLUMNS = 4

#: A hash table: rows of (key 1, key 2, value + 1, unused), 0 for a free row (so a big table
#: costs nothing until used: untouched zero pages); `used` [count].
Table = namedtuple("Table", ["rows", "used"])
#: The forest. Rows, not one array per field, because a merge reads several fields of few
#: tokens scattered over a big forest: one cache line per token instead of one per field (and
#: int32, which halves the memory a forest has the kernel fault in).
#: `tok`: a row per token (REC_OF is the record it is a child in, MEM_PREV/MEM_NEXT its neighbours
#: there, OWN_HEAD the first record it owns); `rec`: a row per record; `node_next` chains each
#: token's nodes (NODE_HEAD..NODE_TAIL) in pattern order; `free[:meta[0]]` are unused record ids.
Forest = namedtuple("Forest", ["tok", "rec", "node_next", "free", "meta", "records"])
#: Training's pairs, by id (dense, never reused): a row each (the pair, how many occurrences it has,
#: the first of them), their scores, whether merged, whether changed by this merge (`touched_ids`,
#: meta[0] of them). Occurrence rows: record r is occurrence r, token t's sibling pair R + t.
Pairs = namedtuple(
    "Pairs",
    ["table", "data", "score", "merged", "touched", "touched_ids", "meta", "occurrences"],
)

# --- a hash table of two int64 keys to a non-negative int64 (linear probing) ----------------------


@njit(cache=True, inline="always")
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
    return Table(np.zeros((capacity, 4), dtype=np.int64), np.zeros(1, dtype=np.int64))


@njit(cache=True, inline="always")
def table_find(table: Table, k1: int, k2: int) -> int:
    rows = table.rows
    mask = len(rows) - 1
    i = _home(k1, k2, mask)
    while True:
        value = rows[i, 2]
        if value == 0 or (rows[i, 0] == k1 and rows[i, 1] == k2):
            return value - 1
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def table_put(table: Table, k1: int, k2: int, value: int) -> None:
    """Insert a key that is not in the table."""
    rows = table.rows
    mask = len(rows) - 1
    i = _home(k1, k2, mask)
    while rows[i, 2] != 0:
        i = (i + 1) & mask
    rows[i, 0] = k1
    rows[i, 1] = k2
    rows[i, 2] = value + 1
    table.used[0] += 1


@njit(cache=True)
def table_delete(table: Table, k1: int, k2: int) -> None:
    """Remove a key that is in the table, shifting later keys of its probe run back."""
    rows = table.rows
    mask = len(rows) - 1
    i = _home(k1, k2, mask)
    while not (rows[i, 0] == k1 and rows[i, 1] == k2 and rows[i, 2] != 0):
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        if rows[j, 2] == 0:
            break
        home = _home(rows[j, 0], rows[j, 1], mask)
        if (j > i and (home <= i or home > j)) or (j < i and home <= i and home > j):
            rows[i, 0] = rows[j, 0]
            rows[i, 1] = rows[j, 1]
            rows[i, 2] = rows[j, 2]
            i = j
    rows[i, 2] = 0
    table.used[0] -= 1


@njit(cache=True, inline="always")
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
    tok = np.empty((count, TOKEN_COLUMNS), dtype=np.int32)
    for node in range(count):
        for column in range(TOKEN_COLUMNS):
            tok[node, column] = NONE
        tok[node, KIND], tok[node, PARENT], tok[node, EDGE] = kind[node], parent[node], edge[node]
        tok[node, SLOT], tok[node, ALIVE], tok[node, SIZE] = 0, 1, 1
        tok[node, NODE_HEAD], tok[node, NODE_TAIL] = node, node
        tok[node, OWN_COUNT], tok[node, HASHED] = 0, 0
    forest = Forest(
        tok,
        np.empty((records, RECORD_COLUMNS), dtype=np.int32),  # rows written when taken
        np.full(count, NONE, dtype=np.int64),
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
            record = NONE
            sibling = last_child[up]
            if sibling >= 0:  # runs of alike siblings are common: try the last one's record
                record = forest.tok[sibling, REC_OF]
                if (
                    forest.rec[record, REDGE] != edge[node]
                    or forest.rec[record, RKIND] != kind[node]
                ):
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
            forest.tok[node, PREV] = before
            forest.tok[before, NEXT] = node
    return forest


@njit(cache=True, inline="always")
def find_record(forest: Forest, owner: int, slot: int, edge: int, kind: int) -> int:
    """The record of `owner`'s children hanging from `slot` by `edge` of `kind`, or NONE."""
    if forest.tok[owner, HASHED]:
        return table_find(forest.records, owner * SHIFT + slot, kind * 256 + (edge & 255))
    record = forest.tok[owner, OWN_HEAD]
    while record >= 0:
        if (
            forest.rec[record, RKIND] == kind
            and forest.rec[record, RSLOT] == slot
            and forest.rec[record, REDGE] == edge
        ):
            return record
        record = forest.rec[record, ONEXT]
    return NONE


@njit(cache=True)
def _hash_records(forest: Forest, owner: int) -> None:
    """Put `owner`'s records in the hash table once it owns more than CHAIN_RECORDS."""
    if forest.tok[owner, HASHED] or forest.tok[owner, OWN_COUNT] <= CHAIN_RECORDS:
        return
    forest.tok[owner, HASHED] = 1
    record = forest.tok[owner, OWN_HEAD]
    while record >= 0:
        k1, k2 = _record_keys(forest, record)
        table_put(forest.records, k1, k2, record)
        record = forest.rec[record, ONEXT]


@njit(cache=True)
def _new_record(forest: Forest, owner: int, slot: int, edge: int, kind: int) -> int:
    top = forest.meta[0] - 1
    forest.meta[0] = top
    record = forest.free[top]
    forest.rec[record, OWNER] = owner
    forest.rec[record, RSLOT] = slot
    forest.rec[record, REDGE] = edge
    forest.rec[record, RKIND] = kind
    forest.rec[record, HEAD] = NONE
    forest.rec[record, TAIL] = NONE
    _chain_record(forest, record, owner)
    if forest.tok[owner, HASHED]:
        table_put(forest.records, owner * SHIFT + slot, kind * 256 + (edge & 255), record)
    else:
        _hash_records(forest, owner)
    return record


@njit(cache=True, inline="always")
def _chain_record(forest: Forest, record: int, owner: int) -> None:
    first = forest.tok[owner, OWN_HEAD]
    forest.rec[record, OPREV] = NONE
    forest.rec[record, ONEXT] = first
    if first >= 0:
        forest.rec[first, OPREV] = record
    forest.tok[owner, OWN_HEAD] = record
    forest.tok[owner, OWN_COUNT] += 1


@njit(cache=True, inline="always")
def _unchain_record(forest: Forest, record: int) -> None:
    owner = forest.rec[record, OWNER]
    before, after = forest.rec[record, OPREV], forest.rec[record, ONEXT]
    if before >= 0:
        forest.rec[before, ONEXT] = after
    else:
        forest.tok[owner, OWN_HEAD] = after
    if after >= 0:
        forest.rec[after, OPREV] = before
    forest.tok[owner, OWN_COUNT] -= 1


@njit(cache=True, inline="always")
def _record_keys(forest: Forest, record: int) -> tuple[int, int]:
    return (
        forest.rec[record, OWNER] * SHIFT + forest.rec[record, RSLOT],
        forest.rec[record, RKIND] * 256 + (forest.rec[record, REDGE] & 255),
    )


@njit(cache=True, inline="always")
def _insert_member(forest: Forest, record: int, token: int) -> None:
    """Add `token` to the record's children, keeping token order (it nearly always goes last)."""
    after = NONE
    before = forest.rec[record, TAIL]
    while before > token:
        after = before
        before = forest.tok[before, MEM_PREV]
    forest.tok[token, MEM_PREV] = before
    forest.tok[token, MEM_NEXT] = after
    if before >= 0:
        forest.tok[before, MEM_NEXT] = token
    else:
        forest.rec[record, HEAD] = token
    if after >= 0:
        forest.tok[after, MEM_PREV] = token
    else:
        forest.rec[record, TAIL] = token
    forest.tok[token, REC_OF] = record


@njit(cache=True, inline="always")
def _remove_member(forest: Forest, token: int) -> None:
    """Take `token` out of its record; an emptied record is dropped."""
    record = forest.tok[token, REC_OF]
    before, after = forest.tok[token, MEM_PREV], forest.tok[token, MEM_NEXT]
    if before >= 0:
        forest.tok[before, MEM_NEXT] = after
    else:
        forest.rec[record, HEAD] = after
    if after >= 0:
        forest.tok[after, MEM_PREV] = before
    else:
        forest.rec[record, TAIL] = before
    forest.tok[token, MEM_PREV] = forest.tok[token, MEM_NEXT] = forest.tok[token, REC_OF] = NONE
    if forest.rec[record, HEAD] == NONE:
        if forest.tok[forest.rec[record, OWNER], HASHED]:
            k1, k2 = _record_keys(forest, record)
            table_delete(forest.records, k1, k2)
        _unchain_record(forest, record)
        forest.free[forest.meta[0]] = record
        forest.meta[0] += 1


@njit(cache=True, inline="always")
def _unlink(forest: Forest, token: int) -> None:
    before, after = forest.tok[token, PREV], forest.tok[token, NEXT]
    if before >= 0:
        forest.tok[before, NEXT] = after
    if after >= 0:
        forest.tok[after, PREV] = before
    forest.tok[token, PREV] = forest.tok[token, NEXT] = NONE


@njit(cache=True)
def _take_over(forest: Forest, token: int, other: int) -> None:
    """`token` takes `other`'s nodes and children (their slots shift past its own nodes)."""
    offset = forest.tok[token, SIZE]
    forest.node_next[forest.tok[token, NODE_TAIL]] = forest.tok[other, NODE_HEAD]
    forest.tok[token, NODE_TAIL] = forest.tok[other, NODE_TAIL]
    forest.tok[token, SIZE] += forest.tok[other, SIZE]
    forest.tok[other, SIZE] = 0
    forest.tok[other, NODE_HEAD] = forest.tok[other, NODE_TAIL] = NONE
    record = forest.tok[other, OWN_HEAD]
    while record >= 0:
        following = forest.rec[record, ONEXT]
        if forest.tok[other, HASHED]:
            k1, k2 = _record_keys(forest, record)
            table_delete(forest.records, k1, k2)
        child = forest.rec[record, HEAD]
        while child >= 0:
            forest.tok[child, PARENT] = token
            forest.tok[child, SLOT] += offset
            child = forest.tok[child, MEM_NEXT]
        forest.rec[record, OWNER] = token
        forest.rec[record, RSLOT] += offset
        if forest.tok[token, HASHED]:
            k1, k2 = _record_keys(forest, record)
            table_put(forest.records, k1, k2, record)
        _chain_record(forest, record, token)
        record = following
    _hash_records(forest, token)
    forest.tok[other, OWN_HEAD] = NONE
    forest.tok[other, OWN_COUNT] = 0
    forest.tok[other, ALIVE] = 0


@njit(cache=True)
def _rekind(forest: Forest, token: int, new_kind: int) -> None:
    forest.tok[token, KIND] = new_kind
    up = forest.tok[token, PARENT]
    if up >= 0:
        _remove_member(forest, token)
        slot, edge = forest.tok[token, SLOT], forest.tok[token, EDGE]
        record = find_record(forest, up, slot, edge, new_kind)
        if record == NONE:
            record = _new_record(forest, up, slot, edge, new_kind)
        _insert_member(forest, record, token)


@njit(cache=True, inline="always")
def still(forest: Forest, record: int, owner: int, slot: int, edge: int, kind: int) -> int:
    """`record` if it is still the live record of that key (a dropped one may have been reused
    for another), else NONE: finds a parent's records around a merge without a lookup."""
    if record < 0:
        return NONE
    rec = forest.rec
    if (
        rec[record, HEAD] == NONE
        or rec[record, OWNER] != owner
        or rec[record, RKIND] != kind
        or rec[record, RSLOT] != slot
        or rec[record, REDGE] != edge
    ):
        return NONE
    return record


@njit(cache=True, inline="always")
def match(forest: Forest, token: int, parent: int, slot: int, edge: int, child: int) -> int:
    """Where merge (parent, slot, edge, child) applies at `token`: the record of the child key,
    or for a sibling merge the next sibling; NONE where it does not apply."""
    if forest.tok[token, ALIVE] == 0 or forest.tok[token, KIND] != parent:
        return NONE
    if slot == SIBLING:
        after = forest.tok[token, NEXT]
        if (
            after >= 0
            and forest.tok[after, KIND] == child
            and forest.tok[token, EDGE] == edge
            and forest.tok[after, EDGE] == edge
        ):
            return after
        return NONE
    return find_record(forest, token, slot, edge, child)


@njit(cache=True)
def apply_merge(forest: Forest, token: int, sibling: bool, where: int, new_kind: int) -> int:
    """Apply a merge `match` found at `token` (`where` is its result); returns the dead token."""
    if sibling:
        dead = where
        if forest.tok[dead, REC_OF] >= 0:
            _remove_member(forest, dead)
    else:
        dead = forest.rec[where, HEAD]
        _remove_member(forest, dead)
    _unlink(forest, dead)
    _take_over(forest, token, dead)
    _rekind(forest, token, new_kind)
    return dead


@njit(cache=True, inline="always")
def sibling_pair(forest: Forest, token: int) -> tuple[int, int]:
    """Table keys of `token`'s sibling pair, or (NONE, NONE) when it has none."""
    after = forest.tok[token, NEXT]
    if after < 0 or forest.tok[after, EDGE] != forest.tok[token, EDGE]:
        return NONE, NONE
    return pair_keys(
        forest.tok[token, KIND], SIBLING, forest.tok[token, EDGE], forest.tok[after, KIND]
    )


@njit(cache=True, inline="always")
def record_pair(forest: Forest, record: int) -> tuple[int, int]:
    return pair_keys(
        forest.tok[forest.rec[record, OWNER], KIND],
        forest.rec[record, RSLOT],
        forest.rec[record, REDGE],
        forest.rec[record, RKIND],
    )


@njit(cache=True)
def emit(forest: Forest) -> tuple:
    """The live tokens in order: kind, parent (token index), slot, edge, and their nodes."""
    count = len(forest.tok)
    index = np.full(count, NONE, dtype=np.int64)
    tokens = 0
    for token in range(count):
        if forest.tok[token, ALIVE] == 1:
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
        if forest.tok[token, ALIVE] == 0:
            continue
        kind[i] = forest.tok[token, KIND]
        up = forest.tok[token, PARENT]
        parent[i] = index[up] if up >= 0 else NONE
        slot[i] = forest.tok[token, SLOT]
        edge[i] = forest.tok[token, EDGE]
        root[i] = token
        node = forest.tok[token, NODE_HEAD]
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


@njit(cache=True, inline="always")
def _push_pair(
    heads: np.ndarray,
    entries: np.ndarray,
    fill: np.ndarray,
    ranks: Table,
    keys: tuple[int, int],
    above: int,
    owner: int,
) -> None:
    """Queue `owner` under the rank of the merge with pair `keys`, if it ranks after `above`
    (`entries` has room: `_with_room`). After its fill[1] queue heads, `heads` holds the last
    rank at which each kind is a merge's parent: that rules most pairs out before the table."""
    if keys[0] == NONE or heads[fill[1] + (keys[0] >> 32)] <= above:
        return
    rank = table_find(ranks, keys[0], keys[1])
    if rank > above:
        used = fill[0]
        entries[used, 0] = owner
        entries[used, 1] = heads[rank]
        heads[rank] = used
        fill[0] = used + 1


@njit(cache=True)
def _with_room(entries: np.ndarray, fill: np.ndarray, more: int) -> np.ndarray:
    """`entries`, or a copy twice as big when `more` might not fit."""
    used = fill[0]
    if used + more <= len(entries):
        return entries
    grown = np.empty((2 * (used + more), 2), dtype=np.int64)
    grown[:used] = entries[:used]
    return grown


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
    """Apply the merges in rank order, each at the owners queued under its rank in token order.

    A merge only creates candidates of higher rank (it makes a new kind) except where it makes
    two old tokens adjacent; training never revisits an earlier merge, so such candidates are
    dropped. A rank's queue is thus complete when its turn comes, and its owners, sorted, are
    visited in the order training applied the merge in. An owner queued twice is applied once:
    a merge changes its owner's kind.
    """
    count = len(forest.tok)
    if len(merge_parent) == 0:
        return
    # one queue per rank, then the last rank at which each kind is a merge's parent
    heads = np.full(2 * len(merge_parent) + num_base, NONE, dtype=np.int64)
    for rank in range(len(merge_parent)):
        heads[len(merge_parent) + merge_parent[rank]] = rank
    entries = np.empty((count + 16, 2), dtype=np.int64)
    fill = np.array([0, len(merge_parent)], dtype=np.int64)
    for token in range(count):
        if fill[0] + forest.tok[token, OWN_COUNT] + 1 > len(entries):
            entries = _with_room(entries, fill, forest.tok[token, OWN_COUNT] + 1)
        record = forest.tok[token, OWN_HEAD]
        while record >= 0:
            _push_pair(heads, entries, fill, ranks, record_pair(forest, record), -1, token)
            record = forest.rec[record, ONEXT]
        _push_pair(heads, entries, fill, ranks, sibling_pair(forest, token), -1, token)
    queued = np.empty(64, dtype=np.int64)
    for rank in range(len(merge_parent)):
        waiting = 0
        entry = heads[rank]
        while entry >= 0:
            if waiting == len(queued):
                queued = np.concatenate((queued, np.empty(len(queued), dtype=np.int64)))
            queued[waiting] = entries[entry, 0]
            waiting += 1
            entry = entries[entry, 1]
        if waiting == 0:
            continue
        owners = np.sort(queued[:waiting])
        parent_kind, slot, edge, child_kind = (
            merge_parent[rank],
            merge_slot[rank],
            merge_edge[rank],
            merge_child[rank],
        )
        sibling = slot == SIBLING
        new_kind = num_base + rank
        last = NONE
        for token in owners:
            if token == last:
                continue
            last = token
            where = match(forest, token, parent_kind, slot, edge, child_kind)
            if where == NONE:
                continue
            up, before = forest.tok[token, PARENT], forest.tok[token, PREV]
            token_slot, token_edge = forest.tok[token, SLOT], forest.tok[token, EDGE]
            child_before = NONE if sibling else forest.tok[forest.rec[where, HEAD], PREV]
            token_record = forest.tok[token, REC_OF]  # up's records of the old kinds
            dead_record = forest.tok[where, REC_OF] if sibling else NONE
            apply_merge(forest, token, sibling, where, new_kind)
            if fill[0] + forest.tok[token, OWN_COUNT] + 6 > len(entries):
                entries = _with_room(entries, fill, forest.tok[token, OWN_COUNT] + 6)
            record = forest.tok[token, OWN_HEAD]
            while record >= 0:
                _push_pair(heads, entries, fill, ranks, record_pair(forest, record), rank, token)
                record = forest.rec[record, ONEXT]
            _push_pair(heads, entries, fill, ranks, sibling_pair(forest, token), rank, token)
            if child_before >= 0:
                _push_pair(
                    heads,
                    entries,
                    fill,
                    ranks,
                    sibling_pair(forest, child_before),
                    rank,
                    child_before,
                )
            if before >= 0:
                _push_pair(heads, entries, fill, ranks, sibling_pair(forest, before), rank, before)
            if up >= 0:
                for i in range(3):
                    if i == 0:
                        record = forest.tok[token, REC_OF]
                    elif i == 1:
                        record = still(
                            forest, token_record, up, token_slot, token_edge, parent_kind
                        )
                    elif sibling and child_kind != parent_kind:
                        record = still(forest, dead_record, up, token_slot, token_edge, child_kind)
                    else:
                        record = NONE
                    if record >= 0:
                        _push_pair(
                            heads, entries, fill, ranks, record_pair(forest, record), rank, up
                        )


# --- training ---------------------------------------------------------------------------------


@njit(cache=True)
def _new_pairs(capacity: int, occurrences: np.ndarray) -> Pairs:
    data = np.zeros((capacity, PAIR_COLUMNS), dtype=np.int64)
    data[:, P_HEAD] = NONE
    return Pairs(
        new_table(capacity),
        data,
        np.zeros(capacity, dtype=np.float64),
        np.zeros(capacity, dtype=np.bool_),
        np.zeros(capacity, dtype=np.bool_),
        np.zeros(capacity, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        occurrences,
    )


@njit(cache=True)
def _pairs_with_room(pairs: Pairs, more: int) -> Pairs:
    """`pairs`, or a copy with twice the room when `more` new pairs might not fit."""
    used = pairs.table.used[0]
    if used + more <= len(pairs.data):
        return pairs
    grown = _new_pairs(2 * (used + more), pairs.occurrences)
    rows = pairs.table.rows
    for i in range(len(rows)):
        if rows[i, 2] != 0:
            table_put(grown.table, rows[i, 0], rows[i, 1], rows[i, 2] - 1)
    grown.data[:used] = pairs.data[:used]
    grown.touched_ids[:used] = pairs.touched_ids[:used]
    grown.score[:used] = pairs.score[:used]
    grown.merged[:used] = pairs.merged[:used]
    grown.touched[:used] = pairs.touched[:used]
    grown.meta[0] = pairs.meta[0]
    return grown


@njit(cache=True, inline="always")
def _touch(pairs: Pairs, pair: int) -> None:
    if not pairs.touched[pair]:
        pairs.touched[pair] = True
        pairs.touched_ids[pairs.meta[0]] = pair
        pairs.meta[0] += 1


@njit(cache=True, inline="always")
def _add(
    pairs: Pairs,
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
        (
            pairs.data[found, P_PARENT],
            pairs.data[found, P_SLOT],
            pairs.data[found, P_EDGE],
            pairs.data[found, P_CHILD],
        ) = pair
    first = pairs.data[found, P_HEAD]
    pairs.occurrences[occurrence, O_PREV] = NONE
    pairs.occurrences[occurrence, O_NEXT] = first
    if first >= 0:
        pairs.occurrences[first, O_PREV] = occurrence
    pairs.data[found, P_HEAD] = occurrence
    pairs.occurrences[occurrence, O_PAIR] = found
    pairs.data[found, P_COUNT] += 1
    pairs.score[found] += weight
    _touch(pairs, found)


@njit(cache=True, inline="always")
def _remove(pairs: Pairs, occurrence: int, weight: float) -> None:
    """Stop counting `occurrence` (if it is a pair occurrence now)."""
    found = pairs.occurrences[occurrence, O_PAIR]
    if found == NONE:
        return
    before, after = pairs.occurrences[occurrence, O_PREV], pairs.occurrences[occurrence, O_NEXT]
    if before >= 0:
        pairs.occurrences[before, O_NEXT] = after
    else:
        pairs.data[found, P_HEAD] = after
    if after >= 0:
        pairs.occurrences[after, O_PREV] = before
    pairs.occurrences[occurrence, O_PAIR] = NONE
    if pairs.data[found, P_COUNT] > 1:
        pairs.data[found, P_COUNT] -= 1
        pairs.score[found] -= weight
    else:  # zeroed, not decremented: float sums must not leave a ghost of a gone pair
        pairs.data[found, P_COUNT] = 0
        pairs.score[found] = 0.0
    _touch(pairs, found)


@njit(cache=True, inline="always")
def _add_record(forest: Forest, pairs: Pairs, record: int, weight: np.ndarray) -> None:
    owner = forest.rec[record, OWNER]
    pair = (
        forest.tok[owner, KIND],
        forest.rec[record, RSLOT],
        forest.rec[record, REDGE],
        forest.rec[record, RKIND],
    )
    _add(pairs, record, pair_keys(pair[0], pair[1], pair[2], pair[3]), pair, weight[owner])


@njit(cache=True, inline="always")
def _add_sibling(forest: Forest, pairs: Pairs, token: int, weight: np.ndarray) -> None:
    after = forest.tok[token, NEXT]
    if after < 0 or forest.tok[after, EDGE] != forest.tok[token, EDGE]:
        return
    pair = (forest.tok[token, KIND], SIBLING, forest.tok[token, EDGE], forest.tok[after, KIND])
    occurrence = len(forest.rec) + token
    _add(pairs, occurrence, pair_keys(pair[0], pair[1], pair[2], pair[3]), pair, weight[token])


@njit(cache=True)
def _add_owned(forest: Forest, pairs: Pairs, token: int, weight: np.ndarray) -> None:
    record = forest.tok[token, OWN_HEAD]
    while record >= 0:
        _add_record(forest, pairs, record, weight)
        record = forest.rec[record, ONEXT]
    _add_sibling(forest, pairs, token, weight)


@njit(cache=True)
def _remove_owned(forest: Forest, pairs: Pairs, token: int, weight: np.ndarray) -> None:
    record = forest.tok[token, OWN_HEAD]
    while record >= 0:
        _remove(pairs, record, weight[token])
        record = forest.rec[record, ONEXT]
    _remove(pairs, len(forest.rec) + token, weight[token])


@njit(cache=True, inline="always")
def _above(scores: np.ndarray, ids: np.ndarray, a: int, b: int, pairs: Pairs) -> bool:
    """Whether heap entry a comes before b: higher score, then the smaller pair tuple."""
    if scores[a] != scores[b]:
        return scores[a] < scores[b]  # scores are stored negated
    x, y = ids[a], ids[b]
    if pairs.data[x, P_PARENT] != pairs.data[y, P_PARENT]:
        return pairs.data[x, P_PARENT] < pairs.data[y, P_PARENT]
    if pairs.data[x, P_SLOT] != pairs.data[y, P_SLOT]:
        return pairs.data[x, P_SLOT] < pairs.data[y, P_SLOT]
    if pairs.data[x, P_EDGE] != pairs.data[y, P_EDGE]:
        return pairs.data[x, P_EDGE] < pairs.data[y, P_EDGE]
    return pairs.data[x, P_CHILD] < pairs.data[y, P_CHILD]


@njit(cache=True, inline="always")
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
    count = len(forest.tok)
    records = len(forest.rec)
    occurrences = np.full((records + count, OCCURRENCE_COLUMNS), NONE, dtype=np.int64)
    pairs = _new_pairs(max(1024, count // 4), occurrences)
    for token in range(count):
        if pairs.table.used[0] + forest.tok[token, OWN_COUNT] + 1 > len(pairs.data):
            pairs = _pairs_with_room(pairs, forest.tok[token, OWN_COUNT] + 1)
        _add_owned(forest, pairs, token, weight)
    used = pairs.table.used[0]
    scores = np.empty(max(16, 2 * used), dtype=np.float64)
    ids = np.empty(max(16, 2 * used), dtype=np.int64)
    size = 0
    for pair in range(used):
        pairs.touched[pair] = False
        if pairs.data[pair, P_COUNT] > 0:
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
            if (
                not pairs.merged[pair]
                and pairs.data[pair, P_COUNT] > 0
                and pairs.score[pair] == -scores[0]
            ):
                nodes = (
                    token_nodes[pairs.data[pair, P_PARENT]] + token_nodes[pairs.data[pair, P_CHILD]]
                )
                if max_token_nodes >= 0 and nodes > max_token_nodes:
                    pairs.merged[pair] = True  # too big now, too big forever: kinds never grow
                elif pairs.data[pair, P_COUNT] >= min_count:
                    best = pair
                    break
            size -= 1
            scores[0], ids[0] = scores[size], ids[size]
            _sift_down(scores, ids, 0, size, pairs)
        if best == NONE:
            break
        parent_kind, slot, edge, child_kind = (
            pairs.data[best, P_PARENT],
            pairs.data[best, P_SLOT],
            pairs.data[best, P_EDGE],
            pairs.data[best, P_CHILD],
        )
        new_kind = num_base + learned
        pairs.merged[best] = True
        token_nodes[new_kind] = token_nodes[parent_kind] + token_nodes[child_kind]
        owners = np.empty(pairs.data[best, P_COUNT], dtype=np.int64)
        occurrence = pairs.data[best, P_HEAD]
        for i in range(len(owners)):
            owners[i] = (
                forest.rec[occurrence, OWNER] if occurrence < records else occurrence - records
            )
            occurrence = pairs.occurrences[occurrence, O_NEXT]
        owners.sort()
        sibling = slot == SIBLING
        applied = 0
        for token in owners:
            where = match(forest, token, parent_kind, slot, edge, child_kind)
            if where == NONE:
                continue
            dead = where if sibling else forest.rec[where, HEAD]
            more = forest.tok[token, OWN_COUNT] + forest.tok[dead, OWN_COUNT] + 8
            if pairs.table.used[0] + more > len(pairs.data):
                pairs = _pairs_with_room(pairs, more)
            up, before = forest.tok[token, PARENT], forest.tok[token, PREV]
            token_slot, token_edge = forest.tok[token, SLOT], forest.tok[token, EDGE]
            child_before = NONE if sibling else forest.tok[dead, PREV]
            token_record = forest.tok[token, REC_OF]  # up's records of the old kinds
            dead_record = (
                forest.tok[dead, REC_OF] if sibling and child_kind != parent_kind else NONE
            )
            _remove_owned(forest, pairs, token, weight)
            if child_before >= 0:
                _remove(pairs, records + child_before, weight[child_before])
            if before >= 0:
                _remove(pairs, records + before, weight[before])
            if up >= 0:  # in the order the keys (old kind, other old kind, new kind) are listed
                _remove(pairs, token_record, weight[up])
                if dead_record >= 0:
                    _remove(pairs, dead_record, weight[up])
                record = find_record(forest, up, token_slot, token_edge, new_kind)
                if record >= 0:
                    _remove(pairs, record, weight[up])
            _remove_owned(forest, pairs, dead, weight)
            apply_merge(forest, token, sibling, where, new_kind)
            applied += 1
            _add_owned(forest, pairs, token, weight)
            if child_before >= 0:
                _add_sibling(forest, pairs, child_before, weight)
            if before >= 0:
                _add_sibling(forest, pairs, before, weight)
            if up >= 0:
                record = still(forest, token_record, up, token_slot, token_edge, parent_kind)
                if record >= 0:
                    _add_record(forest, pairs, record, weight)
                record = still(forest, dead_record, up, token_slot, token_edge, child_kind)
                if record >= 0:
                    _add_record(forest, pairs, record, weight)
                _add_record(forest, pairs, forest.tok[token, REC_OF], weight)
        merges[learned, 0] = parent_kind
        merges[learned, 1] = slot
        merges[learned, 2] = edge
        merges[learned, 3] = child_kind
        merges[learned, 4] = applied
        learned += 1
        for i in range(pairs.meta[0]):
            pair = pairs.touched_ids[i]
            pairs.touched[pair] = False
            if pairs.data[pair, P_COUNT] > 0 and not pairs.merged[pair]:
                if size == len(scores):
                    scores = np.concatenate((scores, np.empty(len(scores), dtype=np.float64)))
                    ids = np.concatenate((ids, np.empty(len(ids), dtype=np.int64)))
                scores[size] = -pairs.score[pair]
                ids[size] = pair
                _sift_up(scores, ids, size, pairs)
                size += 1
        pairs.meta[0] = 0
    return merges[:learned], pairs
