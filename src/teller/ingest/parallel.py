"""Reading rank files in a pool of processes: the per-rank map of DESIGN.md §6 on every core.

Rank files are independent until the horizontal join, so each is read in its own worker and
the tables come back in file order; the run is then the same as read one by one. Workers are
spawned (a fresh interpreter each), never forked from a parent that may hold a large run
already, and as the caller's own children they count in its resource usage (a forkserver's
workers would be the server's). What crosses between processes is teller's own result (an
`EventTable`, a rank's `RankForest`, or the parts of a `TraceError`), never the input file's
bytes.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar

from teller.errors import TellerError, TraceError
from teller.heap import give_freed_arrays_back
from teller.ingest.on_ray import ENGINES, read_on_ray
from teller.ingest.worker import read_one

T = TypeVar("T")


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def read_each(
    read: Callable[[Path], T],
    files: list[Path],
    jobs: int,
    engine: str = "local",
    ray_address: str | None = None,
) -> Iterator[T | TraceError]:
    """`read(file)` for every file, in file order: what it returned (a table, a rank's forest),
    or the TraceError it raised.

    `read` must be a module-level function or a `functools.partial` of one (workers import it
    by name). With `engine` "ray" each file is a Ray task (`teller.ingest.on_ray`, on the
    cluster at `ray_address`, else a private one with `jobs` CPUs); otherwise, with `jobs` ≤ 1
    or a single file, everything is read here."""
    if engine not in ENGINES:
        raise TellerError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if engine == "ray":
        yield from read_on_ray(read, files, jobs, ray_address)
        return
    if jobs <= 1 or len(files) <= 1:
        for path in files:
            try:
                yield read(path)
            except TraceError as error:
                yield error
        return
    context = multiprocessing.get_context("spawn")
    workers = min(jobs, len(files))
    # teller's own processes: each array a worker frees goes back (`teller.heap`)
    with ProcessPoolExecutor(workers, context, initializer=give_freed_arrays_back) as pool:
        for result in pool.map(read_one, [read] * len(files), files):
            yield TraceError(*result) if isinstance(result, tuple) else result
