"""Slices: causal-context slices S = (V, E, T, C) cut from call-chain trees (DESIGN.md §1)."""

from teller.slices.cut import (
    context_slice,
    horizontal_slice,
    request_slice,
    root_slices,
    slice_of_nodes,
    step_slice,
    step_slices,
)
from teller.slices.slice import CommRelations, Slice

__all__ = [
    "CommRelations",
    "Slice",
    "context_slice",
    "horizontal_slice",
    "request_slice",
    "root_slices",
    "slice_of_nodes",
    "step_slice",
    "step_slices",
]
