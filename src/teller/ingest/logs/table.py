"""The log table: one Arrow row per log record, whatever engine printed it.

Every log reader (vLLM, SGLang, TensorRT-LLM, PyTorch's NCCL watchdog, template-mined unknown lines)
fills this one table, so alignment and the log-side baselines never see a line format. A record is
one logical message: a multi-line traceback is one row whose `raw` keeps every line.

| column       | type                      | meaning                                                    |
|--------------|---------------------------|------------------------------------------------------------|
| ts_ns        | int64                     | wall clock, unix ns (-1 when the file gave no time at all) |
| ts_exact     | bool                      | false when the sub-second part (or the whole time) was     |
|              |                           | inferred: lines within one printed second are spread over  |
|              |                           | it in file order                                           |
| host         | dictionary<int32, string> | host: the line's own (Ray's `ip=`), else the caller's, else |
|              |                           | the `teller collect` manifest's for the file, or ""        |
| process      | dictionary<int32, string> | engine process tag: `APIServer`, `EngineCore_0`, `TP0`, …  |
| pid          | int64                     | process id from the line prefix, -1 unknown                |
| rank         | int32                     | rank from the line (`TP1`, `rank=1`, `[rank3]`) or the     |
|              |                           | collector's file name, -1 unknown                          |
| level        | dictionary<int8, string>  | DEBUG, INFO, WARNING, ERROR, CRITICAL, or ""               |
| source       | dictionary<int32, string> | the engine's `file.py:line`, "" unknown                    |
| event        | dictionary<int32, string> | what the record says (EVENTS), "other" for mined lines     |
| request_id   | string                    | request id as printed (vLLM V1: API id plus a suffix)      |
| request_key  | string                    | the id without engine suffixes: joins API, engine and OTel |
|              |                           | (`request_key`: by shape for vLLM's ids, else against the  |
|              |                           | other ids of the same read)                                |
| template_id  | int64                     | stable hash of `template` (same text → same id, any run);  |
|              |                           | a mined template is drain's final one, so a variant line   |
|              |                           | elsewhere in the read can generalise it and change the id  |
| template_key | int64                     | stable hash of the line's own shape: a mined line's text   |
|              |                           | with ids and numbers masked, before drain generalises it;  |
|              |                           | a known shape's template. Never depends on other lines     |
| template     | dictionary<int32, string> | the record's template text                                 |
| kv_cache_fill, requests_running, requests_waiting, context_requests, generation_requests,   |
| iteration_counter, iteration_elapsed_ns, collective_seq, process_group, process_group_desc: |
|              | float64, int64 or string  | what the engine's line states, typed (null where it states |
|              |                           | nothing): `teller.ingest.logs.quantities`                  |
| fields       | string (JSON)             | parsed numbers and names, null when none; for display:     |
|              |                           | later stages read the typed columns above                  |
| raw          | string                    | the record's text as printed (ANSI codes removed)          |
| file         | dictionary<int32, string> | the file it came from                                      |
| line         | int64                     | 1-based line number of the record's first line             |
| format       | dictionary<int8, string>  | which reader parsed it (FORMATS)                           |
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from teller.ingest.logs import quantities

FORMATS: tuple[str, ...] = (
    "vllm",
    "sglang",
    "trtllm",
    "pytorch",
    "uvicorn",
    "python",
    "generic",
    "unparsed",
)
LEVELS: tuple[str, ...] = ("", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

#: What a record says. Alignment and the log baselines key on these names.
EVENTS: tuple[str, ...] = (
    "request_received",
    "request_added",
    "request_finished",
    "request_aborted",
    "request_preempted",
    "request_resumed",
    "stats",
    "iteration",
    "jit_compile",
    "nccl_timeout",
    "http_access",
    "traceback",
    "engine_config",
    "prefill_batch",
    "decode_batch",
    "other",
)

_STR_DICT = pa.dictionary(pa.int32(), pa.string())

LOG_SCHEMA = pa.schema(
    [
        pa.field("ts_ns", pa.int64()),
        pa.field("ts_exact", pa.bool_()),
        pa.field("host", _STR_DICT),
        pa.field("process", _STR_DICT),
        pa.field("pid", pa.int64()),
        pa.field("rank", pa.int32()),
        pa.field("level", pa.dictionary(pa.int8(), pa.string())),
        pa.field("source", _STR_DICT),
        pa.field("event", _STR_DICT),
        pa.field("request_id", pa.string()),
        pa.field("request_key", pa.string()),
        pa.field("template_id", pa.int64()),
        pa.field("template_key", pa.int64()),
        pa.field("template", _STR_DICT),
        *(pa.field(name, q.type) for name, q in quantities.QUANTITIES.items()),
        pa.field("fields", pa.string()),
        pa.field("raw", pa.string()),
        pa.field("file", _STR_DICT),
        pa.field("line", pa.int64()),
        pa.field("format", pa.dictionary(pa.int8(), pa.string())),
    ]
)

#: vLLM's own ids, whose shape is known: `[<n>_](chat)cmpl-<hex>[-<choice>][-<8 hex>]`.
_VLLM_ID = re.compile(
    r"""
    ^(?:\d+_)?                              # parallel sampling's index
    (?P<key>(?:chat)?cmpl-[0-9A-Za-z]+)     # the API id
    (?:-\d{1,3})?                           # completions choice index
    (?:-[0-9a-f]{8})?$                      # V1's engine suffix
    """,
    re.VERBOSE,
)
#: Any other id (the client's `X-Request-Id`) may carry V1's engine suffix too; whether it does
#: shows only when the id without it was printed as well.
_ENGINE_SUFFIX = re.compile(r"^(?P<prefix>.+)-[0-9a-f]{8}$")
_SAMPLE_INDEX = re.compile(r"^\d+_(?P<rest>.+)$")


def request_key(request_id: str, seen: Container[str] = frozenset()) -> str:
    """The part of a request id that the API server, the engine and OTel spans all share.

    vLLM's generated ids lose their choice index and engine suffix by shape alone. Any other id
    ending in `-<8 hex>` joins the id before that suffix only when that id is in `seen` (the ids
    read together): `myreq-a8a65d16` joins `myreq`, while `my-request-1` and `my-request-2`, or a
    UUID's last group, stay whole.
    """
    if match := _VLLM_ID.match(request_id):
        return match.group("key")
    key = request_id
    if (match := _SAMPLE_INDEX.match(key)) and _unsuffixed(match.group("rest"), seen) in seen:
        key = match.group("rest")
    return _unsuffixed(key, seen)


def _unsuffixed(request_id: str, seen: Container[str]) -> str:
    match = _ENGINE_SUFFIX.match(request_id)
    return match.group("prefix") if match and match.group("prefix") in seen else request_id


def request_keys(request_ids: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """`request_key` of every id in a column, each joined against the others (nulls stay null)."""
    unique = pc.unique(request_ids)
    values = unique.to_pylist()
    seen = frozenset(v for v in values if v is not None)
    keys = pa.array([request_key(v, seen) if v is not None else None for v in values], pa.string())
    return pc.take(keys, pc.index_in(request_ids, value_set=unique))


def second_of_day(hour: str, minute: str, second: str) -> int | None:
    """Seconds since midnight of a printed time of day; None when a field is out of range."""
    h, m, s = int(hour), int(minute), int(second)
    return h * 3600 + m * 60 + s if h < 24 and m < 60 and s < 60 else None


def template_id(template: str) -> int:
    """A stable 63-bit id for a template text (blake2b), unlike drain's per-run cluster counter."""
    digest = hashlib.blake2b(template.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass(slots=True)
class LogRecord:
    """One parsed record before it becomes a row; readers fill what their line says."""

    raw: str
    line: int
    format: str
    ts_ns: int = -1  # -1: not given on this line (inherits the previous line's time)
    ts_exact: bool = False
    level: str = ""
    process: str = ""
    pid: int = -1
    rank: int = -1
    source: str = ""
    event: str = "other"
    request_id: str | None = None
    template: str = ""
    fields: dict | None = None
    message: str = ""  # the text after the engine's header, what template mining sees
    #: the time as printed: (year, month, day, second of day, ns fraction); None for "not printed"
    #: (second of day None: the printed hour, minute or second was out of range)
    clock: tuple[int | None, int | None, int | None, int | None, int | None] | None = None
    fields_json: str | None = None  # `fields` serialised when the record is complete
    host: str = ""
    cluster: int = -1  # drain cluster of a mined record, resolved to `template` once all are seen
    template_key: int = -1  # hash of a mined record's masked text; -1: its template's id


@dataclass
class LogSource:
    """What one log file held, and what the reader could not place (counted, never dropped)."""

    path: str
    format: str
    lines: int = 0
    records: int = 0
    host: str = ""
    rank: int = -1
    collector_prefix: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class LogTable:
    """An Arrow table of log records plus the facts about the files it came from."""

    table: pa.Table
    sources: list[LogSource]

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def warnings(self) -> list[str]:
        return [f"{Path(s.path).name}: {w}" for s in self.sources for w in s.warnings]

    def column(self, name: str) -> list:
        return self.table.column(name).to_pylist()

    def quantity(self, name: str) -> np.ndarray:
        """A typed quantity column (`quantities.QUANTITIES`) as float64, NaN where null."""
        if quantities.QUANTITIES[name].type == pa.string():
            raise ValueError(f"{name} holds names, not numbers: read it with `column`")
        values = pc.cast(self.table.column(name), pa.float64())
        return pc.fill_null(values, np.nan).to_numpy()

    def kv_cache_fill(self) -> np.ndarray:
        """Per record, the KV cache's fill (0-1) its line states; NaN where it states none."""
        return self.quantity("kv_cache_fill")

    def to_pandas(self):
        return self.table.to_pandas()


class LogColumns:
    """Column builder for one file: records go in one by one, Arrow chunks come out.

    Holding a million `LogRecord`s (and their dicts) would cost gigabytes and slow every garbage
    collection, so every CHUNK_ROWS records the text and quantity columns become Arrow arrays and
    the Python objects are dropped. Times, exactness and templates stay as compact arrays until
    `finish`, because the reader fixes times per file and drain templates only once every file is
    mined. Few records state a quantity, so those are kept sparse until their chunk is sealed.
    """

    CHUNK_ROWS = 65_536
    _TEXT = ("host", "process", "level", "source", "event", "request_id", "fields", "raw", "format")

    def __init__(self) -> None:
        self.ts_ns = array("q")
        self.exact = bytearray()
        self.cluster = array("q")  # drain cluster of mined records, -1 for known shapes
        self.template_key = array("q")  # masked-text hash of mined records, -1 for known shapes
        self.templates: list[str] = []  # known template text, "" for mined records
        self.pid = array("q")
        self.rank = array("i")
        self.line = array("q")
        self._text: dict[str, list] = {name: [] for name in self._TEXT}
        self._chunks: dict[str, list[pa.Array]] = {
            name: [] for name in (*self._TEXT, *quantities.COLUMNS)
        }
        #: per quantity column, the rows (in the chunk) of the records that state it, and the values
        self._stated_rows = {column: array("q") for column in quantities.COLUMNS}
        self._stated_values: dict[str, list] = {column: [] for column in quantities.COLUMNS}

    def __len__(self) -> int:
        return len(self.ts_ns)

    def add(self, record: LogRecord) -> None:
        self.ts_ns.append(record.ts_ns)
        self.exact.append(record.ts_exact)
        self.cluster.append(record.cluster)
        self.template_key.append(record.template_key)
        self.templates.append(record.template)
        self.pid.append(record.pid)
        self.rank.append(record.rank)
        self.line.append(record.line)
        text = self._text
        text["host"].append(record.host)
        text["process"].append(record.process)
        text["level"].append(record.level)
        text["source"].append(record.source)
        text["event"].append(record.event)
        text["request_id"].append(record.request_id)
        text["fields"].append(record.fields_json)
        text["raw"].append(record.raw)
        text["format"].append(record.format)
        if record.fields and (stated := quantities.typed_values(record.fields)):
            row = len(text["raw"]) - 1
            for column, value in stated.items():
                self._stated_rows[column].append(row)
                self._stated_values[column].append(value)
        if len(text["raw"]) >= self.CHUNK_ROWS:
            self._seal()

    def _seal(self) -> None:
        rows = len(self._text["raw"])
        if not rows:
            return
        for name, values in self._text.items():
            self._chunks[name].append(pa.array(values, pa.string()))
            values.clear()
        for name, quantity in quantities.QUANTITIES.items():
            stated_rows, values = self._stated_rows[name], self._stated_values[name]
            self._chunks[name].append(_sparse(rows, stated_rows, values, quantity.type))
            del stated_rows[:]
            values.clear()

    def finish(
        self, templates: list[str], ts_ns: np.ndarray, exact: np.ndarray, file: str
    ) -> pa.Table:
        """The table, given every record's final template text and times."""
        self._seal()
        count = len(self)
        chunks = self._chunks

        def text(name: str) -> pa.ChunkedArray:
            return pa.chunked_array(chunks[name], pa.string())

        def encoded(name: str, index_type: pa.DataType | None = None) -> pa.Array:
            return _dictionary(text(name), index_type or pa.int32())

        request_ids = text("request_id")
        keys = request_keys(request_ids)

        def ints(values: array, dtype: type) -> np.ndarray:
            return np.frombuffer(values, dtype=dtype) if count else np.zeros(0, dtype=dtype)

        template_ids = np.array(_template_ids(templates), dtype=np.int64)
        mined_keys = ints(self.template_key, np.int64)

        arrays = [
            pa.array(ts_ns, pa.int64()),
            pa.array(exact, pa.bool_()),
            encoded("host"),
            encoded("process"),
            pa.array(ints(self.pid, np.int64), pa.int64()),
            pa.array(ints(self.rank, np.int32), pa.int32()),
            encoded("level", pa.int8()),
            encoded("source"),
            encoded("event"),
            request_ids,
            keys,
            pa.array(template_ids),
            pa.array(np.where(mined_keys >= 0, mined_keys, template_ids)),
            _dictionary(templates),
            *(pa.chunked_array(chunks[name], q.type) for name, q in quantities.QUANTITIES.items()),
            text("fields"),
            text("raw"),
            _constant(file, count),
            pa.array(ints(self.line, np.int64), pa.int64()),
            encoded("format", pa.int8()),
        ]
        return pa.Table.from_arrays(arrays, schema=LOG_SCHEMA)


def _sparse(rows: int, stated_rows: array, values: list, type: pa.DataType) -> pa.Array:
    """A column of `rows` nulls but for `values` at `stated_rows`."""
    if not values:
        return pa.nulls(rows, type)
    positions = np.frombuffer(stated_rows, dtype=np.int64)
    index = np.zeros(rows, dtype=np.int64)
    index[positions] = np.arange(len(positions))
    missing = np.ones(rows, dtype=bool)
    missing[positions] = False
    return pc.take(pa.array(values, type), pa.array(index, mask=missing))


def _template_ids(templates: list[str]) -> list[int]:
    ids: dict[str, int] = {}
    return [ids.get(t) or ids.setdefault(t, template_id(t)) for t in templates]


def concat_logs(tables: list[LogTable]) -> LogTable:
    """Join per-file tables (dictionaries unified so each column stays one symbol table)."""
    if len(tables) == 1:
        return tables[0]
    if not tables:
        return LogTable(LOG_SCHEMA.empty_table(), [])
    table = pa.concat_tables([t.table for t in tables]).unify_dictionaries()
    return LogTable(table=table, sources=[s for t in tables for s in t.sources])


def _constant(value: str, count: int) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(count, dtype=np.int32)), pa.array([value], pa.string())
    )


def _dictionary(
    values: pa.ChunkedArray | list[str], index_type: pa.DataType | None = None
) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        array = values.combine_chunks() if values.num_chunks else pa.array([], pa.string())
    else:
        array = pa.array(values, pa.string())
    encoded = array.dictionary_encode()
    if index_type is not None:
        encoded = encoded.cast(pa.dictionary(index_type, pa.string()))
    return encoded
