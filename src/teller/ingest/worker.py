"""What one worker of the per-rank map runs, shared by the process pool and the Ray engine."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from teller.errors import TraceError

T = TypeVar("T")

#: A refused file as it crosses from a worker: TraceError's (path, what, where).
Refusal = tuple[str, str, str]


def read_one(read: Callable[[Path], T], path: Path) -> T | Refusal:
    """In a worker: what `read` returned, or the refusal as plain strings (a TraceError does
    not pickle: its constructor takes more than its message)."""
    try:
        return read(path)
    except TraceError as error:
        return (error.path, error.what, error.where)
    finally:
        release_freed_heap()


def release_freed_heap() -> None:
    """Give the memory that reading a file freed back to the system (glibc's `malloc_trim`).

    Why: a worker that has read its last file waits, idle, while the joining process gathers
    every forest, and glibc keeps the parser's freed heap mapped in it: on 8 rank files of 730k
    events that was 170-560 MB beside the joining process at its peak (docs/benchmarks.md).
    Where the C library has no `malloc_trim` (musl, macOS) nothing is done."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
