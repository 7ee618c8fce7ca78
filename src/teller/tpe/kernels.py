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
#
# The functions take the table's arrays (`rows`, `used`), not the `Table`: numba counts references
# to every array of a tuple it unpacks, a per-call cost that is most of a merge's work.


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


@njit(cache=True)
def table_find(rows: np.ndarray, k1: int, k2: int) -> int:
    mask = len(rows) - 1
    i = _home(k1, k2, mask)
    while True:
        value = rows[i, 2]
        if value == 0 or (rows[i, 0] == k1 and rows[i, 1] == k2):
            return value - 1
        i = (i + 1) & mask


@njit(cache=True)
def table_put(rows: np.ndarray, used: np.ndarray, k1: int, k2: int, value: int) -> None:
    """Insert a key that is not in the table."""
    mask = len(rows) - 1
    i = _home(k1, k2, mask)
    while rows[i, 2] != 0:
        i = (i + 1) & mask
    rows[i, 0] = k1
    rows[i, 1] = k2
    rows[i, 2] = value + 1
    used[0] += 1


@njit(cache=True)
def table_delete(rows: np.ndarray, used: np.ndarray, k1: int, k2: int) -> None:
    """Remove a key that is in the table, shifting later keys of its probe run back."""
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
    used[0] -= 1


@njit(cache=True, inline="always")
def pair_keys(parent_kind: int, slot: int, edge: int, child_kind: int) -> tuple[int, int]:
    return parent_kind * SHIFT + slot + 1, child_kind * 256 + (edge & 255)


# --- the forest -------------------------------------------------------------------------------
#
# The kernels take a `Forest` and unpack it once; the functions they call take its arrays: `tok`,
# `rec`, `node_next`, the free record ids (`free`, `meta`) and the records' hash table (`rows`,
# `used`), for the reason given above the hash table.


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
    rec = np.empty((records, RECORD_COLUMNS), dtype=np.int32)  # rows written when taken
    free = np.arange(records - 1, -1, -1).astype(np.int64)
    meta = np.full(1, records, dtype=np.int64)
    table = new_table(records)
    rows, used = table.rows, table.used
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
                record = tok[sibling, REC_OF]
                if rec[record, REDGE] != edge[node] or rec[record, RKIND] != kind[node]:
                    record = find_record(tok, rec, rows, up, 0, edge[node], kind[node])
            if record == NONE:
                record = _new_record(
                    tok, rec, free, meta, rows, used, up, 0, edge[node], kind[node]
                )
            tail = rec[record, TAIL]  # nodes come in order: node goes after every member
            tok[node, MEM_PREV] = tail
            if tail >= 0:
                tok[tail, MEM_NEXT] = node
            else:
                rec[record, HEAD] = node
            rec[record, TAIL] = node
            tok[node, REC_OF] = record
            before = last_child[up]
            last_child[up] = node
        else:
            before = last_root
            last_root = node
        if before >= 0:
            tok[node, PREV] = before
            tok[before, NEXT] = node
    return Forest(tok, rec, np.full(count, NONE, dtype=np.int64), free, meta, table)


@njit(cache=True)
def find_record(
    tok: np.ndarray, rec: np.ndarray, rows: np.ndarray, owner: int, slot: int, edge: int, kind: int
) -> int:
    """The record of `owner`'s children hanging from `slot` by `edge` of `kind`, or NONE."""
    if tok[owner, HASHED]:
        return table_find(rows, owner * SHIFT + slot, kind * 256 + (edge & 255))
    record = tok[owner, OWN_HEAD]
    while record >= 0:
        if rec[record, RKIND] == kind and rec[record, RSLOT] == slot and rec[record, REDGE] == edge:
            return record
        record = rec[record, ONEXT]
    return NONE


@njit(cache=True)
def _hash_records(
    tok: np.ndarray, rec: np.ndarray, rows: np.ndarray, used: np.ndarray, owner: int
) -> None:
    """Put `owner`'s records in the hash table once it owns more than CHAIN_RECORDS."""
    if tok[owner, HASHED] or tok[owner, OWN_COUNT] <= CHAIN_RECORDS:
        return
    tok[owner, HASHED] = 1
    record = tok[owner, OWN_HEAD]
    while record >= 0:
        k1, k2 = _record_keys(rec, record)
        table_put(rows, used, k1, k2, record)
        record = rec[record, ONEXT]


@njit(cache=True)
def _new_record(
    tok: np.ndarray,
    rec: np.ndarray,
    free: np.ndarray,
    meta: np.ndarray,
    rows: np.ndarray,
    used: np.ndarray,
    owner: int,
    slot: int,
    edge: int,
    kind: int,
) -> int:
    top = meta[0] - 1
    meta[0] = top
    record = free[top]
    rec[record, OWNER] = owner
    rec[record, RSLOT] = slot
    rec[record, REDGE] = edge
    rec[record, RKIND] = kind
    rec[record, HEAD] = NONE
    rec[record, TAIL] = NONE
    _chain_record(tok, rec, record, owner)
    if tok[owner, HASHED]:
        table_put(rows, used, owner * SHIFT + slot, kind * 256 + (edge & 255), record)
    else:
        _hash_records(tok, rec, rows, used, owner)
    return record


@njit(cache=True)
def _chain_record(tok: np.ndarray, rec: np.ndarray, record: int, owner: int) -> None:
    first = tok[owner, OWN_HEAD]
    rec[record, OPREV] = NONE
    rec[record, ONEXT] = first
    if first >= 0:
        rec[first, OPREV] = record
    tok[owner, OWN_HEAD] = record
    tok[owner, OWN_COUNT] += 1


@njit(cache=True)
def _unchain_record(tok: np.ndarray, rec: np.ndarray, record: int) -> None:
    owner = rec[record, OWNER]
    before, after = rec[record, OPREV], rec[record, ONEXT]
    if before >= 0:
        rec[before, ONEXT] = after
    else:
        tok[owner, OWN_HEAD] = after
    if after >= 0:
        rec[after, OPREV] = before
    tok[owner, OWN_COUNT] -= 1


@njit(cache=True, inline="always")
def _record_keys(rec: np.ndarray, record: int) -> tuple[int, int]:
    return (
        rec[record, OWNER] * SHIFT + rec[record, RSLOT],
        rec[record, RKIND] * 256 + (rec[record, REDGE] & 255),
    )


@njit(cache=True)
def _insert_member(tok: np.ndarray, rec: np.ndarray, record: int, token: int) -> None:
    """Add `token` to the record's children, keeping token order (it nearly always goes last)."""
    after = NONE
    before = rec[record, TAIL]
    while before > token:
        after = before
        before = tok[before, MEM_PREV]
    tok[token, MEM_PREV] = before
    tok[token, MEM_NEXT] = after
    if before >= 0:
        tok[before, MEM_NEXT] = token
    else:
        rec[record, HEAD] = token
    if after >= 0:
        tok[after, MEM_PREV] = token
    else:
        rec[record, TAIL] = token
    tok[token, REC_OF] = record


@njit(cache=True)
def _remove_member(
    tok: np.ndarray,
    rec: np.ndarray,
    free: np.ndarray,
    meta: np.ndarray,
    rows: np.ndarray,
    used: np.ndarray,
    token: int,
) -> None:
    """Take `token` out of its record; an emptied record is dropped."""
    record = tok[token, REC_OF]
    before, after = tok[token, MEM_PREV], tok[token, MEM_NEXT]
    if before >= 0:
        tok[before, MEM_NEXT] = after
    else:
        rec[record, HEAD] = after
    if after >= 0:
        tok[after, MEM_PREV] = before
    else:
        rec[record, TAIL] = before
    tok[token, MEM_PREV] = tok[token, MEM_NEXT] = tok[token, REC_OF] = NONE
    if rec[record, HEAD] == NONE:
        if tok[rec[record, OWNER], HASHED]:
            k1, k2 = _record_keys(rec, record)
            table_delete(rows, used, k1, k2)
        _unchain_record(tok, rec, record)
        free[meta[0]] = record
        meta[0] += 1


@njit(cache=True)
def _unlink(tok: np.ndarray, token: int) -> None:
    before, after = tok[token, PREV], tok[token, NEXT]
    if before >= 0:
        tok[before, NEXT] = after
    if after >= 0:
        tok[after, PREV] = before
    tok[token, PREV] = tok[token, NEXT] = NONE


@njit(cache=True)
def _take_over(
    tok: np.ndarray,
    rec: np.ndarray,
    node_next: np.ndarray,
    rows: np.ndarray,
    used: np.ndarray,
    token: int,
    other: int,
) -> None:
    """`token` takes `other`'s nodes and children (their slots shift past its own nodes)."""
    offset = tok[token, SIZE]
    node_next[tok[token, NODE_TAIL]] = tok[other, NODE_HEAD]
    tok[token, NODE_TAIL] = tok[other, NODE_TAIL]
    tok[token, SIZE] += tok[other, SIZE]
    tok[other, SIZE] = 0
    tok[other, NODE_HEAD] = tok[other, NODE_TAIL] = NONE
    record = tok[other, OWN_HEAD]
    while record >= 0:
        following = rec[record, ONEXT]
        if tok[other, HASHED]:
            k1, k2 = _record_keys(rec, record)
            table_delete(rows, used, k1, k2)
        child = rec[record, HEAD]
        while child >= 0:
            tok[child, PARENT] = token
            tok[child, SLOT] += offset
            child = tok[child, MEM_NEXT]
        rec[record, OWNER] = token
        rec[record, RSLOT] += offset
        if tok[token, HASHED]:
            k1, k2 = _record_keys(rec, record)
            table_put(rows, used, k1, k2, record)
        _chain_record(tok, rec, record, token)
        record = following
    _hash_records(tok, rec, rows, used, token)
    tok[other, OWN_HEAD] = NONE
    tok[other, OWN_COUNT] = 0
    tok[other, ALIVE] = 0


@njit(cache=True)
def _rekind(
    tok: np.ndarray,
    rec: np.ndarray,
    free: np.ndarray,
    meta: np.ndarray,
    rows: np.ndarray,
    used: np.ndarray,
    token: int,
    new_kind: int,
) -> None:
    tok[token, KIND] = new_kind
    up = tok[token, PARENT]
    if up >= 0:
        _remove_member(tok, rec, free, meta, rows, used, token)
        slot, edge = tok[token, SLOT], tok[token, EDGE]
        record = find_record(tok, rec, rows, up, slot, edge, new_kind)
        if record == NONE:
            record = _new_record(tok, rec, free, meta, rows, used, up, slot, edge, new_kind)
        _insert_member(tok, rec, record, token)


@njit(cache=True)
def still(rec: np.ndarray, record: int, owner: int, slot: int, edge: int, kind: int) -> int:
    """`record` if it is still the live record of that key (a dropped one may have been reused
    for another), else NONE: finds a parent's records around a merge without a lookup."""
    if record < 0:
        return NONE
    if (
        rec[record, HEAD] == NONE
        or rec[record, OWNER] != owner
        or rec[record, RKIND] != kind
        or rec[record, RSLOT] != slot
        or rec[record, REDGE] != edge
    ):
        return NONE
    return record


@njit(cache=True)
def match(
    tok: np.ndarray,
    rec: np.ndarray,
    rows: np.ndarray,
    token: int,
    parent: int,
    slot: int,
    edge: int,
    child: int,
) -> int:
    """Where merge (parent, slot, edge, child) applies at `token`: the record of the child key,
    or for a sibling merge the next sibling; NONE where it does not apply."""
    if tok[token, ALIVE] == 0 or tok[token, KIND] != parent:
        return NONE
    if slot == SIBLING:
        after = tok[token, NEXT]
        if (
            after >= 0
            and tok[after, KIND] == child
            and tok[token, EDGE] == edge
            and tok[after, EDGE] == edge
        ):
            return after
        return NONE
    return find_record(tok, rec, rows, token, slot, edge, child)


@njit(cache=True)
def apply_merge(
    tok: np.ndarray,
    rec: np.ndarray,
    node_next: np.ndarray,
    free: np.ndarray,
    meta: np.ndarray,
    rows: np.ndarray,
    used: np.ndarray,
    token: int,
    sibling: bool,
    where: int,
    new_kind: int,
) -> int:
    """Apply a merge `match` found at `token` (`where` is its result); returns the dead token."""
    if sibling:
        dead = where
        if tok[dead, REC_OF] >= 0:
            _remove_member(tok, rec, free, meta, rows, used, dead)
    else:
        dead = rec[where, HEAD]
        _remove_member(tok, rec, free, meta, rows, used, dead)
    _unlink(tok, dead)
    _take_over(tok, rec, node_next, rows, used, token, dead)
    _rekind(tok, rec, free, meta, rows, used, token, new_kind)
    return dead


@njit(cache=True, inline="always")
def sibling_pair(tok: np.ndarray, token: int) -> tuple[int, int]:
    """Table keys of `token`'s sibling pair, or (NONE, NONE) when it has none."""
    after = tok[token, NEXT]
    if after < 0 or tok[after, EDGE] != tok[token, EDGE]:
        return NONE, NONE
    return pair_keys(tok[token, KIND], SIBLING, tok[token, EDGE], tok[after, KIND])


@njit(cache=True, inline="always")
def record_pair(tok: np.ndarray, rec: np.ndarray, record: int) -> tuple[int, int]:
    return pair_keys(
        tok[rec[record, OWNER], KIND], rec[record, RSLOT], rec[record, REDGE], rec[record, RKIND]
    )


@njit(cache=True)
def emit(forest: Forest) -> tuple:
    """The live tokens in order: kind, parent (token index), slot, edge, and their nodes."""
    tok, node_next = forest.tok, forest.node_next
    count = len(tok)
    index = np.full(count, NONE, dtype=np.int64)
    tokens = 0
    for token in range(count):
        if tok[token, ALIVE] == 1:
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
        if tok[token, ALIVE] == 0:
            continue
        kind[i] = tok[token, KIND]
        up = tok[token, PARENT]
        parent[i] = index[up] if up >= 0 else NONE
        slot[i] = tok[token, SLOT]
        edge[i] = tok[token, EDGE]
        root[i] = token
        node = tok[token, NODE_HEAD]
        while node >= 0:
            rows[row] = node
            row += 1
            node = node_next[node]
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
        table_put(table.rows, table.used, k1, k2, rank)
    return table


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
    tok, rec, node_next, free, meta, records = forest
    _encode(
        tok,
        rec,
        node_next,
        free,
        meta,
        records.rows,
        records.used,
        ranks.rows,
        merge_parent,
        merge_slot,
        merge_edge,
        merge_child,
        num_base,
    )


@njit(cache=True)
def _encode(
    tok: np.ndarray,
    rec: np.ndarray,
    node_next: np.ndarray,
    free: np.ndarray,
    meta: np.ndarray,
    rows: np.ndarray,
    used: np.ndarray,
    rank_rows: np.ndarray,
    merge_parent: np.ndarray,
    merge_slot: np.ndarray,
    merge_edge: np.ndarray,
    merge_child: np.ndarray,
    num_base: int,
) -> None:
    """`encode_merges` on the forest's arrays, as one loop that passes no arrays to functions on
    its common path.

    Numba counts a reference to each array a function is passed, with an atomic add, and often
    cannot prune the pair where the arrays' last uses fall on different branches; between small
    functions over the forest that costs about half of a merge's time. So the merge application
    (`match`, `apply_merge`) and the queueing of the candidates it makes are written out here
    over arrays bound once, in the order of training's steps; only the rare work of owners with
    hashed records (`table_put`, `table_delete`, `_hash_records`) calls out.
    `tests/tpe/test_fast_path_equivalence.py` holds the tokens to the reference tokenizer's.
    """
    count = len(tok)
    merges = len(merge_parent)
    if merges == 0:
        return
    # one queue per rank, then the last rank at which each kind is a merge's parent: a pair whose
    # parent kind is no merge's parent after the current rank is ruled out before the rank table
    heads = np.full(2 * merges + num_base, NONE, dtype=np.int64)
    for rank in range(merges):
        heads[merges + merge_parent[rank]] = rank
    entries = np.empty((count + 16, 2), dtype=np.int64)
    filled = 0
    queued = np.empty(64, dtype=np.int64)
    parent_kind = slot = edge = child_kind = new_kind = 0
    sibling = False
    for rank in range(-1, merges):
        if rank == -1:  # the fresh forest's candidates: every token's records and sibling pair
            waiting = count
        else:
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
            queued[:waiting].sort()
            parent_kind, slot, edge, child_kind = (
                merge_parent[rank],
                merge_slot[rank],
                merge_edge[rank],
                merge_child[rank],
            )
            sibling = slot == SIBLING
            new_kind = num_base + rank
        last = NONE
        for i in range(waiting):
            token = i if rank == -1 else queued[i]
            up = before = child_before = token_record = dead_record = NONE
            token_slot = token_edge = 0
            if rank >= 0:
                if token == last:
                    continue
                last = token
                # match: where the merge applies at token (next sibling, or child record)
                if tok[token, ALIVE] == 0 or tok[token, KIND] != parent_kind:
                    continue
                if sibling:
                    where = tok[token, NEXT]
                    if (
                        where < 0
                        or tok[where, KIND] != child_kind
                        or tok[token, EDGE] != edge
                        or tok[where, EDGE] != edge
                    ):
                        continue
                elif tok[token, HASHED]:
                    where = table_find(rows, token * SHIFT + slot, child_kind * 256 + (edge & 255))
                else:
                    where = tok[token, OWN_HEAD]
                    while where >= 0 and not (
                        rec[where, RKIND] == child_kind
                        and rec[where, RSLOT] == slot
                        and rec[where, REDGE] == edge
                    ):
                        where = rec[where, ONEXT]
                if where == NONE:
                    continue
                up, before = tok[token, PARENT], tok[token, PREV]
                token_slot, token_edge = tok[token, SLOT], tok[token, EDGE]
                dead = where if sibling else rec[where, HEAD]
                child_before = NONE if sibling else tok[dead, PREV]
                token_record = tok[token, REC_OF]  # up's records of the old kinds
                dead_record = tok[where, REC_OF] if sibling else NONE
                # apply_merge: take dead out of its record and sibling list, then token takes
                # over dead's nodes and children and, as new_kind, moves to that key of up
                for member in (dead, token):
                    if member == token:
                        tok[token, KIND] = new_kind
                        if up < 0:
                            break
                    record = tok[member, REC_OF]
                    if record >= 0:  # (a sibling merge's dead root token has none)
                        prev_member, next_member = tok[member, MEM_PREV], tok[member, MEM_NEXT]
                        if prev_member >= 0:
                            tok[prev_member, MEM_NEXT] = next_member
                        else:
                            rec[record, HEAD] = next_member
                        if next_member >= 0:
                            tok[next_member, MEM_PREV] = prev_member
                        else:
                            rec[record, TAIL] = prev_member
                        tok[member, MEM_PREV] = tok[member, MEM_NEXT] = tok[member, REC_OF] = NONE
                        if rec[record, HEAD] == NONE:  # emptied: unchain and free the record
                            owner = rec[record, OWNER]
                            if tok[owner, HASHED]:
                                k1, k2 = _record_keys(rec, record)
                                table_delete(rows, used, k1, k2)
                            prev_record, next_record = rec[record, OPREV], rec[record, ONEXT]
                            if prev_record >= 0:
                                rec[prev_record, ONEXT] = next_record
                            else:
                                tok[owner, OWN_HEAD] = next_record
                            if next_record >= 0:
                                rec[next_record, OPREV] = prev_record
                            tok[owner, OWN_COUNT] -= 1
                            free[meta[0]] = record
                            meta[0] += 1
                    if member == dead:
                        prev_sibling, next_sibling = tok[dead, PREV], tok[dead, NEXT]
                        if prev_sibling >= 0:
                            tok[prev_sibling, NEXT] = next_sibling
                        if next_sibling >= 0:
                            tok[next_sibling, PREV] = prev_sibling
                        tok[dead, PREV] = tok[dead, NEXT] = NONE
                        offset = tok[token, SIZE]
                        node_next[tok[token, NODE_TAIL]] = tok[dead, NODE_HEAD]
                        tok[token, NODE_TAIL] = tok[dead, NODE_TAIL]
                        tok[token, SIZE] += tok[dead, SIZE]
                        tok[dead, SIZE] = 0
                        tok[dead, NODE_HEAD] = tok[dead, NODE_TAIL] = NONE
                        record = tok[dead, OWN_HEAD]
                        while record >= 0:
                            following = rec[record, ONEXT]
                            if tok[dead, HASHED]:
                                k1, k2 = _record_keys(rec, record)
                                table_delete(rows, used, k1, k2)
                            child = rec[record, HEAD]
                            while child >= 0:
                                tok[child, PARENT] = token
                                tok[child, SLOT] += offset
                                child = tok[child, MEM_NEXT]
                            rec[record, OWNER] = token
                            rec[record, RSLOT] += offset
                            if tok[token, HASHED]:
                                k1, k2 = _record_keys(rec, record)
                                table_put(rows, used, k1, k2, record)
                            first = tok[token, OWN_HEAD]
                            rec[record, OPREV] = NONE
                            rec[record, ONEXT] = first
                            if first >= 0:
                                rec[first, OPREV] = record
                            tok[token, OWN_HEAD] = record
                            tok[token, OWN_COUNT] += 1
                            record = following
                        if not tok[token, HASHED] and tok[token, OWN_COUNT] > CHAIN_RECORDS:
                            _hash_records(tok, rec, rows, used, token)
                        tok[dead, OWN_HEAD] = NONE
                        tok[dead, OWN_COUNT] = 0
                        tok[dead, ALIVE] = 0
                if up >= 0:  # token joins up's record of (slot, edge, new kind)
                    if tok[up, HASHED]:
                        record = table_find(
                            rows, up * SHIFT + token_slot, new_kind * 256 + (token_edge & 255)
                        )
                    else:
                        record = tok[up, OWN_HEAD]
                        while record >= 0 and not (
                            rec[record, RKIND] == new_kind
                            and rec[record, RSLOT] == token_slot
                            and rec[record, REDGE] == token_edge
                        ):
                            record = rec[record, ONEXT]
                    if record == NONE:  # a new record, first in up's chain
                        top = meta[0] - 1
                        meta[0] = top
                        record = free[top]
                        rec[record, OWNER] = up
                        rec[record, RSLOT] = token_slot
                        rec[record, REDGE] = token_edge
                        rec[record, RKIND] = new_kind
                        rec[record, HEAD] = rec[record, TAIL] = NONE
                        first = tok[up, OWN_HEAD]
                        rec[record, OPREV] = NONE
                        rec[record, ONEXT] = first
                        if first >= 0:
                            rec[first, OPREV] = record
                        tok[up, OWN_HEAD] = record
                        tok[up, OWN_COUNT] += 1
                        if tok[up, HASHED]:
                            k1, k2 = _record_keys(rec, record)
                            table_put(rows, used, k1, k2, record)
                        elif tok[up, OWN_COUNT] > CHAIN_RECORDS:
                            _hash_records(tok, rec, rows, used, up)
                    next_member = NONE
                    prev_member = rec[record, TAIL]
                    while prev_member > token:
                        next_member = prev_member
                        prev_member = tok[prev_member, MEM_PREV]
                    tok[token, MEM_PREV] = prev_member
                    tok[token, MEM_NEXT] = next_member
                    if prev_member >= 0:
                        tok[prev_member, MEM_NEXT] = token
                    else:
                        rec[record, HEAD] = token
                    if next_member >= 0:
                        tok[next_member, MEM_PREV] = token
                    else:
                        rec[record, TAIL] = token
                    tok[token, REC_OF] = record
            # queue the candidates this merge made (all of a token's, for the fresh forest):
            # token's records and sibling pair, then the left neighbours' sibling pairs, then
            # up's records of the new kind and of the old ones
            more = tok[token, OWN_COUNT] + 6
            if filled + more > len(entries):
                grown = np.empty((2 * (filled + more), 2), dtype=np.int64)
                grown[:filled] = entries[:filled]
                entries = grown
            record = tok[token, OWN_HEAD]
            candidate = 0
            while True:
                owner = token
                if record >= 0:
                    k1, k2 = record_pair(tok, rec, record)
                    record = rec[record, ONEXT]
                else:
                    candidate += 1
                    if candidate == 1:
                        k1, k2 = sibling_pair(tok, token)
                    elif rank == -1:
                        break
                    elif candidate == 2 or candidate == 3:
                        owner = child_before if candidate == 2 else before
                        if owner < 0:
                            continue
                        k1, k2 = sibling_pair(tok, owner)
                    elif candidate <= 6 and up >= 0:
                        owner = up
                        if candidate == 4:
                            found = tok[token, REC_OF]
                        elif candidate == 5:
                            found = still(
                                rec, token_record, up, token_slot, token_edge, parent_kind
                            )
                        elif sibling and child_kind != parent_kind:
                            found = still(rec, dead_record, up, token_slot, token_edge, child_kind)
                        else:
                            found = NONE
                        if found < 0:
                            continue
                        k1, k2 = record_pair(tok, rec, found)
                    else:
                        break
                if k1 == NONE or heads[merges + (k1 >> 32)] <= rank:
                    continue
                later = table_find(rank_rows, k1, k2)
                if later > rank:
                    entries[filled, 0] = owner
                    entries[filled, 1] = heads[later]
                    heads[later] = filled
                    filled += 1


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
            table_put(grown.table.rows, grown.table.used, rows[i, 0], rows[i, 1], rows[i, 2] - 1)
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
    found = table_find(pairs.table.rows, keys[0], keys[1])
    if found == NONE:
        found = pairs.table.used[0]
        table_put(pairs.table.rows, pairs.table.used, keys[0], keys[1], found)
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
def _add_record(
    tok: np.ndarray, rec: np.ndarray, pairs: Pairs, record: int, weight: np.ndarray
) -> None:
    owner = rec[record, OWNER]
    pair = (tok[owner, KIND], rec[record, RSLOT], rec[record, REDGE], rec[record, RKIND])
    _add(pairs, record, pair_keys(pair[0], pair[1], pair[2], pair[3]), pair, weight[owner])


@njit(cache=True, inline="always")
def _add_sibling(
    tok: np.ndarray, rec: np.ndarray, pairs: Pairs, token: int, weight: np.ndarray
) -> None:
    after = tok[token, NEXT]
    if after < 0 or tok[after, EDGE] != tok[token, EDGE]:
        return
    pair = (tok[token, KIND], SIBLING, tok[token, EDGE], tok[after, KIND])
    occurrence = len(rec) + token
    _add(pairs, occurrence, pair_keys(pair[0], pair[1], pair[2], pair[3]), pair, weight[token])


@njit(cache=True)
def _add_owned(
    tok: np.ndarray, rec: np.ndarray, pairs: Pairs, token: int, weight: np.ndarray
) -> None:
    record = tok[token, OWN_HEAD]
    while record >= 0:
        _add_record(tok, rec, pairs, record, weight)
        record = rec[record, ONEXT]
    _add_sibling(tok, rec, pairs, token, weight)


@njit(cache=True)
def _remove_owned(
    tok: np.ndarray, rec: np.ndarray, pairs: Pairs, token: int, weight: np.ndarray
) -> None:
    record = tok[token, OWN_HEAD]
    while record >= 0:
        _remove(pairs, record, weight[token])
        record = rec[record, ONEXT]
    _remove(pairs, len(rec) + token, weight[token])


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
    tok, rec, node_next, free, meta, record_table = forest
    record_rows, record_used = record_table
    count = len(tok)
    records = len(rec)
    occurrences = np.full((records + count, OCCURRENCE_COLUMNS), NONE, dtype=np.int64)
    pairs = _new_pairs(max(1024, count // 4), occurrences)
    for token in range(count):
        if pairs.table.used[0] + tok[token, OWN_COUNT] + 1 > len(pairs.data):
            pairs = _pairs_with_room(pairs, tok[token, OWN_COUNT] + 1)
        _add_owned(tok, rec, pairs, token, weight)
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
            owners[i] = rec[occurrence, OWNER] if occurrence < records else occurrence - records
            occurrence = pairs.occurrences[occurrence, O_NEXT]
        owners.sort()
        sibling = slot == SIBLING
        applied = 0
        for token in owners:
            where = match(tok, rec, record_rows, token, parent_kind, slot, edge, child_kind)
            if where == NONE:
                continue
            dead = where if sibling else rec[where, HEAD]
            more = tok[token, OWN_COUNT] + tok[dead, OWN_COUNT] + 8
            if pairs.table.used[0] + more > len(pairs.data):
                pairs = _pairs_with_room(pairs, more)
            up, before = tok[token, PARENT], tok[token, PREV]
            token_slot, token_edge = tok[token, SLOT], tok[token, EDGE]
            child_before = NONE if sibling else tok[dead, PREV]
            token_record = tok[token, REC_OF]  # up's records of the old kinds
            dead_record = tok[dead, REC_OF] if sibling and child_kind != parent_kind else NONE
            _remove_owned(tok, rec, pairs, token, weight)
            if child_before >= 0:
                _remove(pairs, records + child_before, weight[child_before])
            if before >= 0:
                _remove(pairs, records + before, weight[before])
            if up >= 0:  # in the order the keys (old kind, other old kind, new kind) are listed
                _remove(pairs, token_record, weight[up])
                if dead_record >= 0:
                    _remove(pairs, dead_record, weight[up])
                record = find_record(tok, rec, record_rows, up, token_slot, token_edge, new_kind)
                if record >= 0:
                    _remove(pairs, record, weight[up])
            _remove_owned(tok, rec, pairs, dead, weight)
            apply_merge(
                tok,
                rec,
                node_next,
                free,
                meta,
                record_rows,
                record_used,
                token,
                sibling,
                where,
                new_kind,
            )
            applied += 1
            _add_owned(tok, rec, pairs, token, weight)
            if child_before >= 0:
                _add_sibling(tok, rec, pairs, child_before, weight)
            if before >= 0:
                _add_sibling(tok, rec, pairs, before, weight)
            if up >= 0:
                record = still(rec, token_record, up, token_slot, token_edge, parent_kind)
                if record >= 0:
                    _add_record(tok, rec, pairs, record, weight)
                record = still(rec, dead_record, up, token_slot, token_edge, child_kind)
                if record >= 0:
                    _add_record(tok, rec, pairs, record, weight)
                _add_record(tok, rec, pairs, tok[token, REC_OF], weight)
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
