"""The event-table cache: each trace file read once, its table kept as Parquet and reused by
every later command while the file is unchanged.

Reading a Kineto JSON means decompressing and parsing all of it (seconds per rank file of a long
run, minutes for an `.nsys-rep` that needs `nsys export`), and a user analyses the same capture
again and again: `teller analyze`, then `--format html`, then `teller diagnose`. The table a
reader makes is a pure function of the file's bytes and of the reader's code, so it is stored
under a key of both: the file's resolved path, size and modification time (what `make` trusts),
and a digest of the ingest package's sources, so a changed reader never serves an old table.
The stored file is what `teller ingest` writes (`teller.ingest.schema.write_parquet`: the
events plus every `SourceInfo`, warnings included), written atomically.

`TELLER_CACHE_DIR` names the directory (default `$XDG_CACHE_HOME/teller/events`, else
`~/.cache/teller/events`); `off` turns the cache off. The directory is trimmed to
`TELLER_CACHE_MAX_MB` (default 4096), least recently used first. A cache that cannot be read
or written is passed over: the file is read as if there were none.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

from teller.ingest.schema import EventTable, read_parquet, without_args, write_parquet

CACHE_DIR_ENV = "TELLER_CACHE_DIR"
CACHE_MAX_ENV = "TELLER_CACHE_MAX_MB"
DEFAULT_MAX_MB = 4096
_OFF = "off"
_SUFFIX = ".events.parquet"


def cache_dir() -> Path | None:
    """Where tables are kept, or None when the cache is off."""
    configured = os.environ.get(CACHE_DIR_ENV, "").strip()
    if configured.lower() == _OFF:
        return None
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "teller" / "events"


def read_cached(read: Callable[[Path], EventTable], path: Path, args: bool = True) -> EventTable:
    """`read(path)`, or the table an earlier read of the same unchanged file stored; with
    `args=False` without the raw arguments (`schema.without_args`). What is stored always has
    them, so a later Perfetto export is served from the same entry."""
    directory = cache_dir()
    key = _key(path) if directory is not None else None
    if directory is None or key is None:
        return _kept(read(path), args)
    stored = directory / f"{key}{_SUFFIX}"
    if stored.is_file():
        try:
            events = read_parquet(stored, args=args)
            os.utime(stored)  # recently used: kept longest when the directory is trimmed
            return events
        except (OSError, ValueError):  # unreadable or corrupt: read the source instead
            stored.unlink(missing_ok=True)
    events = read(path)
    try:
        write_parquet(events, stored)
        _trim(directory)
    except (OSError, ValueError):  # a full disk or a read-only home leaves the read intact
        pass
    return _kept(events, args)


def _kept(events: EventTable, args: bool) -> EventTable:
    return events if args else without_args(events)


def _key(path: Path) -> str | None:
    """The digest of the file's identity and the reader's code; None where the file cannot be
    stat'ed (the reader then names the problem)."""
    try:
        resolved = path.resolve()
        stat = resolved.stat()
    except OSError:
        return None
    identity = [str(resolved), stat.st_size, stat.st_mtime_ns, _reader_digest()]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]


@cache
def _reader_digest() -> str:
    """The ingest package's source files (the readers and the table they make), digested once
    per process: a table is stale as soon as the code that made it changed."""
    digest = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def _trim(directory: Path) -> None:
    """Delete the least recently used tables until the directory fits its limit."""
    try:
        limit = float(os.environ.get(CACHE_MAX_ENV, DEFAULT_MAX_MB)) * 1e6
    except ValueError:
        limit = DEFAULT_MAX_MB * 1e6
    entries = []
    for entry in directory.glob(f"*{_SUFFIX}"):
        try:
            stat = entry.stat()
        except OSError:  # removed meanwhile by another process
            continue
        entries.append((stat.st_mtime_ns, stat.st_size, entry))
    total = sum(size for _, size, _ in entries)
    for _, size, entry in sorted(entries, key=lambda item: item[0]):
        if total <= limit:
            break
        entry.unlink(missing_ok=True)
        total -= size
