"""Which log files and spans are which engine's, where a run of several engines is analysed one
engine at a time (`teller.callchain.split`).

The whole run's analysis places a line that names its engine (`logtime.ENGINE_PROCESS`,
`ENGINE_STATS`) on that engine's steps, every line of a console whose engine lines name one
engine with them, and the lines that name none on the reference rank, which is engine 0's. So
each log file goes to the one engine it names, or to engine 0; a file that names two cannot be
handed to one engine, and such a run is analysed whole. A span goes with its request: to the
engine whose logs name the request, or to engine 0 where none does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from teller.align.logtime import named_engines
from teller.ingest.logs import find_log_files, read_logs
from teller.ingest.logs.table import LogTable, request_key


@dataclass
class EngineLogs:
    """The run's log files and logged requests, by engine."""

    files: dict[int, list[Path]]
    requests: dict[int, frozenset[str]]

    def files_of(self, engine: int) -> list[Path]:
        return self.files.get(engine, [])

    def keeps_span(self, engine: int) -> Callable[[str], bool]:
        """Whether a span, by its request id, is `engine`'s."""
        everyone = frozenset().union(*self.requests.values())
        mine = self.requests.get(engine, frozenset())

        def keep(span_request: str) -> bool:
            key = request_key(span_request, everyone)
            return key in mine or (engine == 0 and key not in everyone)

        return keep


def engine_logs(log_paths: list[Path], engines: int) -> EngineLogs | None:
    """Each of `engines` engines' log files and requests; None where a file names two."""
    if not log_paths:
        return EngineLogs({}, {})
    logs = read_logs(log_paths)
    engine_of = log_files_of_engines(logs, engines)
    if engine_of is None:
        return None
    files: dict[int, list[Path]] = {}
    for path in find_log_files(log_paths)[0]:
        files.setdefault(engine_of.get(str(path), 0), []).append(path)
    requests: dict[int, set[str]] = {}
    names = logs.table.column("file").to_pylist()
    for name, key in zip(names, logs.table.column("request_key").to_pylist(), strict=True):
        if key is not None:
            requests.setdefault(engine_of.get(name, 0), set()).add(key)
    return EngineLogs(files, {e: frozenset(keys) for e, keys in requests.items()})


def log_files_of_engines(logs: LogTable, engines: int) -> dict[str, int] | None:
    """Each log file's engine, where a run of `engines` engines is analysed one engine at a
    time: the one engine its lines name, or engine 0 (the reference rank's, where the whole
    run's analysis places lines that name none) for a file that names none; None where a file
    names two, whose lines only the whole run's analysis can share out."""
    named = named_engines(logs, set(range(engines)))
    files = logs.table.column("file").to_pylist()
    named_in: dict[str, set[int]] = {}
    for file, engine in zip(files, named.tolist(), strict=True):
        named_in.setdefault(file, set()).update({engine} - {-1})
    if any(len(found) > 1 for found in named_in.values()):
        return None
    return {file: (min(found) if found else 0) for file, found in named_in.items()}
