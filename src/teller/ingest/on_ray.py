"""Reading rank files as Ray tasks: the per-rank map of DESIGN.md §6 past one machine.

Each rank file is read by one task where Ray schedules it, so every worker must see the file at
the path given (a shared filesystem, or a one-machine cluster); what comes back through Ray's
object store is teller's own result (an `EventTable`, or a refusal as plain strings), never the
input's bytes. The reduce (the horizontal join and everything after it) runs in this process, so
the run read is the same as with the in-process pool.

Without an address a private Ray instance is started on this machine with `jobs` CPUs, bound to
127.0.0.1 and without its dashboard, and stopped afterwards: nothing listens beyond localhost
unless an existing cluster is named.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from teller.errors import TellerError, TraceError
from teller.ingest.worker import read_one

T = TypeVar("T")

#: Engines the per-rank map runs on: this machine's process pool, or a Ray cluster.
ENGINES = ("local", "ray")


def read_on_ray(
    read: Callable[[Path], T], files: list[Path], jobs: int, address: str | None
) -> Iterator[T | TraceError]:
    """`read(file)` for every file as one Ray task each, in file order: the table, or the
    TraceError it raised. `address`: a running cluster's (`ray://host:10001`, `auto`), or None
    for a private one on this machine with `jobs` CPUs."""
    try:
        import ray
    except ImportError as error:
        raise TellerError(
            "--engine ray needs Ray, which is not installed: pip install 'teller-rca[ray]'"
        ) from error
    started = not ray.is_initialized()
    if started:
        if address is None:
            ray.init(
                num_cpus=max(jobs, 1),
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                _node_ip_address="127.0.0.1",
            )
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(num_cpus=1)(read_one)
        pending = [task.remote(read, Path(path).absolute()) for path in files]
        for ref in pending:
            result = ray.get(ref)
            yield TraceError(*result) if isinstance(result, tuple) else result
    finally:
        if started:
            ray.shutdown()
