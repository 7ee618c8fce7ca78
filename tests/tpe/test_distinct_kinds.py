"""`_distinct_kinds` counts small name codes instead of sorting them; both ways must give what
`np.unique` gives, in its order (the kinds' order decides the base vocabulary's ties)."""

from __future__ import annotations

import dataclasses

import numpy as np

from teller.slices.slice import Slice
from teller.tpe.tokenizer import _distinct_kinds
from tpe.test_tokenizer import _repeat_slice, optimizer_step_slice

PATTERN = [("cpu_op", "aten::mm", -1), ("runtime", "cudaLaunchKernel", 0), ("kernel", "gemm", 1)]


def _assert_like_unique(piece: Slice) -> None:
    kinds, inverse, counts = _distinct_kinds(piece)
    codes = piece.name.astype(np.int64) * 1_000 + piece.layer
    unique, expected_inverse, expected_counts = np.unique(
        codes, return_inverse=True, return_counts=True
    )
    assert len(kinds) == len(unique)
    assert [k[0] for k in kinds] == (unique % 1_000).tolist()
    assert np.array_equal(inverse, expected_inverse.reshape(-1))
    assert np.array_equal(counts, expected_counts)
    assert inverse.dtype == expected_inverse.dtype and counts.dtype == expected_counts.dtype


def test_dense_and_sparse_name_codes_give_np_unique_order() -> None:
    for piece in (_repeat_slice(PATTERN, 5), optimizer_step_slice()):
        _assert_like_unique(piece)  # dense codes: counted
        # a names table far bigger than the slice: sparse codes, sorted instead
        spread = dataclasses.replace(
            piece,
            name=(piece.name.astype(np.int64) * 50_000).astype(np.int32),
            names=[f"n{i}" for i in range(50_000 * (int(piece.name.max()) + 1))],
        )
        _assert_like_unique(spread)
