"""The event table: one Arrow row per trace event, the common currency of every later stage.

Every reader (Kineto JSON, Nsight Systems SQLite, the lab, the simulator) produces this one table,
so the call-chain builder, the localizer and the reports never see a file format. Columns
(DESIGN.md §2); integer "absent" values are -1 rather than null so stages can use numpy directly:

| column       | type                       | meaning                                                   |
|--------------|----------------------------|-----------------------------------------------------------|
| rank         | int32                      | global rank of the process that recorded the event        |
| host         | dictionary<int32, string>  | host name ("" when the file does not say)                 |
| pid, tid     | int64                      | CPU process/thread; for GPU rows pid = device, tid = stream |
| stream       | int32                      | GPU stream, -1 on the CPU                                 |
| device       | int32                      | GPU index, -1 on the CPU                                  |
| layer        | dictionary<int8, string>   | one of LAYERS                                             |
| name         | dictionary<int32, string>  | event name (one symbol table per table)                   |
| cat          | dictionary<int32, string>  | the source's own category, kept for audits                |
| ts_ns        | int64                      | start, ns on the table's clock (unix ns when known)       |
| dur_ns       | int64                      | duration in ns (0 for instants)                           |
| correlation  | int64                      | runtime-call ↔ GPU-activity link id, -1 if none           |
| external_id  | int64                      | CPU op ↔ runtime link id (Kineto "External id"), -1       |
| coll_name    | dictionary<int32, string>  | collective kind (allreduce, …), null unless comm          |
| group        | dictionary<int32, string>  | process-group id/name, null unless known                  |
| seq          | int64                      | collective sequence number within its group, -1 unknown   |
| bytes        | int64                      | message size (collectives) or copy size, -1 unknown       |
| args         | string (JSON)              | the source's remaining arguments, null for most rows      |

Layers run outermost first; `instant`, `counter` and `profiler` rows are kept (nothing is dropped)
but are not call-chain nodes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from teller.atomic import atomic_path
from teller.errors import TraceError

LAYERS: tuple[str, ...] = (
    "request",
    "engine",
    "python",
    "cpu_op",
    "runtime",
    "kernel",
    "memcpy",
    "memset",
    "comm",
    "sync",
    "instant",
    "counter",
    "profiler",
)
LAYER_CODE: dict[str, int] = {name: code for code, name in enumerate(LAYERS)}
#: Layers whose rows become call-chain tree nodes.
TREE_LAYERS: frozenset[str] = frozenset(LAYERS) - {"instant", "counter", "profiler"}
#: Layers recorded on a GPU stream (or on the CPU for host-side collectives, see `comm`).
GPU_ACTIVITY_LAYERS: frozenset[str] = frozenset({"kernel", "memcpy", "memset", "sync"})
#: Layer codes of the work a rank's GPU did itself: kernels and copies. Collectives are not in it:
#: their time is mostly waiting for the peers.
GPU_WORK_CODES: frozenset[int] = frozenset(LAYER_CODE[n] for n in ("kernel", "memcpy", "memset"))
#: Layer codes of the work a rank's host did itself: operators and runtime calls, by self time.
#: Python frames are not in it: their self time holds waits the profiler does not name.
HOST_WORK_CODES: frozenset[int] = frozenset(LAYER_CODE[n] for n in ("cpu_op", "runtime"))
#: Layer codes whose self time is work a rank did itself (not waiting on a peer): the host's and
#: the GPU's work and the Python frames around them.
COMPUTE_CODES: frozenset[int] = GPU_WORK_CODES | HOST_WORK_CODES | {LAYER_CODE["python"]}

_STR_DICT = pa.dictionary(pa.int32(), pa.string())

EVENT_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32()),
        pa.field("host", _STR_DICT),
        pa.field("pid", pa.int64()),
        pa.field("tid", pa.int64()),
        pa.field("stream", pa.int32()),
        pa.field("device", pa.int32()),
        pa.field("layer", pa.dictionary(pa.int8(), pa.string())),
        pa.field("name", _STR_DICT),
        pa.field("cat", _STR_DICT),
        pa.field("ts_ns", pa.int64()),
        pa.field("dur_ns", pa.int64()),
        pa.field("correlation", pa.int64()),
        pa.field("external_id", pa.int64()),
        pa.field("coll_name", _STR_DICT),
        pa.field("group", _STR_DICT),
        pa.field("seq", pa.int64()),
        pa.field("bytes", pa.int64()),
        pa.field("args", pa.string()),
    ]
)

_METADATA_KEY = b"teller.sources"


@dataclass
class SourceInfo:
    """What one input file said about itself, and what the reader could not place.

    `base_time_ns` is added to the file's own clock to get unix ns; the reader has already applied
    it to `ts_ns`, and `clock` says which clock the rows are on ("unix" or "trace" when the file gave
    no way to reach wall-clock time).
    """

    path: str
    format: str
    rank: int
    rank_source: str
    host: str = ""
    world_size: int = 0
    clock: str = "unix"
    base_time_ns: int = 0
    events_by_category: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    process_names: dict[str, str] = field(default_factory=dict)
    thread_names: dict[str, str] = field(default_factory=dict)
    distributed: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class EventTable:
    """An Arrow table of events plus the facts about the files it came from."""

    table: pa.Table
    sources: list[SourceInfo]

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def ranks(self) -> list[int]:
        return ranks_of(self.sources)

    @property
    def warnings(self) -> list[str]:
        return warnings_of(self.sources)

    def layer_counts(self) -> dict[str, int]:
        codes = self.table.column("layer").combine_chunks().indices.to_numpy()
        counts = np.bincount(codes, minlength=len(LAYERS))
        return {LAYERS[i]: int(n) for i, n in enumerate(counts) if n}

    def to_pandas(self):
        return self.table.to_pandas()


def traced_pids(events: EventTable) -> frozenset[int]:
    """The host process ids the traces recorded (GPU rows carry the device, not a process)."""
    table = events.table
    on_host = table.column("device").to_numpy() < 0
    return frozenset(np.unique(table.column("pid").to_numpy()[on_host]).tolist())


def ranks_of(sources: list[SourceInfo]) -> list[int]:
    """The ranks the files hold, once each."""
    return sorted({source.rank for source in sources})


def warnings_of(sources: list[SourceInfo]) -> list[str]:
    """What the readers could not place, each prefixed with its file's name."""
    return [f"{Path(s.path).name}: {w}" for s in sources for w in s.warnings]


def build_table(
    columns: dict[str, object],
    names: list[str],
    cats: list[str],
    coll_names: list[str],
    groups: list[str],
    host: str,
) -> pa.Table:
    """Assemble an event table from per-column sequences (lists or numpy arrays).

    `name`, `cat`, `coll_name` and `group` arrive as integer ids into the given symbol lists (-1 =
    null), `layer` as codes into LAYERS; this keeps readers to cheap integer appends. `args` may
    arrive as strings or already as an Arrow string array (a reader that built it by slices).
    """
    n = len(columns["ts_ns"])  # type: ignore[arg-type]

    def ints(key: str, dtype: pa.DataType) -> pa.Array:
        return numeric_array(columns[key], dtype)

    def dictionary(key: str, symbols: list[str]) -> pa.Array:
        ids = np.asarray(columns[key], dtype=np.int32)
        mask = ids < 0
        return pa.DictionaryArray.from_arrays(
            numeric_array(np.where(mask, 0, ids), pa.int32(), mask if mask.any() else None),
            string_array(symbols if symbols else [""]),
        )

    layer = pa.DictionaryArray.from_arrays(
        numeric_array(columns["layer"], pa.int8()), string_array(list(LAYERS))
    )
    host_col = pa.DictionaryArray.from_arrays(
        numeric_array(np.zeros(n, dtype=np.int32), pa.int32()), string_array([host])
    )
    arrays = [
        ints("rank", pa.int32()),
        host_col,
        ints("pid", pa.int64()),
        ints("tid", pa.int64()),
        ints("stream", pa.int32()),
        ints("device", pa.int32()),
        layer,
        dictionary("name", names),
        dictionary("cat", cats),
        ints("ts_ns", pa.int64()),
        ints("dur_ns", pa.int64()),
        ints("correlation", pa.int64()),
        ints("external_id", pa.int64()),
        dictionary("coll_name", coll_names),
        dictionary("group", groups),
        ints("seq", pa.int64()),
        ints("bytes", pa.int64()),
        args
        if isinstance(args := columns["args"], pa.Array | pa.ChunkedArray)
        else string_array(args),  # type: ignore[arg-type]
    ]
    return pa.Table.from_arrays(arrays, schema=EVENT_SCHEMA)


# Arrays are built from buffers rather than with `pa.array`: pyarrow imports pandas on the first
# `pa.array` call, which costs a fresh `teller` process most of a second before it reads anything.


def _validity(mask: np.ndarray | None) -> tuple[pa.Buffer | None, int]:
    if mask is None or not mask.any():
        return None, 0
    return pa.py_buffer(np.packbits(~mask, bitorder="little")), int(mask.sum())


def numeric_array(values: object, dtype: pa.DataType, mask: np.ndarray | None = None) -> pa.Array:
    """A fixed-width Arrow array over a numpy copy of `values` (nulls where `mask` is true)."""
    data = np.ascontiguousarray(np.asarray(values, dtype=dtype.to_pandas_dtype()))
    validity, nulls = _validity(mask)
    return pa.Array.from_buffers(dtype, len(data), [validity, pa.py_buffer(data)], null_count=nulls)


def string_array(values: list) -> pa.Array:
    """A UTF-8 string array from str/bytes-like/None values; invalid UTF-8 is replaced, not fatal.

    Built straight from buffers and validated in place: a `cast` would import pyarrow.compute,
    a tenth of a second on a fresh process's first read."""
    encoded = [v.encode("utf-8", "surrogatepass") if isinstance(v, str) else v for v in values]
    mask = np.fromiter((v is None for v in encoded), dtype=bool, count=len(encoded))
    lengths = np.fromiter((len(v) if v is not None else 0 for v in encoded), np.int64, len(encoded))
    data = b"".join(v for v in encoded if v is not None)
    small = len(data) < 2**31
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32 if small else np.int64)
    np.cumsum(lengths, out=offsets[1:])
    validity, nulls = _validity(mask)
    array = pa.Array.from_buffers(
        pa.string() if small else pa.large_string(),
        len(encoded),
        [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
        null_count=nulls,
    )
    try:
        array.validate(full=True)  # checks the UTF-8
    except pa.ArrowInvalid:  # invalid UTF-8 somewhere: decode row by row with replacement
        fixed = [bytes(v).decode("utf-8", "replace") if v is not None else None for v in encoded]
        return string_array(fixed)
    return array if small else array.cast(pa.string())


def concat(tables: list[EventTable]) -> EventTable:
    """Join per-rank tables into one run (dictionaries are unified so names stay one symbol table)."""
    if len(tables) == 1:
        return tables[0]
    table = pa.concat_tables([t.table for t in tables]).unify_dictionaries()
    return EventTable(table=table, sources=[s for t in tables for s in t.sources])


def without_args(events: EventTable) -> EventTable:
    """The same rows with the `args` column all null: what the analysis reads. Only the Perfetto
    export looks at the raw arguments, and they are half of a table's bytes, so the tables the
    rank workers hand back (and the run they join into) leave them out; row numbers, and so the
    tree's `row`, are those of the full table."""
    index = events.table.schema.get_field_index("args")
    empty = pa.nulls(events.table.num_rows, pa.string())
    return EventTable(table=events.table.set_column(index, "args", empty), sources=events.sources)


def write_parquet(events: EventTable, path: str | Path) -> None:
    """Write atomically: a crash or bad input never leaves a half-written file at `path`."""
    metadata = {_METADATA_KEY: json.dumps([s.to_json() for s in events.sources]).encode()}
    table = events.table.replace_schema_metadata(metadata)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_parquet(path: str | Path, args: bool = True) -> EventTable:
    """An event table `write_parquet` wrote, as the reader that made it returned it: one chunk
    per column and one dictionary per symbol column (Parquet splits long tables into row
    groups, each with its own dictionary). `args=False` leaves the raw arguments unread
    (`without_args`)."""
    columns = None if args else [f.name for f in EVENT_SCHEMA if f.name != "args"]
    table = pq.read_table(path, columns=columns)
    raw = (pq.read_schema(path).metadata or {}).get(_METADATA_KEY, b"[]")
    sources = [SourceInfo(**s) for s in json.loads(raw)]
    table = table.replace_schema_metadata(None)
    if not args:
        table = table.append_column("args", pa.nulls(table.num_rows, pa.string()))
    table = table.cast(EVENT_SCHEMA)
    return EventTable(table=table.unify_dictionaries().combine_chunks(), sources=sources)


PARQUET_SUFFIX = ".parquet"


def is_event_table(path: str | Path) -> bool:
    """True for a Parquet file `write_parquet` wrote (its footer names teller's sources)."""
    try:
        metadata = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException):
        return False
    return _METADATA_KEY in metadata


def read_event_table(path: str | Path) -> EventTable:
    """A table `teller ingest` wrote, or a TraceError naming the file and what is wrong."""
    path = Path(path)
    if not is_event_table(path):
        raise TraceError(path, "not an event table written by `teller ingest` (no teller sources)")
    try:
        return read_parquet(path)
    except (OSError, ValueError, TypeError, KeyError, pa.ArrowException) as error:
        raise TraceError(path, f"unreadable event table ({str(error)[:120]})") from None
