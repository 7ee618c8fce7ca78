"""What one worker of the per-rank map runs, shared by the process pool and the Ray engine."""

from __future__ import annotations

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
