"""teller: find out why an LLM inference service is slow, from the traces and logs it already writes.

The public API is small: `Analysis(path)` runs the pipeline on a run and returns tables and the
verdict; `read_trace` / `read_run` turn profiler files into an event table and `build_tree` turns
that into call-chain trees. Names are imported on first use, so a process that imports one stage
(a lab rank, the collector's agent) does not pay for every other.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from teller.analysis import Analysis
    from teller.callchain.tree import CallTree, build_tree
    from teller.errors import TellerError, TraceError
    from teller.ingest import read_run, read_trace
    from teller.ingest.schema import EventTable

_PUBLIC = {
    "Analysis": "teller.analysis",
    "CallTree": "teller.callchain.tree",
    "build_tree": "teller.callchain.tree",
    "EventTable": "teller.ingest.schema",
    "TellerError": "teller.errors",
    "TraceError": "teller.errors",
    "read_run": "teller.ingest",
    "read_trace": "teller.ingest",
}
__all__ = [
    "Analysis",
    "CallTree",
    "EventTable",
    "TellerError",
    "TraceError",
    "build_tree",
    "read_run",
    "read_trace",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'teller' has no attribute {name!r}")
