"""teller: find out why an LLM inference service is slow, from the traces and logs it already writes.

The public API is small: `read_trace` / `read_run` turn profiler files into an event table, and
`build_tree` turns that into call-chain trees. Later stages hang off the same objects.
"""

from teller.analysis import Analysis
from teller.callchain.tree import CallTree, build_tree
from teller.errors import TellerError, TraceError
from teller.ingest import read_run, read_trace
from teller.ingest.schema import EventTable

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
