"""The compiled forest's parts that the equivalence test reaches only by chance: the hash table's
deletion (keys shifted back along a probe run) and parents wide enough that their records move
from a walked chain to the hash table."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from teller.tpe import TPE, kernels
from tpe.reference_tpe import reference_encode, reference_train
from tpe.test_fast_path_equivalence import assert_same_tokens, assert_same_vocabulary
from tpe.test_tokenizer import _repeat_slice

# few distinct keys in a 16-row table: long probe runs, wrapping around the end
KEYS = st.tuples(st.integers(0, 5), st.integers(0, 5))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), KEYS), max_size=60))
def test_the_table_finds_what_was_put_and_not_what_was_deleted(
    operations: list[tuple[bool, tuple[int, int]]],
) -> None:
    table = kernels.new_table(8)
    expected: dict[tuple[int, int], int] = {}
    for number, (put, key) in enumerate(operations):
        if put and key not in expected and len(expected) < 8:
            kernels.table_put(table.rows, table.used, *key, number)
            expected[key] = number
        elif not put and key in expected:
            kernels.table_delete(table.rows, table.used, *key)
            del expected[key]
        for k1 in range(6):
            for k2 in range(6):
                assert kernels.table_find(table.rows, k1, k2) == expected.get(
                    (k1, k2), kernels.NONE
                )
        assert table.used[0] == len(expected)


def test_a_parent_of_many_kinds_trains_and_encodes_like_the_reference() -> None:
    # a step root with 3 * CHAIN_RECORDS kinds of child, so its records are hashed, then merged
    pattern = [("cpu_op", f"aten::op{i}", -1) for i in range(3 * kernels.CHAIN_RECORDS)]
    pattern += [("runtime", "cudaLaunchKernel", 0), ("runtime", "cudaLaunchKernel", 1)]
    steps = [_repeat_slice(pattern, copies) for copies in (3, 5, 8)]

    fast = TPE.train(steps, 96, min_count=1)
    reference = reference_train(steps, 96, min_count=1)

    assert_same_vocabulary(fast, reference)
    assert len(fast.merges) > 3 * kernels.CHAIN_RECORDS
    for piece in steps:
        assert_same_tokens(fast.encode(piece), reference_encode(reference, piece))
