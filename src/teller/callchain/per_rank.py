"""The per-rank map of DESIGN.md §6: each trace file read and built into its forest where it
is read, and only the forests joined.

Ranks are independent until the horizontal join, so a worker (`teller.ingest.parallel`, or a
Ray task) reads one file, nests and launches its nodes (`tree.forest_of`) and hands back the
forest alone: the event table never crosses to the joining process, which then holds the run's
tree and nothing of its tables. The tree is the one `build_tree` makes from the whole run's
table (`tree.join_forests` puts the nodes in that order); what a file's own forest cannot see is
a thread or a correlation id shared by two files of one rank, which one table would mix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from teller.callchain.engines import EnginePlace, StepNumbering
from teller.callchain.kept_forest import load_forest
from teller.callchain.tree import CallTree, FileForest, forest_of, join_forests
from teller.ingest import (
    find_trace_files,
    map_files,
    note_refused,
    read_trace,
    table_span,
    warn_apart,
)
from teller.ingest.schema import EventTable, SourceInfo, traced_pids


@dataclass
class RunTree:
    """A run's tree, read and built one file at a time, and the facts of its files."""

    tree: CallTree
    sources: list[SourceInfo]
    traced_pids: frozenset[int]


def file_forest(path: Path) -> FileForest:
    """In a worker: one trace file read without its raw arguments and built into its forest."""
    return forest_of_events(path, read_trace(path, args=False))


def forest_of_events(path: Path, events: EventTable) -> FileForest:
    """`events`, read from `path` (the whole file, or a time window of it), as a forest."""
    return FileForest(
        path=path,
        forest=forest_of(events),
        sources=events.sources,
        traced_pids=traced_pids(events),
        span=table_span(events),
    )


def read_tree(
    paths: Iterable[str | Path],
    step_regex: str | re.Pattern[str] | None = None,
    progress: bool = False,
    jobs: int = 1,
    engine: str = "local",
    ray_address: str | None = None,
    place: EnginePlace | None = None,
    kept: Mapping[Path, Path] | None = None,
    numbering: StepNumbering | None = None,
) -> RunTree:
    """Every trace file under `paths` read and built into its forest (in `jobs` processes, or
    as Ray tasks), the forests joined into the run's tree. Refused files and captures that do
    not overlap are warned on as `teller.ingest.read_run` warns. `place`: the files are one
    engine of a larger run (`teller.callchain.split`); `kept`: forests an earlier pass built
    and wrote to disk (`kept_forest`), by trace file, loaded instead of parsing the file;
    `numbering`: the files' forests are one time window of the run (`windows.py`)."""
    kept = kept or {}
    in_order = find_trace_files(list(paths))
    to_read = [p for p in in_order if p not in kept]
    read, refused = (
        map_files(file_forest, to_read, progress, jobs, engine, ray_address, others_read=bool(kept))
        if to_read
        else ([], [])
    )
    forest_of_file = {f.path: f for f in read}
    files = [
        load_forest(kept[p]) if p in kept else forest_of_file[p]
        for p in in_order
        if p in kept or p in forest_of_file
    ]
    sources = [s for f in files for s in f.sources]
    note_refused(sources, refused)
    warn_apart([(f.span, f.sources) for f in files if f.span is not None])
    tree = join_forests([f.forest for f in files], step_regex, place, numbering)
    pids = frozenset().union(*(f.traced_pids for f in files))
    return RunTree(tree=tree, sources=sources, traced_pids=pids)
