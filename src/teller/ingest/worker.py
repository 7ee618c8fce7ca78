"""What one worker of the per-rank map runs, shared by the process pool and the Ray engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from teller.errors import TraceError
from teller.ingest.schema import EventTable

#: A refused file as it crosses from a worker: TraceError's (path, what, where).
Refusal = tuple[str, str, str]


def read_one(read: Callable[[Path], EventTable], path: Path) -> EventTable | Refusal:
    """In a worker: the table, or the refusal as plain strings (a TraceError does not pickle:
    its constructor takes more than its message)."""
    try:
        return read(path)
    except TraceError as error:
        return (error.path, error.what, error.where)
