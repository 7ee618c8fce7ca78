"""Reader for Nsight Systems SQLite exports (`nsys export --type sqlite`).

Nsight Systems is what people reach for when a PyTorch trace is not enough (whole-process CUDA
capture, several processes, NVTX from any library), so teller reads its export into the same event
table as the Kineto reader and every later stage stays format-blind.

How the export maps onto the event table (checked on real exports of nsys 2026.1 and 2026.2):

* `CUPTI_ACTIVITY_KIND_KERNEL` → `kernel` (or `comm` for NCCL-style kernels), named by
  `demangledName`, falling back to `shortName`; `RUNTIME` → `runtime` with the CUPTI version
  suffix dropped (`cudaLaunchKernel_v7000` → `cudaLaunchKernel`); `MEMCPY` / `MEMSET` with bytes
  and Kineto's names (`Memcpy HtoD (Pageable -> Device)`); `SYNCHRONIZATION` → `sync`;
  `OVERHEAD` → `profiler`.
* `NVTX_EVENTS`: push/pop and start/end ranges → `engine`, marks → `instant`; the text is
  `COALESCE(text, StringIds.value via textId)`. Ranges written by PyTorch's `emit_nvtx`
  (`aten::mm, op_id = 12` / `…, seq = 12, sizes = […]`) are operators, so they become `cpu_op`
  rows named by the operator, with the id (and any shapes) moved to `args`; otherwise every range of an
  op would be its own symbol and no two steps could be compared.
* `globalTid` / `globalPid` pack (hardware, VM, pid, tid): pid = bits 24-47, tid = bits 0-23
  (Nsight Systems docs, "Serialized process and thread identifiers"). GPU rows get pid = device and
  tid = stream as in Kineto, and keep their process (`globalPid`) only to find their rank. Older
  export schemas have no `globalPid` in the activity tables: the GPU work then belongs to the
  process that launched it (the only one, or the one whose correlation id it carries).
* `correlationId` links a runtime call to the GPU work it launched exactly as Kineto's
  `correlation` does. CUPTI numbers correlations per process, and ranks are per process, so the
  (rank, correlation) key `build_tree` uses cannot join two processes' ids.
* Timestamps are ns since the start of the capture session; `TARGET_INFO_SESSION_START_TIME.
  utcEpochNs` is the wall clock at that instant, so unix ns = utcEpochNs + ts (a real export has
  events at 1.3 s of a 1.9 s session whose start is 5.2e14 on the system clock, which rules out
  the system clock). Without that table the rows stay on the session clock (`clock="trace"`).
* Rank: one export may hold several processes. The export records the launched command's
  environment (`META_DATA_CAPTURE` `PROCESS_n:ENVIRONMENT_VARIABLE`, `TARGET_INFO_SYSTEM_ENV`), not
  each child's, so `RANK` / `LOCAL_RANK` there only names the rank when the export holds one
  process (nsys run per rank). Otherwise a single process takes the rank in its file name, else 0;
  several processes take ranks 0..n-1 in pid order, processes that issued CUDA work first (torchrun
  starts rank 0 first, and a CPU-only launcher must not take rank 0 from a GPU worker).
  A process that drives several devices is one rank per device, as one process per GPU would
  be: each device's activity, and the runtime calls that launched it, are that device's rank, so
  NCCL kernels of one collective on two devices are the collective's two ranks and a straggler
  device shows as its peers' long NCCL kernels, as in a Kineto trace per rank. Its other host
  rows go with the device their thread launched to most.
* A `.nsys-rep` report is exported with `nsys export --type sqlite` to a temporary file first when
  `nsys` is on PATH; otherwise the error says how to export it.

Tables an export lacks mean zero rows of that kind. Event tables teller does not read (OS runtime,
cuDNN/cuBLAS API ranges, CUDA graph nodes, …) are counted in `SourceInfo.skipped`. The database is
opened read-only and immutable: the reader never writes to or indexes its input.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from teller.errors import TraceError
from teller.ingest.comm_names import collective_kind, is_comm_cpu_op, is_comm_kernel
from teller.ingest.files import NSYS_REPORT_SUFFIXES, guard_reader, read_bytes
from teller.ingest.schema import LAYER_CODE, EventTable, SourceInfo, build_table

SQLITE_MAGIC = b"SQLite format 3\x00"
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
OVERHEAD = "CUPTI_ACTIVITY_KIND_OVERHEAD"
NVTX = "NVTX_EVENTS"
#: Tables this reader turns into rows; an export with none of them is not one teller can use.
READ_TABLES: tuple[str, ...] = (KERNEL, RUNTIME, MEMCPY, MEMSET, SYNC, OVERHEAD, NVTX)
#: Bits of a serialized GlobalId below the pid (the tid), and the width of pid and tid.
GLOBAL_ID_SHIFT = 24
GLOBAL_ID_MASK = 0xFFFFFF
#: Stream id for GPU activity that names no single stream (CUPTI writes uint32(-1)); as Kineto.
ALL_STREAMS = 2**31 - 1
#: Process key of GPU activity in an export whose activity tables have no `globalPid` column.
UNKNOWN_PROCESS = -1
#: A rank unit is (process key << UNIT_SLOT_BITS) + the device's slot among its process's devices.
UNIT_SLOT_BITS = 10
#: NVTX event types (ENUM_NSYS_EVENT_TYPE) by role; the export's own enum table wins when present.
NVTX_RANGE_TYPES = (
    "NvtxPushPopRange",
    "NvtxStartEndRange",
    "NvtxtPushPopRange",
    "NvtxtStartEndRange",
)
NVTX_MARK_TYPES = ("NvtxMark", "NvtxtMark")
_NVTX_TYPE_IDS = {
    "NvtxMark": 34,
    "NvtxPushPopRange": 59,
    "NvtxStartEndRange": 60,
    "NvtxtMark": 65,
    "NvtxtPushPopRange": 70,
    "NvtxtStartEndRange": 71,
}
#: Runtime/driver names carry the CUDA version that introduced them: `cudaMemcpyAsync_v3020`.
_VERSION_SUFFIX = re.compile(r"_v\d+$")
#: A range from torch.autograd.profiler.emit_nvtx: `aten::mm, op_id = 12` or `…, seq = 3, sizes = …`.
TORCH_NVTX_OP = re.compile(
    r"""
    ^(?P<op>[^,]+)                        # the operator, up to the first comma: aten::mm
    ,\ (?P<key>op_id|seq)\ =\ (?P<id>\d+)  # its id: `op_id = 12` or `seq = 12`
    (?:,\ (?P<rest>.*))?$                 # anything after it (`sizes = [...]`), kept verbatim
    """,
    re.VERBOSE,
)
_RANK_IN_FILE_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_RANK_ENV = re.compile(
    r"""
    (?:^|[;\s])        # the text's start, or a separator: ; or white space
    (RANK|LOCAL_RANK)  # the variable
    ="?(\d+)"?         # its value, quoted or not
    (?=$|[;\s])        # then the end or the next separator
    """,
    re.VERBOSE,
)
#: Where an export keeps the launched command's environment: (table, which rows).
_ENVIRONMENT_ROWS = (
    ("META_DATA_CAPTURE", "name LIKE '%ENVIRONMENT_VARIABLE'"),
    ("TARGET_INFO_SYSTEM_ENV", "name = 'DeviceEnvironment'"),
)
#: CUPTI synchronisation types by id, named as Kineto names its `cuda_sync` events.
_SYNC_NAMES = {
    0: "Unknown Sync",
    1: "Event Sync",
    2: "Stream Wait Event",
    3: "Stream Sync",
    4: "Context Sync",
}
#: Fallbacks for exports without ENUM_CUDA_MEMCPY_OPER / ENUM_CUDA_MEM_KIND (CUPTI enum values).
_COPY_KINDS = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}
_MEMORY_KINDS = {
    0: "Pageable",
    1: "Pinned",
    2: "Device",
    3: "Array",
    4: "Managed",
    5: "Device Static",
    6: "Managed Static",
    7: "Unknown",
}


def read(path: str | Path, rank: int | None = None) -> EventTable:
    """Read one Nsight Systems SQLite export (or `.nsys-rep` report) into an event table.

    `rank` overrides what the export says: its processes take ranks `rank, rank+1, …` in the
    order described in the module docstring. A report is exported to SQLite first with the `nsys`
    on PATH, into a temporary file that is removed afterwards. Raises TraceError for a missing,
    non-SQLite, corrupt or non-nsys file, and for a report when `nsys` is missing or fails.
    """
    path = Path(path)
    with guard_reader(path, "an Nsight Systems SQLite export"):
        if is_report(path):
            with exported(path) as database, _Export.open(path, database) as export:
                return _read_export(export, rank)
        with _Export.open(path) as export:
            return _read_export(export, rank)


def _read_export(export: _Export, rank: int | None) -> EventTable:
    try:
        return _NsysReader(export).read(rank)
    except _BadCell as cell:
        raise TraceError(
            export.path,
            f"{cell.value!r:.40} where an integer (time, id or count within int64) was expected",
            where=f"table {export.last_table}, row {cell.row} of the query, field {cell.field}",
        ) from None


def is_report(path: Path) -> bool:
    """An Nsight Systems report (`.nsys-rep`, or `.qdrep` from before 2021.3), by its name."""
    return path.name.lower().endswith(NSYS_REPORT_SUFFIXES)


@contextmanager
def exported(report: Path) -> Iterator[Path]:
    """The report's SQLite export in a temporary folder, removed when the block ends."""
    read_bytes(report, "an Nsight Systems report", 1)  # missing, a folder, unreadable
    nsys = shutil.which("nsys")
    stem = report.name[
        : -len(next(s for s in NSYS_REPORT_SUFFIXES if report.name.lower().endswith(s)))
    ]
    how = f"`nsys export --type sqlite -o {stem}.sqlite {report.name}`"
    if nsys is None:
        raise TraceError(
            report,
            f"an Nsight Systems report, and `nsys` is not on PATH to export it: run {how} "
            "and pass the .sqlite",
        )
    with tempfile.TemporaryDirectory(prefix="teller-nsys-") as folder:
        database = Path(folder) / f"{stem}.sqlite"
        command = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true"]
        try:
            done = subprocess.run(
                [*command, "--output", str(database), str(report)],
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as error:
            raise TraceError(report, f"cannot run {nsys}: {error.strerror}; run {how}") from None
        if done.returncode != 0 or not database.is_file():
            said = (done.stderr or done.stdout).strip().splitlines()
            reason = f": {said[-1].strip()}" if said else ""
            raise TraceError(
                report, f"`nsys export --type sqlite` failed (exit {done.returncode}){reason}"
            )
        yield database


class _Export:
    """A read-only connection to one export, with its table list and error wrapping.

    `path` is the file the user named (a report, when the database is its temporary export):
    errors, sources and the rank in a file name come from it."""

    def __init__(self, path: Path, connection: sqlite3.Connection, tables: dict[str, str]) -> None:
        self.path = path
        self.connection = connection
        self.tables = tables  # name -> CREATE statement
        self.last_table = ""  # the table of the latest query, named when one of its values is bad

    @classmethod
    def open(cls, path: Path, database: Path | None = None) -> _Export:
        database = database or path
        _check_file(database, path)
        uri = database.resolve().as_uri() + "?mode=ro&immutable=1"
        try:
            connection = sqlite3.connect(uri, uri=True)
        except sqlite3.Error as error:
            raise TraceError(path, f"cannot open as SQLite: {error}") from None
        try:
            rows = connection.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'table'"
            ).fetchall()
        except sqlite3.DatabaseError as error:
            connection.close()
            raise TraceError(
                path, f"corrupt SQLite database ({error}); expected an nsys export"
            ) from None
        export = cls(path, connection, {name: sql or "" for name, sql in rows})
        if "StringIds" not in export.tables or not any(t in export.tables for t in READ_TABLES):
            connection.close()
            shown = ", ".join(sorted(export.tables)[:8]) or "none"
            raise TraceError(
                path,
                f"SQLite database without Nsight Systems tables (tables: {shown}); expected "
                "StringIds and CUPTI_ACTIVITY_KIND_* or NVTX_EVENTS from `nsys export --type sqlite`",
            )
        return export

    def __enter__(self) -> _Export:
        return self

    def __exit__(self, *exc: object) -> None:
        self.connection.close()

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> set[str]:
        if table not in self.tables:
            return set()
        return {row[1] for row in self.query(f'PRAGMA table_info("{table}")', table)}

    def query(self, sql: str, table: str, params: Sequence[object] = ()) -> list[tuple]:
        """All rows of one query; any SQLite failure becomes a TraceError naming the table."""
        self.last_table = table
        try:
            return self.connection.execute(sql, params).fetchall()
        except sqlite3.OperationalError as error:  # a column or table this schema lacks
            raise TraceError(
                self.path,
                f"cannot read table {table} ({error}); expected the nsys export schema",
                where=f"table {table}",
            ) from None
        except sqlite3.Error as error:  # malformed pages, truncated file
            raise TraceError(
                self.path,
                f"corrupt SQLite database ({error}); expected a complete nsys export",
                where=f"table {table}",
            ) from None

    def count(self, table: str) -> int:
        return int(self.query(f'SELECT count(*) FROM "{table}"', table)[0][0])


def _column_or_missing(columns: set[str], column: str) -> str:
    """SQL for an optional integer column: its value, or -1 where the row or the export lacks it."""
    return f"COALESCE({column}, -1)" if column in columns else "-1"


def _check_file(database: Path, shown: Path) -> None:
    head = read_bytes(database, "an nsys SQLite export", len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        what = "empty file" if not head else "not an SQLite database"
        raise TraceError(
            shown, f"{what}, expected an Nsight Systems export (`nsys export --type sqlite`)"
        )


class _Symbols:
    """One string ↔ id table for a column (names, categories, collective kinds)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def intern(self, value: str) -> int:
        known = self.ids.get(value)
        if known is None:
            known = self.ids[value] = len(self.ids)
        return known

    def intern_many(self, values: Sequence[str]) -> np.ndarray:
        return np.fromiter((self.intern(v) for v in values), dtype=np.int32, count=len(values))

    def values(self) -> list[str]:
        return list(self.ids)


@dataclass
class _Rows:
    """Rows of one nsys table as columns, before ranks are known.

    `process` is the serialized process key (globalTid or globalPid shifted right by 24: hardware,
    VM and pid), which stays unique across the machines one export can span.
    """

    table: str
    process: np.ndarray
    tid: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    layer: np.ndarray
    name: np.ndarray
    start: np.ndarray
    end: np.ndarray
    correlation: np.ndarray
    nbytes: np.ndarray
    coll: np.ndarray
    args: list

    def __len__(self) -> int:
        return len(self.start)


class _BadCell(ValueError):
    """A value an integer column cannot hold (NULL, text, a blob, a float, beyond int64)."""

    def __init__(self, row: int, field: int, value: object) -> None:
        super().__init__(f"row {row}, field {field}: {value!r:.40}")
        self.row, self.field, self.value = row, field, value


def _int_columns(rows: list[tuple], count: int) -> list[np.ndarray]:
    """The first `count` fields of every row as int64 arrays; `_BadCell` names the first value
    that is not an integer within int64 (a float, even a whole one, is not taken for a time)."""
    if not rows:
        return [np.zeros(0, dtype=np.int64) for _ in range(count)]
    try:
        matrix = np.array([row[:count] for row in rows], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        matrix = None
    if matrix is None or not all(type(v) is int for row in rows for v in row[:count]):
        for r, row in enumerate(rows):
            for f, value in enumerate(row[:count]):
                if type(value) is not int or not -(2**63) <= value < 2**63:
                    raise _BadCell(r, f, value)
    assert matrix is not None
    return [matrix[:, k] for k in range(count)]


class _NsysReader:
    """Turns one export's tables into event-table columns."""

    def __init__(self, export: _Export) -> None:
        self.export = export
        self.names = _Symbols()
        self.colls = _Symbols()
        self.strings: dict[int, str] = dict(
            export.query("SELECT id, value FROM StringIds", "StringIds")
        )
        self.skipped: dict[str, int] = {}
        self.warnings: list[str] = []

    # -- the tables ------------------------------------------------------------------------------
    def read(self, rank: int | None) -> EventTable:
        parts = [
            part
            for part in (
                self._kernels(),
                self._runtime(),
                self._memcpy(),
                self._memset(),
                self._sync(),
                self._overhead(),
                self._nvtx(),
            )
            if part is not None and len(part)
        ]
        self._count_unread_tables()
        if not parts:
            raise TraceError(
                self.export.path,
                "the export holds no CUDA or NVTX events (kernel, runtime, memcpy, memset, "
                "synchronization or NVTX rows); was the capture run with --trace=cuda,nvtx?",
            )
        return self._assemble(parts, rank)

    def _gpu_rows(self, table: str, rows: list[tuple], layer: str, names: np.ndarray) -> _Rows:
        """Common shape of kernel/memcpy/memset/sync rows: start, end, device, stream, corr, pid."""
        start, end, device, stream, correlation, global_pid = _int_columns(rows, 6)
        stream = np.where((stream >= 0) & (stream < ALL_STREAMS), stream, ALL_STREAMS)
        count = len(start)
        return _Rows(
            table=table,
            process=np.where(
                global_pid == UNKNOWN_PROCESS, UNKNOWN_PROCESS, global_pid >> GLOBAL_ID_SHIFT
            ),
            tid=stream,
            device=device,
            stream=stream,
            layer=np.full(count, LAYER_CODE[layer], dtype=np.int8),
            name=names,
            start=start,
            end=end,
            correlation=correlation,
            nbytes=np.full(count, -1, dtype=np.int64),
            coll=np.full(count, -1, dtype=np.int32),
            args=[None] * count,
        )

    def _gpu_columns(self, table: str, alias: str = "") -> str:
        """SQL for the common GPU columns; an export without `globalPid` (an older schema) gives
        UNKNOWN_PROCESS, which `_place_unowned` resolves from the runtime calls."""
        columns = self.export.columns(table)
        process = (
            f"COALESCE({alias}globalPid, 0)" if "globalPid" in columns else str(UNKNOWN_PROCESS)
        )
        return (
            f'{alias}start, {alias}"end", {alias}deviceId, {alias}streamId, '
            f"COALESCE({alias}correlationId, -1), {process}"
        )

    def _kernels(self) -> _Rows | None:
        columns = self.export.columns(KERNEL)
        if not columns:
            return None
        if "demangledName" in columns and "shortName" in columns:
            name_sql = (
                "CASE WHEN d.value IS NULL OR d.value = '' THEN k.shortName "
                "ELSE k.demangledName END"
            )
        else:
            name_sql = "k.shortName" if "shortName" in columns else "k.demangledName"
        args_sql = "NULL"
        launch = {"gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread"}
        if launch <= columns and {"staticSharedMemory", "dynamicSharedMemory"} <= columns:
            args_sql = (
                "json_object('grid', json_array(gridX, gridY, gridZ), "
                "'block', json_array(blockX, blockY, blockZ), "
                "'registers per thread', registersPerThread, "
                "'shared memory', staticSharedMemory + dynamicSharedMemory, "
                "'context', contextId, 'device', deviceId, 'stream', streamId, "
                "'correlation', correlationId)"
            )
        join = ""
        if "demangledName" in columns:
            join = "LEFT JOIN StringIds d ON d.id = k.demangledName"
        rows = self.export.query(
            f"SELECT {self._gpu_columns(KERNEL, 'k.')}, {name_sql}, {args_sql} "
            f"FROM {KERNEL} k {join}",
            KERNEL,
        )
        name_ids = np.array([row[6] for row in rows], dtype=np.int64)
        unique, inverse = np.unique(name_ids, return_inverse=True)
        kernel_names = [self._string(int(i)) for i in unique]
        symbol = self.names.intern_many(kernel_names)
        comm = np.array([is_comm_kernel(n) for n in kernel_names], dtype=bool)
        coll = np.array(
            [
                self.colls.intern(collective_kind(n)) if c else -1
                for n, c in zip(kernel_names, comm, strict=True)
            ],
            dtype=np.int32,
        )
        part = self._gpu_rows(KERNEL, rows, "kernel", symbol[inverse])
        part.layer = np.where(comm[inverse], LAYER_CODE["comm"], LAYER_CODE["kernel"]).astype(
            np.int8
        )
        part.coll = coll[inverse]
        part.args = [row[7] for row in rows]
        return part

    def _runtime(self) -> _Rows | None:
        if not self.export.has(RUNTIME):
            return None
        rows = self.export.query(
            f'SELECT start, "end", COALESCE(globalTid, 0), COALESCE(correlationId, -1), nameId '
            f"FROM {RUNTIME}",
            RUNTIME,
        )
        start, end, global_tid, correlation, name_ids = _int_columns(rows, 5)
        names = self._string_names(name_ids, lambda n: _VERSION_SUFFIX.sub("", n))
        return self._cpu_rows(RUNTIME, "runtime", start, end, global_tid, names, correlation)

    def _overhead(self) -> _Rows | None:
        columns = self.export.columns(OVERHEAD)
        if not columns:
            return None
        kind = _column_or_missing(columns, "overheadType")
        name = _column_or_missing(columns, "nameId")
        rows = self.export.query(
            f'SELECT start, "end", COALESCE(globalTid, 0), {name}, {kind} FROM {OVERHEAD}',
            OVERHEAD,
        )
        start, end, global_tid, name_ids, kinds = _int_columns(rows, 5)
        labels = self._enum("ENUM_CUPTI_OVERHEAD_TYPE", {}, None)
        names = self.names.intern_many(
            [
                self.strings.get(i) or labels.get(k, "CUPTI overhead")
                for i, k in zip(name_ids.tolist(), kinds.tolist(), strict=True)
            ]
        )
        return self._cpu_rows(OVERHEAD, "profiler", start, end, global_tid, names)

    def _memcpy(self) -> _Rows | None:
        columns = self.export.columns(MEMCPY)
        if not columns:
            return None
        ends = [_column_or_missing(columns, end) for end in ("srcKind", "dstKind")]
        kinds = ", ".join(["copyKind", *ends])

        def names(rows: list[tuple]) -> list[str]:
            copy_kinds = self._enum("ENUM_CUDA_MEMCPY_OPER", _COPY_KINDS, _copy_kind_short)
            memory_kinds = self._enum("ENUM_CUDA_MEM_KIND", _MEMORY_KINDS, None)
            return [_memcpy_name(copy_kinds, memory_kinds, *row[7:10]) for row in rows]

        return self._transfers(MEMCPY, "memcpy", kinds, names)

    def _memset(self) -> _Rows | None:
        columns = self.export.columns(MEMSET)
        if not columns:
            return None

        def names(rows: list[tuple]) -> list[str]:
            memory_kinds = self._enum("ENUM_CUDA_MEM_KIND", _MEMORY_KINDS, None)
            return [
                f"Memset ({memory_kinds.get(row[7], 'Unknown')})" if row[7] >= 0 else "Memset"
                for row in rows
            ]

        return self._transfers(MEMSET, "memset", _column_or_missing(columns, "memKind"), names)

    def _transfers(
        self, table: str, layer: str, kinds_sql: str, names: Callable[[list[tuple]], list[str]]
    ) -> _Rows:
        """Memcpy or memset rows: the GPU columns, `bytes`, then the kind columns that `names`
        turns into each row's Kineto-style name."""
        rows = self.export.query(
            f"SELECT {self._gpu_columns(table)}, bytes, {kinds_sql} FROM {table}", table
        )
        part = self._gpu_rows(table, rows, layer, self.names.intern_many(names(rows)))
        part.nbytes = _int_columns([row[6:7] for row in rows], 1)[0]
        return part

    def _sync(self) -> _Rows | None:
        columns = self.export.columns(SYNC)
        if not columns:
            return None
        kind = "syncType" if "syncType" in columns else "COALESCE(deprecatedSyncType, 0)"
        rows = self.export.query(
            f"SELECT {self._gpu_columns(SYNC)}, {kind}, contextId FROM {SYNC}", SYNC
        )
        labels = [_SYNC_NAMES.get(row[6], f"Sync type {row[6]}") for row in rows]
        part = self._gpu_rows(SYNC, rows, "sync", self.names.intern_many(labels))
        # CUPTI's synchronization record has no device field (nsys writes 0): the context says.
        devices = self._context_devices()
        pids = (part.process & GLOBAL_ID_MASK).tolist()
        part.device = np.fromiter(
            (devices.get((pid, row[7]), row[2]) for pid, row in zip(pids, rows, strict=True)),
            dtype=np.int64,
            count=len(rows),
        )
        return part

    def _context_devices(self) -> dict[tuple[int, int], int]:
        """(pid, CUDA context) → device, from the context table or the activity that names both."""
        devices: dict[tuple[int, int], int] = {}
        for table in (KERNEL, MEMCPY, MEMSET):
            if {"globalPid", "contextId", "deviceId"} <= self.export.columns(table):
                for pid, context, device in self.export.query(
                    f"SELECT DISTINCT globalPid / {1 << GLOBAL_ID_SHIFT} % {GLOBAL_ID_MASK + 1}, "
                    f"contextId, deviceId FROM {table}",
                    table,
                ):
                    devices.setdefault((pid, context), device)
        table = "TARGET_INFO_CUDA_CONTEXT_INFO"
        if {"processId", "contextId", "deviceId"} <= self.export.columns(table):
            for pid, context, device in self.export.query(
                f"SELECT processId, contextId, deviceId FROM {table}", table
            ):
                devices[(pid, context)] = device
        return devices

    def _nvtx(self) -> _Rows | None:
        columns = self.export.columns(NVTX)
        if not columns:
            return None
        type_ids = self._nvtx_type_ids()
        ranges = [type_ids[t] for t in NVTX_RANGE_TYPES if t in type_ids]
        marks = [type_ids[t] for t in NVTX_MARK_TYPES if t in type_ids]
        text_id = "n.textId" if "textId" in columns else "NULL"
        rows = self.export.query(
            f'SELECT n.start, COALESCE(n."end", -1), COALESCE(n.globalTid, 0), n.eventType, '
            f"COALESCE(n.text, s.value) FROM {NVTX} n "
            f"LEFT JOIN StringIds s ON s.id = {text_id}",
            NVTX,
        )
        start, end, global_tid, event_type = _int_columns(rows, 4)
        texts = [row[4] for row in rows]
        is_range = np.isin(event_type, ranges)
        is_mark = np.isin(event_type, marks)
        other = ~(is_range | is_mark)
        if other.any():
            self._skip(
                "NVTX events that are neither ranges nor marks (domain/category names)",
                int(other.sum()),
            )
        open_ranges = is_range & (end < start)
        if open_ranges.any():
            self._skip(
                "NVTX ranges with no end (still open when the capture stopped)",
                int(open_ranges.sum()),
            )
        keep = np.flatnonzero((is_range & ~open_ranges) | is_mark)
        end = np.where(is_mark, start, end)
        layer = np.where(is_mark, LAYER_CODE["instant"], LAYER_CODE["engine"]).astype(np.int8)
        names: list[str] = []
        args: list[bytes | None] = []
        colls = np.full(len(keep), -1, dtype=np.int32)
        comm_kind: dict[str, int] = {}  # text -> collective symbol, -1 when not a collective
        cpu_op_code, comm_code = LAYER_CODE["cpu_op"], LAYER_CODE["comm"]
        mark_flags = is_mark.tolist()
        unnamed = 0
        for k, i in enumerate(keep.tolist()):
            text = texts[i]
            if text is None:
                unnamed += 1
                text = "(unnamed NVTX range)"
            op = None if mark_flags[i] else TORCH_NVTX_OP.match(text)
            if op is not None:
                text = op["op"]
                layer[i] = cpu_op_code
                args.append(_torch_op_args(op))
            else:
                args.append(None)
            if not mark_flags[i]:
                coll = comm_kind.get(text)
                if coll is None:
                    comm = is_comm_cpu_op(text)
                    coll = comm_kind[text] = (
                        self.colls.intern(collective_kind(text)) if comm else -1
                    )
                if coll >= 0:
                    layer[i] = comm_code
                    colls[k] = coll
            names.append(text)
        if unnamed:
            self.warnings.append(
                f"{unnamed} NVTX events carry no text; named '(unnamed NVTX range)'"
            )
        part = self._cpu_rows(
            NVTX, "engine", start[keep], end[keep], global_tid[keep], self.names.intern_many(names)
        )
        part.layer = layer[keep]
        part.coll = colls
        part.args = args
        return part

    # -- helpers ---------------------------------------------------------------------------------
    def _cpu_rows(
        self,
        table: str,
        layer: str,
        start: np.ndarray,
        end: np.ndarray,
        global_tid: np.ndarray,
        names: np.ndarray,
        correlation: np.ndarray | None = None,
    ) -> _Rows:
        count = len(start)
        return _Rows(
            table=table,
            process=global_tid >> GLOBAL_ID_SHIFT,
            tid=global_tid & GLOBAL_ID_MASK,
            device=np.full(count, -1, dtype=np.int64),
            stream=np.full(count, -1, dtype=np.int64),
            layer=np.full(count, LAYER_CODE[layer], dtype=np.int8),
            name=names,
            start=start,
            end=end,
            correlation=correlation if correlation is not None else np.full(count, -1, np.int64),
            nbytes=np.full(count, -1, dtype=np.int64),
            coll=np.full(count, -1, dtype=np.int32),
            args=[None] * count,
        )

    def _string(self, string_id: int) -> str:
        value = self.strings.get(string_id)
        if value is None:
            self._skip("names missing from StringIds (shown as <string N>)", 1)
            return f"<string {string_id}>"
        return value

    def _string_names(self, ids: np.ndarray, transform) -> np.ndarray:
        """Symbol ids for a column of StringIds ids, resolving each distinct id once."""
        unique, inverse = np.unique(ids, return_inverse=True)
        symbols = self.names.intern_many([transform(self._string(int(i))) for i in unique])
        return symbols[inverse] if len(ids) else np.zeros(0, dtype=np.int32)

    def _enum(self, table: str, fallback: dict[int, str], transform) -> dict[int, str]:
        """An ENUM_* table as {id: label}; the CUPTI values above when the export lacks it."""
        if not self.export.has(table):
            return dict(fallback)
        rows = self.export.query(f"SELECT id, name, label FROM {table}", table)
        if transform is None:
            return {i: label or name for i, name, label in rows}
        return {i: transform(name, label) for i, name, label in rows}

    def _nvtx_type_ids(self) -> dict[str, int]:
        wanted = (*NVTX_RANGE_TYPES, *NVTX_MARK_TYPES)
        if not self.export.has("ENUM_NSYS_EVENT_TYPE"):
            return {k: v for k, v in _NVTX_TYPE_IDS.items() if k in wanted}
        marks = ", ".join("?" for _ in wanted)
        rows = self.export.query(
            f"SELECT name, id FROM ENUM_NSYS_EVENT_TYPE WHERE name IN ({marks})",
            "ENUM_NSYS_EVENT_TYPE",
            wanted,
        )
        return dict(rows) or {k: v for k, v in _NVTX_TYPE_IDS.items() if k in wanted}

    def _skip(self, reason: str, count: int) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count

    def _count_unread_tables(self) -> None:
        """Event tables (those with a start time) this reader does not turn into rows."""
        for table, sql in sorted(self.export.tables.items()):
            if table in READ_TABLES or not re.search(r"^\s*start\s", sql, re.MULTILINE):
                continue
            count = self.export.count(table)
            if count:
                self._skip(f"rows of {table} (not read by teller)", count)

    # -- ranks, clock, table ---------------------------------------------------------------------
    def _assemble(self, parts: list[_Rows], rank: int | None) -> EventTable:
        process = np.concatenate([p.process for p in parts])
        start = np.concatenate([p.start for p in parts])
        end = np.concatenate([p.end for p in parts])
        bad = end < start
        if bad.any():
            self._skip("events that end before they start", int(bad.sum()))
        keep = np.flatnonzero(~bad)

        def column(key: str) -> np.ndarray:
            return np.concatenate([getattr(p, key) for p in parts])[keep]

        process, start, end = process[keep], start[keep], end[keep]
        layer, device = column("layer"), column("device")
        table_names = [p.table for p in parts]
        table_id = np.concatenate(
            [np.full(len(p), k, dtype=np.int32) for k, p in enumerate(parts)]
        )[keep]
        args_all = [a for p in parts for a in p.args]
        args = [args_all[i] for i in keep.tolist()]
        on_gpu = device >= 0
        tid, correlation = column("tid"), column("correlation")
        launches = table_id == table_names.index(RUNTIME) if RUNTIME in table_names else ~on_gpu
        process = self._place_unowned(process, on_gpu, correlation, launches)
        unit = self._rank_units(process, device, on_gpu, tid, correlation, launches)
        sources, rank_of_unit = self._sources(unit, on_gpu, rank)
        row_rank = rank_of_unit(unit)
        base_ns, clock = self._clock()
        pid = np.where(on_gpu, device, process & GLOBAL_ID_MASK)
        columns = {
            "rank": row_rank,
            "pid": pid,
            "tid": tid,
            "stream": column("stream"),
            "device": device,
            "layer": layer,
            "name": column("name"),
            "cat": table_id,
            "ts_ns": start + base_ns,
            "dur_ns": end - start,
            "correlation": correlation,
            "external_id": np.full(len(keep), -1, dtype=np.int64),
            "coll_name": column("coll"),
            "group": np.full(len(keep), -1, dtype=np.int32),
            "seq": np.full(len(keep), -1, dtype=np.int64),
            "bytes": column("nbytes"),
            "args": args,
        }
        for source in sources:
            mine = row_rank == source.rank
            source.clock, source.base_time_ns = clock, base_ns
            counts = np.bincount(table_id[mine], minlength=len(table_names))
            source.events_by_category = {
                name: int(n) for name, n in zip(table_names, counts, strict=True) if n
            }
        first = sources[0]
        first.skipped = dict(self.skipped)
        first.warnings.extend(self.warnings)
        for reason, count in self.skipped.items():
            first.warnings.append(f"skipped {count} {reason}")
        table = build_table(
            columns,
            names=self.names.values(),
            cats=table_names,
            coll_names=self.colls.values(),
            groups=[],
            host=first.host,
        )
        return EventTable(table=table, sources=sources)

    def _clock(self) -> tuple[int, str]:
        """unix ns = utcEpochNs + session ns; without the anchor, stay on the session clock."""
        anchor = None
        if self.export.has("TARGET_INFO_SESSION_START_TIME"):
            rows = self.export.query(
                "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME",
                "TARGET_INFO_SESSION_START_TIME",
            )
            anchor = rows[0][0] if rows else None
        if isinstance(anchor, int) and anchor > 0:
            return anchor, "unix"
        self.warnings.append(
            "no TARGET_INFO_SESSION_START_TIME.utcEpochNs: timestamps stay on the capture "
            "session's clock (ns since the session started); wall-clock alignment needs an anchor"
        )
        return 0, "trace"

    def _place_unowned(
        self, process: np.ndarray, on_gpu: np.ndarray, correlation: np.ndarray, launches: np.ndarray
    ) -> np.ndarray:
        """GPU activity of an export without `globalPid` joins the process that launched it.

        With one launching process that is all of it. With several, a correlation id that only
        one process used names it (ids are per process, so a shared id says nothing); the rest go
        to the process that launched most, and a warning counts them.
        """
        unknown = process == UNKNOWN_PROCESS
        if not unknown.any():
            return process
        process = process.copy()
        launchers = np.unique(process[launches & ~on_gpu])
        if not len(launchers):
            hosts = np.unique(process[~on_gpu & ~unknown])
            process[unknown] = hosts[0] if len(hosts) else 0
            return process
        if len(launchers) == 1:
            process[unknown] = launchers[0]
            return process
        pairs = np.unique(np.stack([correlation[launches], process[launches]], axis=1), axis=0)
        ids, uses = np.unique(pairs[:, 0], return_counts=True)
        owned = pairs[np.isin(pairs[:, 0], ids[uses == 1])]
        position = np.searchsorted(owned[:, 0], correlation[unknown])
        position = np.minimum(position, max(len(owned) - 1, 0))
        found = len(owned) > 0
        matched = (owned[position, 0] == correlation[unknown]) if found else np.zeros(0, bool)
        busiest = int(np.bincount(np.searchsorted(launchers, process[launches])).argmax())
        placed = np.where(matched, owned[position, 1], launchers[busiest]) if found else None
        process[unknown] = placed if placed is not None else launchers[busiest]
        guessed = int((~matched).sum()) if found else int(unknown.sum())
        if guessed:
            self.warnings.append(
                f"{guessed} GPU activities carry no process (no globalPid column) and no "
                f"correlation id only one process used: placed in pid "
                f"{launchers[busiest] & GLOBAL_ID_MASK}, the process that launched most"
            )
        return process

    def _rank_units(
        self,
        process: np.ndarray,
        device: np.ndarray,
        on_gpu: np.ndarray,
        tid: np.ndarray,
        correlation: np.ndarray,
        launches: np.ndarray,
    ) -> np.ndarray:
        """Per row, the unit that becomes a rank: its process, or (process, device) where one
        process drives several devices, so that each device is a rank (module docstring)."""
        unit = process * (1 << UNIT_SLOT_BITS)
        for owner in np.unique(process[on_gpu]).tolist():
            gpu_rows = on_gpu & (process == owner)
            devices = np.unique(device[gpu_rows])
            if len(devices) < 2:
                continue
            slot = np.searchsorted(devices, device[gpu_rows])
            unit[gpu_rows] += slot
            host_rows = np.flatnonzero(~on_gpu & (process == owner))
            host_slot = _slots_of_host_rows(
                correlation[gpu_rows],
                slot,
                correlation[host_rows],
                tid[host_rows],
                launches[host_rows],
            )
            unit[host_rows] += host_slot
            self.warnings.append(
                f"pid {owner & GLOBAL_ID_MASK} drives devices "
                f"{', '.join(str(d) for d in devices.tolist())}: each device is a rank, with its "
                "GPU activity and the runtime calls that launched it (other host work goes with "
                "the device its thread launched to most)"
            )
        return unit

    def _sources(self, unit: np.ndarray, on_gpu: np.ndarray, rank: int | None):
        """One SourceInfo per rank unit (a process, or one device of a process), and the unit →
        rank map (module docstring)."""
        keys = np.unique(unit)
        with_gpu = set(np.unique(unit[on_gpu]).tolist())
        runtime_processes = set()
        if self.export.has(RUNTIME):
            runtime_processes = {
                int(k) >> GLOBAL_ID_SHIFT
                for (k,) in self.export.query(f"SELECT DISTINCT globalTid FROM {RUNTIME}", RUNTIME)
                if k is not None
            }

        def process_of(key: int) -> int:
            return key >> UNIT_SLOT_BITS

        cuda = with_gpu | {k for k in keys.tolist() if process_of(k) in runtime_processes}
        ordered = sorted(
            keys.tolist(), key=lambda k: (k not in cuda, process_of(k) & GLOBAL_ID_MASK, k)
        )
        host = self._host()
        if rank is not None:
            ranks, how = [rank + k for k in range(len(ordered))], "caller"
        elif len(ordered) == 1:
            ranks, how = self._single_process_rank()
        else:
            ranks, how = list(range(len(ordered))), "process order"
            self.warnings.append(
                f"{len(ordered)} processes or devices in one export and no per-process rank "
                "recorded: ranks assigned in pid order, CUDA processes first ("
                + ", ".join(
                    f"pid {process_of(k) & GLOBAL_ID_MASK}"
                    + (
                        f" device slot {k % (1 << UNIT_SLOT_BITS)}"
                        if k % (1 << UNIT_SLOT_BITS)
                        else ""
                    )
                    + f" -> rank {r}"
                    for k, r in zip(ordered, ranks, strict=True)
                )
                + ")"
            )
        process_names = self._process_names()
        thread_names = self._thread_names()
        sources = []
        for key, r in zip(ordered, ranks, strict=True):
            owner = process_of(key)
            pid = owner & GLOBAL_ID_MASK
            sources.append(
                SourceInfo(
                    path=str(self.export.path),
                    format="nsys",
                    rank=r,
                    rank_source=how,
                    host=host,
                    world_size=len(ordered) if len(ordered) > 1 else 0,
                    process_names={str(pid): process_names[owner]}
                    if owner in process_names
                    else {},
                    thread_names={
                        f"{pid}:{tid}": name
                        for (thread_owner, tid), name in thread_names.items()
                        if thread_owner == owner
                    },
                )
            )
        lookup_keys = np.asarray(ordered, dtype=np.int64)
        lookup_ranks = np.asarray(ranks, dtype=np.int32)
        order = np.argsort(lookup_keys)

        def rank_of_unit(values: np.ndarray) -> np.ndarray:
            position = np.searchsorted(lookup_keys[order], values)
            return lookup_ranks[order][position]

        return sources, rank_of_unit

    def _single_process_rank(self) -> tuple[list[int], str]:
        env = self._launch_environment()
        for variable in ("RANK", "LOCAL_RANK"):
            if variable in env:
                return [env[variable]], f"environment {variable}"
        match = _RANK_IN_FILE_NAME.search(self.export.path.name)
        if match:
            return [int(match.group(1))], "file name"
        self.warnings.append("rank not stated in the export or its file name; assumed rank 0")
        return [0], "assumed"

    def _launch_environment(self) -> dict[str, int]:
        """RANK / LOCAL_RANK from the launched command's environment, as the export records it."""
        texts = [
            value
            for table, where in _ENVIRONMENT_ROWS
            if self.export.has(table)
            for (value,) in self.export.query(f"SELECT value FROM {table} WHERE {where}", table)
            if isinstance(value, str)
        ]
        found: dict[str, int] = {}
        for text in texts:
            for match in _RANK_ENV.finditer(text):
                found.setdefault(match.group(1), int(match.group(2)))
        return found

    def _host(self) -> str:
        if not self.export.has("TARGET_INFO_SYSTEM_ENV"):
            return ""
        rows = self.export.query(
            "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1",
            "TARGET_INFO_SYSTEM_ENV",
        )
        return str(rows[0][0]) if rows else ""

    def _process_names(self) -> dict[int, str]:
        if not self.export.has("PROCESSES"):
            return {}
        rows = self.export.query("SELECT globalPid, name FROM PROCESSES", "PROCESSES")
        return {int(g) >> GLOBAL_ID_SHIFT: str(n) for g, n in rows if g is not None and n}

    def _thread_names(self) -> dict[tuple[int, int], str]:
        if not self.export.has("ThreadNames"):
            return {}
        rows = self.export.query("SELECT globalTid, nameId FROM ThreadNames", "ThreadNames")
        return {
            (int(g) >> GLOBAL_ID_SHIFT, int(g) & GLOBAL_ID_MASK): self.strings.get(n, "")
            for g, n in rows
            if g is not None
        }


def _copy_kind_short(name: str | None, label: str | None) -> str:
    """`CUDA_MEMCPY_KIND_HTOD` → `HtoD`, `…_UVM_DTOH` → `UVM DtoH`: Kineto's spelling."""
    symbol = (name or "").removeprefix("CUDA_MEMCPY_KIND_")
    head, _, kind = symbol.rpartition("_")
    source, to, target = kind.partition("TO")
    if not to or len(source) != 1 or len(target) != 1:
        return label or symbol or "Unknown"
    short = f"{source}to{target}"
    return f"{head} {short}" if head else short


def _memcpy_name(
    copy_kinds: dict[int, str], memory_kinds: dict[int, str], copy: int, src: int, dst: int
) -> str:
    kind = copy_kinds.get(copy, "Unknown")
    if src < 0 or dst < 0:
        return f"Memcpy {kind}"
    return (
        f"Memcpy {kind} ({memory_kinds.get(src, 'Unknown')} -> {memory_kinds.get(dst, 'Unknown')})"
    )


def _torch_op_args(op: re.Match[str]) -> bytes:
    """`{"op_id": 12}` plus, when emit_nvtx recorded shapes, the rest of the text verbatim."""
    args: dict[str, object] = {op["key"]: int(op["id"])}
    if op["rest"]:
        args["detail"] = op["rest"]
    return orjson.dumps(args)


def _slots_of_host_rows(
    gpu_correlation: np.ndarray,
    gpu_slot: np.ndarray,
    host_correlation: np.ndarray,
    host_tid: np.ndarray,
    host_launches: np.ndarray,
) -> np.ndarray:
    """Device slot of each host row of a multi-device process: a runtime call takes the device
    of the GPU work it launched; other rows the device their thread launched to most, else 0."""
    slot_of_correlation = dict(
        zip(gpu_correlation.tolist(), gpu_slot.tolist(), strict=True)
    )  # ids are per process: one id, one launch
    slots = np.fromiter(
        (slot_of_correlation.get(c, -1) if c >= 0 else -1 for c in host_correlation.tolist()),
        dtype=np.int64,
        count=len(host_correlation),
    )
    slots = np.where(host_launches, slots, -1)
    launched = slots >= 0
    usual: dict[int, int] = {}
    for thread in np.unique(host_tid[launched]).tolist():
        usual[thread] = int(np.bincount(slots[launched & (host_tid == thread)]).argmax())
    by_thread = np.fromiter(
        (usual.get(t, 0) for t in host_tid.tolist()), dtype=np.int64, count=len(host_tid)
    )
    return np.where(launched, slots, by_thread)
