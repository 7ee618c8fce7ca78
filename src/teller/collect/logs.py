"""The timestamped log files `teller collect` writes, and how to read them back.

Files under `DIR/logs/`:

* `launcher.log`: everything the command wrote to its stdout and stderr, as the runner saw it
  (the console view: it includes the output of every child process that shares those streams);
* `rank{R}.log` (or `rankpid{PID}.log` when the process never learned a rank): one Python process
  that imported torch, from the moment it imported torch; output of its children that share its
  stdout/stderr is included. Prefer these for per-rank attribution.

Line format, byte for byte::

    2026-11-30T08:13:37.123456Z <the line exactly as the process wrote it, newline included>

* 27 bytes of ISO-8601 UTC time with exactly six fractional digits and a literal `Z`
  (`%Y-%m-%dT%H:%M:%S.%fZ`), then one space (0x20), then the original bytes;
* the time is the wall clock (`time.time_ns()`, on the collecting host) when the line's first byte
  was read from the pipe; the agent makes Python's stdout/stderr line-buffered so that is when the
  line was printed;
* stdout and stderr of one process are merged in the order their bytes arrived;
* bytes are not decoded: invalid UTF-8 stays as it was (open the file in binary, or decode with
  `errors="surrogateescape"` to round-trip); `\\r` stays inside its line;
* a last line without a newline gets one; a line over 1 MiB is cut into several log lines.

So a reader strips the first 28 bytes and parses the rest as the engine's own log line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from teller.collect.inject._teller_collect_tee import timestamp_prefix
from teller.errors import TraceError

#: Length of the prefix in bytes: 27 for the time, 1 for the space.
PREFIX_BYTES = 28

__all__ = ["PREFIX_BYTES", "LogLine", "read_log", "split_prefix", "timestamp_prefix"]


@dataclass(frozen=True)
class LogLine:
    wall_ns: int  # unix ns (microsecond resolution)
    raw: bytes  # the line as the process wrote it, without the trailing newline


def split_prefix(line: bytes) -> tuple[int, bytes]:
    """`(wall_ns, original bytes)` of one log line; ValueError if it has no collector prefix."""
    if len(line) < PREFIX_BYTES or line[26:28] != b"Z ":
        raise ValueError("line does not start with a `teller collect` timestamp")
    stamp = datetime.strptime(line[:26].decode("ascii"), "%Y-%m-%dT%H:%M:%S.%f")
    seconds = int(stamp.replace(tzinfo=UTC).timestamp())
    return seconds * 1_000_000_000 + stamp.microsecond * 1000, line[PREFIX_BYTES:]


def read_log(path: str | Path) -> Iterator[LogLine]:
    """Every line of one collected log file; TraceError names the file and line if one is bad."""
    path = Path(path)
    try:
        handle = path.open("rb")
    except OSError as error:
        raise TraceError(path, f"cannot open log: {error.strerror}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            try:
                wall_ns, raw = split_prefix(line)
            except ValueError as error:
                raise TraceError(path, str(error), where=f"line {number}") from None
            yield LogLine(wall_ns, raw.removesuffix(b"\n"))
