"""A Kineto trace too large to hold, read once to disk and then one time window at a time.

Why: a multi-GB `.json.gz` inflates to tens of GB, and even its columns outgrow memory (about
100 bytes an event, tens of millions of events). So the file is read once, streamed from disk
through the sliced reader (`kineto._read_in_slices`), and each slice's columns are written to an
Arrow IPC file as soon as they are sealed, with the slice's time span; a window then loads only
the slices that overlap it and keeps the rows that start inside it (`read_window`). Kineto writes
each thread's and each stream's events in time order, so a slice spans little time and a window
reads few slices. The pass also counts events per `BUCKET_NS` of time, which is what the windows
are planned from (`teller.callchain.windows`).

The analysis reads a run without raw arguments (`schema.without_args`), so the slices keep none.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from teller.errors import TraceError
from teller.ingest.files import guard_reader
from teller.ingest.kineto import (
    _FIRST_CONTENT,
    _KinetoEvents,
    _NotSliceable,
    _read_in_slices,
    _text_pieces,
)
from teller.ingest.schema import EventTable, SourceInfo

#: The time grid the pass counts events on: fine enough to cut between steps of a few ms.
BUCKET_NS = 10_000_000
#: Spilled slices are compressed: a window reads them back faster than it would from a larger file.
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")
#: What a window read restores of the pass's reader: its dictionaries and what it counted.
_READER_STATE = (
    "names",
    "cats",
    "coll_names",
    "groups",
    "string_ids",
    "unknown_cats",
    "rank_from_comms",
    "events_seen",
    "category_counts",
    "skipped",
    "first_bad",
    "beyond_int64",
    "rounded_timestamps",
)


@dataclass
class SpilledSlice:
    """One slice of the file on disk, and the span of its rows' start times (the file's own
    clock, before its base time)."""

    file: Path
    first_ns: int
    last_ns: int
    rows: int


@dataclass
class SpilledTrace:
    """A Kineto file read once into slices on disk, and how its events lie in time."""

    path: Path
    slices: list[SpilledSlice]
    base_ns: int  # what the reader's clock adds to the file's own times (its baseTimeNanoseconds)
    #: events per BUCKET_NS on the file's clock with its base: bucket k starts at k × BUCKET_NS
    events_of_bucket: dict[int, int]
    reader_state: dict[str, Any] = field(repr=False)
    top: dict = field(repr=False)
    source: dict = field(repr=False)

    @property
    def events(self) -> int:
        return sum(s.rows for s in self.slices)


def spill_kineto(path: Path, folder: Path) -> SpilledTrace:
    """`path` read once, streamed from disk, each slice's columns written under `folder`.

    Raises TraceError for a file that is not a well-formed Kineto/Chrome trace: a file too large
    to hold is read in slices or not at all (the whole-document read that forgives a cut or
    lenient file would need the whole text in memory)."""
    folder.mkdir(parents=True, exist_ok=True)
    slices: list[SpilledSlice] = []
    buckets: dict[int, int] = {}

    def write(sealed: dict[str, Any]) -> None:
        ts_ns = sealed["ts_ns"]
        if not len(ts_ns):
            return
        table = pa.table({k: v for k, v in sealed.items() if k != "args"})
        file = folder / f"slice-{len(slices):06d}.arrow"
        with (
            pa.OSFile(str(file), "wb") as sink,
            pa.ipc.new_file(sink, table.schema, options=_IPC_OPTIONS) as writer,
        ):
            writer.write_table(table)
        slices.append(SpilledSlice(file, int(ts_ns.min()), int(ts_ns.max()), len(ts_ns)))
        bucket, count = np.unique(ts_ns // BUCKET_NS, return_counts=True)
        for b, c in zip(bucket.tolist(), count.tolist(), strict=True):
            buckets[b] = buckets.get(b, 0) + c

    with guard_reader(path, "a Kineto/Chrome trace (JSON)"):
        try:
            with open(path, "rb") as handle:
                head = handle.read(1 << 16)
                if _FIRST_CONTENT.match(head) is None:
                    raise TraceError(path, "empty file, expected a Kineto/Chrome trace (JSON)")
                handle.seek(0)
                pieces = _text_pieces(path, handle, head[:2] == b"\x1f\x8b", capped=False)
                reader = _KinetoEvents(path, {})
                reader.spill = write
                whole = _read_in_slices(path, pieces, reader)
        except OSError as error:
            raise TraceError(path, f"cannot read: {error.strerror or error}") from None
        except _NotSliceable:
            whole = None
        if whole is None and not slices:
            raise TraceError(
                path,
                "too large to read whole, and not a Chrome trace that can be read in slices "
                "(not a JSON list of events, or damaged before its first slice's end)",
            )
        if whole is None:  # cut short or damaged past its first slices: they are analysed
            reader.source.warnings.append(
                f"the trace is cut short or damaged after {reader.events_seen:,} events "
                f"({len(slices)} slices): analysed as far as it goes"
            )
    base = _base_ns(reader.top)
    return SpilledTrace(
        path=path,
        slices=slices,
        base_ns=base,
        events_of_bucket=_rebucketed(buckets, base),
        reader_state={name: getattr(reader, name) for name in _READER_STATE},
        top=reader.top,
        source=reader.source.to_json(),
    )


def _base_ns(top: dict) -> int:
    """The base time the reader's clock adds (`_KinetoEvents._clock`), 0 where there is none."""
    try:
        base = int(top.get("baseTimeNanoseconds") or 0)
    except (TypeError, ValueError):
        return 0
    return base if 0 < base < 2**62 else 0


def _rebucketed(buckets: dict[int, int], base: int) -> dict[int, int]:
    """Counts per bucket of the file's own clock moved onto the clock with its base (a base
    that is not a whole number of buckets moves each count to the bucket its start falls in)."""
    moved: dict[int, int] = {}
    for bucket, count in buckets.items():
        key = (bucket * BUCKET_NS + base) // BUCKET_NS
        moved[key] = moved.get(key, 0) + count
    return moved


def read_window(spilled: SpilledTrace, start_ns: int, end_ns: int) -> EventTable | None:
    """The events of `spilled` that start in [start_ns, end_ns) (the clock with the file's
    base), as `kineto.read` would give them without raw arguments; None where none does."""
    low, high = start_ns - spilled.base_ns, end_ns - spilled.base_ns
    reader = _KinetoEvents(spilled.path, spilled.top)
    for name, value in spilled.reader_state.items():
        setattr(reader, name, copy.deepcopy(value))
    reader.source = SourceInfo(**copy.deepcopy(spilled.source))
    for piece in spilled.slices:
        if piece.last_ns < low or piece.first_ns >= high:
            continue
        with pa.memory_map(str(piece.file), "r") as source:
            table = pa.ipc.open_file(source).read_all()
        ts_ns = table.column("ts_ns").to_numpy()
        keep = np.flatnonzero((ts_ns >= low) & (ts_ns < high))
        if not len(keep):
            continue
        sealed = {name: table.column(name).to_numpy()[keep].copy() for name in table.column_names}
        sealed["args"] = pa.nulls(len(keep), pa.string())
        reader.sealed.append(sealed)
    if not reader.sealed:
        return None
    return reader.finish()
