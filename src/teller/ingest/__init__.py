"""Ingest: trace files → event tables (DESIGN.md §1, §3).

`read_trace(path)` reads one file of any supported format; `read_run(paths)` reads every rank file
of one run (directories are searched) into one table. Per-rank files are independent, so reading is
a map over files; only the horizontal view later joins them.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import TypeVar

import pyarrow.compute as pc

from teller.errors import TraceError
from teller.ingest import kineto
from teller.ingest.cache import read_cached
from teller.ingest.files import NSYS_REPORT_SUFFIXES
from teller.ingest.parallel import read_each
from teller.ingest.schema import (
    PARQUET_SUFFIX,
    EventTable,
    SourceInfo,
    concat,
    is_event_table,
    read_event_table,
    without_args,
)

T = TypeVar("T")

SQLITE_MAGIC = b"SQLite format 3\x00"
#: How much of a file's (decompressed) head is enough to tell a Kineto trace from other JSON.
_SNIFF_BYTES = 1 << 16


def read_trace(path: str | Path, args: bool = True) -> EventTable:
    """Read one trace file (Kineto JSON / .json.gz, Nsight Systems SQLite export or report, or
    an event table `teller ingest` wrote); a file read before and unchanged since comes from
    the event-table cache (`teller.ingest.cache`). `args=False`: without the raw arguments
    (`schema.without_args`), as the analysis reads a run."""
    path = Path(path)
    if path.name.lower().endswith(PARQUET_SUFFIX):
        events = read_event_table(path)
        return events if args else without_args(events)
    return read_cached(_read_source, path, args)


def _read_source(path: Path) -> EventTable:
    """Parse one trace file in its own format (module level: pool workers import it by name)."""
    if _is_sqlite(path) or path.name.lower().endswith(NSYS_REPORT_SUFFIXES):
        from teller.ingest import nsys  # local: sqlite is only needed for nsys exports

        return nsys.read(path)
    return kineto.read(path)


def read_run(
    paths: Iterable[str | Path],
    progress: bool = False,
    jobs: int = 1,
    engine: str = "local",
    ray_address: str | None = None,
    args: bool = True,
) -> EventTable:
    """Read every trace file of one run; directories are searched for rank files.

    A rank file that cannot be read is left out with a warning naming it and why, so the other
    ranks are still analysed; only when no file can be read is the first one's TraceError raised.
    With `jobs` > 1 the files are read in that many worker processes (`teller.ingest.parallel`),
    with `engine` "ray" as Ray tasks (`teller.ingest.on_ray`); the run read is the same.
    `args=False` leaves out the raw arguments in the workers already (`schema.without_args`).
    """
    read = read_trace if args else partial(read_trace, args=False)
    tables, refused = map_files(read, paths, progress, jobs, engine, ray_address)
    run = concat(tables)
    note_refused(run.sources, refused)
    warn_apart([(span, table.sources) for table in tables if (span := table_span(table))])
    return run


def map_files(
    read: Callable[[Path], T],
    paths: Iterable[str | Path],
    progress: bool = False,
    jobs: int = 1,
    engine: str = "local",
    ray_address: str | None = None,
    others_read: bool = False,
) -> tuple[list[T], list[TraceError]]:
    """`read(file)` for every trace file under `paths`, in file order (the per-rank map,
    `teller.ingest.parallel`): what each gave, and the files it refused. Raises the first
    refusal when every file was refused (unless `others_read`: the caller has the run's other
    files already), and a TraceError when there is no file."""
    paths = list(paths)  # named again in the error below
    files = find_trace_files(paths)
    if not files:
        shown = ", ".join(str(p) for p in paths)
        raise TraceError(
            shown,
            "no trace files found (looked for *.json, *.json.gz, *.sqlite, *.nsys-rep, *.parquet)",
        )
    results: Iterable[T | TraceError] = read_each(read, files, jobs, engine, ray_address)
    if progress and len(files) > 1:
        from tqdm import tqdm

        results = tqdm(results, total=len(files), desc="reading traces", unit="file", leave=False)
    kept: list[T] = []
    refused: list[TraceError] = []
    for result in results:
        if isinstance(result, TraceError):
            refused.append(result)
        else:
            kept.append(result)
    if not kept and not others_read:
        raise refused[0]
    return kept, refused


def note_refused(sources: list[SourceInfo], refused: list[TraceError]) -> None:
    """One bad rank file does not stop the others: it is named on the run's first file."""
    for error in refused:
        sources[0].warnings.append(f"rank file left out: {error}")


#: Files whose captures lie further apart than this, and than ten times the longer of them, are
#: not one run's ranks: profiles of the same job's ranks overlap in time.
APART_S = 60.0


def table_span(events: EventTable) -> tuple[int, int] | None:
    """When a file's events begin and end (ns); None for a file without events."""
    if not len(events):
        return None
    table = events.table
    start = pc.min(table["ts_ns"]).as_py()
    end = pc.max(pc.add(table["ts_ns"], table["dur_ns"])).as_py()
    return start, end


def warn_apart(spans: list[tuple[tuple[int, int], list[SourceInfo]]]) -> None:
    """Warn on each file that begins long after every earlier one ended: two captures of a
    service (its CUDA-graph capture and a later profile) or files of different jobs read from
    one folder. They are still read as one run, so the user learns why its spans and idle time
    look absurd. `spans`: each file's (start, end) and its sources."""
    ordered = sorted(spans, key=lambda span: span[0][0])
    ended_at, ended_by = None, None
    for (start, end), sources in ordered:
        if ended_at is not None:
            gap_s = (start - ended_at) / 1e9
            longest_s = max(end - start, ended_by[1]) / 1e9
            if gap_s > max(APART_S, 10 * longest_s):
                sources[0].warnings.append(
                    f"begins {_spelled(gap_s)} after {Path(ended_by[0]).name} ends: "
                    "its capture does not overlap the others', so it is not one run with them "
                    "(analyse each capture on its own)"
                )
        if ended_at is None or end > ended_at:
            ended_at, ended_by = end, (sources[0].path, end - start)


def _spelled(seconds: float) -> str:
    """A long gap as a person reads it: 121 s, 38 min, 5.2 h, 399 days."""
    for unit, size in (("days", 86_400.0), ("h", 3_600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.0f} s"


def find_trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand directories into the trace files under them, sorted; plain files pass through.

    A directory that holds traces and event tables (`teller ingest -o` into the run's own
    folder) gives its traces alone: the tables are the same ranks again."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            candidates = sorted(p for p in path.rglob("*") if p.is_file())
            traces = [p for p in candidates if looks_like_trace(p)]
            sources = [p for p in traces if not p.name.lower().endswith(PARQUET_SUFFIX)]
            found.extend(sources or traces)
        else:
            found.append(path)
    return found


def looks_like_trace(path: Path) -> bool:
    """True for files teller can read as traces; other JSON (labels, manifests, ET) is skipped."""
    name = path.name.lower()
    if name.endswith((".sqlite", ".sqlite3")):
        return _is_sqlite(path)
    if name.endswith(NSYS_REPORT_SUFFIXES):
        return True
    if name.endswith(PARQUET_SUFFIX):
        return is_event_table(path)
    if not name.endswith((".json", ".json.gz")):
        return False
    head = _head(path)
    return b'"traceEvents"' in head or (head.lstrip().startswith(b"[") and b'"ph"' in head)


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def _head(path: Path) -> bytes:
    try:
        with path.open("rb") as handle:
            start = handle.read(_SNIFF_BYTES)
        if start[:2] == b"\x1f\x8b":
            with gzip.open(path, "rb") as handle:
                return handle.read(_SNIFF_BYTES)
        return start
    except (OSError, EOFError, zlib.error):
        return b""
