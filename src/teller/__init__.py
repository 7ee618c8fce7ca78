"""teller: find out why an LLM inference service is slow, from the traces and logs it already writes.

The public API is small: `Analysis(path)` runs the pipeline on a run and returns tables and the
verdict; `diff(a, b)` compares run B against run A; `read_trace` / `read_run` turn profiler files into an event table and `build_tree` turns
that into call-chain trees. Names are imported on first use, so a process that imports one stage
(a lab rank, the collector's agent) does not pay for every other.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from teller.analysis import Analysis
    from teller.callchain.tree import CallTree, build_tree
    from teller.errors import TellerError, TraceError
    from teller.ingest import read_run, read_trace
    from teller.ingest.schema import EventTable
    from teller.report.diff import RunDiff

_PUBLIC = {
    "Analysis": "teller.analysis",
    "CallTree": "teller.callchain.tree",
    "build_tree": "teller.callchain.tree",
    "EventTable": "teller.ingest.schema",
    "TellerError": "teller.errors",
    "TraceError": "teller.errors",
    "read_run": "teller.ingest",
    "read_trace": "teller.ingest",
    "RunDiff": "teller.report.diff",
}
__all__ = [
    "Analysis",
    "CallTree",
    "EventTable",
    "RunDiff",
    "TellerError",
    "TraceError",
    "build_tree",
    "diff",
    "read_run",
    "read_trace",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'teller' has no attribute {name!r}")


def diff(
    a: str | Path | Analysis,
    b: str | Path | Analysis,
    step_regex: str | None = None,
    allow_mismatch: bool = False,
) -> RunDiff:
    """Run B compared against run A (the reference), each a run directory, trace file or Analysis.

    The result's `regressions(pct)` lists the step kinds more than `pct` % slower in B, and
    `not_comparable` says why the runs cannot be compared at all (then no gate should pass).
    """
    from teller.analysis import Analysis

    def analysis(run: str | Path | Analysis) -> Analysis:
        return (
            run
            if isinstance(run, Analysis)
            else Analysis(run, step_regex=step_regex, progress=False)
        )

    return analysis(a).diff(analysis(b), allow_mismatch=allow_mismatch)
