"""Nsight Systems SQLite exports for the planted-fault suite: a `Timeline` in, a moved copy out.

The copy is the export with `start`/`end` rewritten in the tables teller reads (kernels, copies,
sets, runtime calls, synchronisation records, CUPTI overhead, NVTX), row for row; every other table
is left as it was. Threads are `globalTid`s; a GPU op's launching call is the runtime row of the
same process and `correlationId`. A `cudaStreamSynchronize` waits on the stream its CUPTI
synchronisation record names.

`with_collective` adds one all-reduce instance to a multi-process export (one NCCL kernel per
device, each launched by a `cudaLaunchKernel` row on its process's thread). The suite needs it to
make a peer wait: the real 2-GPU capture it plants in has no collective kernels at all.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from teller.errors import TraceError
from teller.eval.planting import (
    ANNOTATION,
    BLOCKING_CALL,
    COPY,
    KERNEL,
    OPERATOR,
    RUNTIME,
    SET,
    Replayed,
    Timeline,
)

_KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"
_RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
_MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
_MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
_SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
_OVERHEAD = "CUPTI_ACTIVITY_KIND_OVERHEAD"
_NVTX = "NVTX_EVENTS"
_VERSION_SUFFIX = re.compile(r"_v\d+$")
#: PyTorch's `emit_nvtx` / `nsys --pytorch` operator ranges: `aten::mm, op_id = 12`.
_TORCH_OP = re.compile(r"^([^,]+), (?:op_id|seq) = \d+")
_PID_SHIFT, _ID_MASK = 24, 0xFFFFFF
_STREAM_SYNC = 3  # CUPTI synchronisation type: cudaStreamSynchronize
_DTOH, _PAGEABLE = 2, 0  # CUPTI copy kind and memory kind
#: The collective `with_collective` adds: NCCL's ring all-reduce, as NCCL 2.2x names it.
COLLECTIVE_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COLLECTIVE_SHORT = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def torch_op_name(text: str) -> str:
    """`aten::mm, op_id = 12` → `aten::mm` (the name teller gives the operator)."""
    match = _TORCH_OP.match(text)
    return match.group(1) if match else text


@dataclass
class _Inserted:
    """A row the copy adds: a copy of `template` (table, rowid) with `fields` replaced."""

    table: str
    template: int
    fields: dict


@dataclass
class NsysTrace:
    """One export, its timeline, and the (table, rowid) behind every timeline row."""

    path: Path
    timeline: Timeline
    gpu_source: list[tuple[str, int] | None]
    host_source: list[tuple[str, int] | None]
    syncs: list[tuple[int, int, int, int]]  # (rowid, start, end, runtime host row)
    overhead: list[tuple[int, int, int, int]]  # (rowid, start, end, thread)
    marks: list[tuple[int, int, int, int]]  # NVTX marks: (rowid, start, start, thread)
    inserted: list[_Inserted] = field(default_factory=list)
    new_strings: dict[int, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> NsysTrace:
        uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
        try:
            connection = sqlite3.connect(uri, uri=True)
            return _Loader(path, connection).load()
        except sqlite3.Error as error:
            raise TraceError(path, f"cannot read as an nsys export ({error})") from None

    def write(self, replayed: Replayed, out: Path) -> Path:
        """The moved copy at `out` (a copy of the export, updated in place)."""
        shutil.copyfile(self.path, out)
        t = self.timeline
        updates: dict[str, list[tuple[int, int, int]]] = {}
        for row, source in enumerate(self.gpu_source):
            if source is not None and (
                replayed.gpu_start[row] != t.gpu_start[row]
                or replayed.gpu_end[row] != t.gpu_end[row]
            ):
                updates.setdefault(source[0], []).append(
                    (int(replayed.gpu_start[row]), int(replayed.gpu_end[row]), source[1])
                )
        host_start = t.host_start + replayed.host_shifts(t.host_thread, t.host_start)
        host_end = t.host_end + replayed.host_shifts(t.host_thread, t.host_end)
        for row, source in enumerate(self.host_source):
            if source is not None and (
                host_start[row] != t.host_start[row] or host_end[row] != t.host_end[row]
            ):
                updates.setdefault(source[0], []).append(
                    (int(host_start[row]), int(host_end[row]), source[1])
                )
        for rowid, start, end, caller in self.syncs:
            thread = int(t.host_thread[caller])
            moved = (
                start + replayed.host_shift(thread, start),
                end + replayed.host_shift(thread, end),
            )
            if moved != (start, end):
                updates.setdefault(_SYNC, []).append((*moved, rowid))
        for table, rows in ((_OVERHEAD, self.overhead), (_NVTX, self.marks)):
            for rowid, start, end, thread in rows:
                moved = (
                    start + replayed.host_shift(thread, start),
                    end + replayed.host_shift(thread, end),
                )
                if moved != (start, end):
                    updates.setdefault(table, []).append((*moved, rowid))
        connection = sqlite3.connect(out)
        try:
            with connection:
                for table, rows in updates.items():
                    connection.executemany(
                        f'UPDATE {table} SET start = ?, "end" = CASE WHEN "end" IS NULL THEN NULL '
                        f"ELSE ? END WHERE rowid = ?",
                        rows,
                    )
                for string_id, value in self.new_strings.items():
                    connection.execute(
                        "INSERT INTO StringIds (id, value) VALUES (?, ?)", (string_id, value)
                    )
                for row in self.inserted:
                    self._insert(connection, row, replayed)
        finally:
            connection.close()
        return out

    def _insert(self, connection: sqlite3.Connection, row: _Inserted, replayed: Replayed) -> None:
        cursor = connection.execute(f"SELECT * FROM {row.table} WHERE rowid = ?", (row.template,))
        columns = [d[0] for d in cursor.description]
        values = dict(zip(columns, cursor.fetchone(), strict=True))
        values.update(row.fields)
        if "gpu_row" in values:
            gpu_row = values.pop("gpu_row")
            values["start"], values["end"] = (
                int(replayed.gpu_start[gpu_row]),
                int(replayed.gpu_end[gpu_row]),
            )
        if "host_row" in values:
            host_row = values.pop("host_row")
            t = self.timeline
            thread = int(t.host_thread[host_row])
            start, end = int(t.host_start[host_row]), int(t.host_end[host_row])
            values["start"] = start + replayed.host_shift(thread, start)
            values["end"] = end + replayed.host_shift(thread, end)
        names = ", ".join(f'"{c}"' for c in values)
        marks = ", ".join("?" for _ in values)
        connection.execute(
            f"INSERT INTO {row.table} ({names}) VALUES ({marks})", list(values.values())
        )

    def with_collective(self, after: dict[int, int], base_ns: int) -> tuple[NsysTrace, list[int]]:
        """A copy with one all-reduce instance added: on each device, an NCCL kernel that waits on
        GPU op `after[device]` and is waited on by the next op of that op's stream, launched by a
        new call on the thread that launched `after[device]`, just after that launch. Returns the
        new trace and the collective's GPU rows."""
        t = self.timeline
        strings = dict(self.new_strings)
        next_string = self._max_string_id() + 1
        long_id, short_id = next_string, next_string + 1
        strings[long_id], strings[short_id] = COLLECTIVE_KERNEL, COLLECTIVE_SHORT
        stream = int(t.gpu_stream.max()) + 1
        correlation = self._max_correlation() + 1
        gpu_rows, host_rows, deps, inserted = [], [], [], list(self.inserted)
        new = {k: [] for k in ("gs", "ge", "gd", "gst", "gl", "hs", "he", "ht")}
        for offset, (device, before) in enumerate(sorted(after.items())):
            launch = int(t.gpu_launch[before])
            if launch < 0:
                raise TraceError(
                    self.path, f"GPU op {before} has no launching call to put a collective after"
                )
            thread = int(t.host_thread[launch])
            call_start, call_end = self._free_slot(thread, int(t.host_end[launch]))
            host_row = len(t.host_start) + len(host_rows)
            gpu_row = len(t.gpu_start) + len(gpu_rows)
            new["hs"].append(call_start)
            new["he"].append(call_end)
            new["ht"].append(thread)
            new["gs"].append(max(call_end, int(t.gpu_end[before])))
            new["gd"].append(device)
            new["gst"].append(stream + offset)
            new["gl"].append(host_row)
            host_rows.append(host_row)
            gpu_rows.append(gpu_row)
            deps.append((before, gpu_row))
            following = self._next_on_stream(before)
            if following >= 0:
                deps.append((gpu_row, following))
            kernel_source, runtime_source = self.gpu_source[before], self.host_source[launch]
            if kernel_source is None or runtime_source is None:
                raise TraceError(
                    self.path, "a collective can follow only a kernel read from the export"
                )
            corr = correlation + offset
            inserted.append(
                _Inserted(
                    _KERNELS,
                    kernel_source[1],
                    {
                        "gpu_row": gpu_row,
                        "streamId": stream + offset,
                        "correlationId": corr,
                        "demangledName": long_id,
                        "shortName": short_id,
                        "mangledName": None,
                        "gridX": 1,
                        "gridY": 1,
                        "gridZ": 1,
                        "blockX": 512,
                        "blockY": 1,
                        "blockZ": 1,
                    },
                )
            )
            inserted.append(
                _Inserted(
                    _RUNTIME, runtime_source[1], {"host_row": host_row, "correlationId": corr}
                )
            )
        arrival = max(new["gs"])
        timeline = replace(
            t,
            gpu_start=np.concatenate([t.gpu_start, new["gs"]]).astype(np.int64),
            gpu_end=np.concatenate([t.gpu_end, [arrival + base_ns] * len(gpu_rows)]).astype(
                np.int64
            ),
            gpu_device=np.concatenate([t.gpu_device, new["gd"]]).astype(np.int64),
            gpu_stream=np.concatenate([t.gpu_stream, new["gst"]]).astype(np.int64),
            gpu_kind=np.concatenate([t.gpu_kind, [KERNEL] * len(gpu_rows)]).astype(np.int8),
            gpu_name=[*t.gpu_name, *([COLLECTIVE_KERNEL] * len(gpu_rows))],
            gpu_launch=np.concatenate([t.gpu_launch, new["gl"]]).astype(np.int64),
            host_start=np.concatenate([t.host_start, new["hs"]]).astype(np.int64),
            host_end=np.concatenate([t.host_end, new["he"]]).astype(np.int64),
            host_thread=np.concatenate([t.host_thread, new["ht"]]).astype(np.int64),
            host_role=np.concatenate([t.host_role, [RUNTIME] * len(host_rows)]).astype(np.int8),
            host_name=[*t.host_name, *(["cudaLaunchKernel"] * len(host_rows))],
            host_sync=np.concatenate([t.host_sync, [False] * len(host_rows)]).astype(bool),
            host_sync_stream=np.concatenate([t.host_sync_stream, [-1] * len(host_rows)]).astype(
                np.int64
            ),
            deps=[*t.deps, *deps],
            collectives=[*t.collectives, gpu_rows],
            collective_base_ns=base_ns,
        )
        trace = replace(
            self,
            timeline=timeline,
            gpu_source=[*self.gpu_source, *([None] * len(gpu_rows))],
            host_source=[*self.host_source, *([None] * len(host_rows))],
            inserted=inserted,
            new_strings=strings,
        )
        return trace, gpu_rows

    def _free_slot(self, thread: int, after_ns: int) -> tuple[int, int]:
        """A short interval on `thread` just after `after_ns` that no host event starts or ends in."""
        t = self.timeline
        on_thread = t.host_thread == thread
        bounds = np.concatenate([t.host_start[on_thread], t.host_end[on_thread]])
        later = bounds[bounds > after_ns]
        room = int(later.min() - after_ns) if len(later) else 4_000
        width = max(min(2_000, room // 2), 1)
        start = after_ns + max(room // 4, 0)
        return start, start + width

    def _next_on_stream(self, row: int) -> int:
        t = self.timeline
        same = np.flatnonzero(
            (t.gpu_device == t.gpu_device[row])
            & (t.gpu_stream == t.gpu_stream[row])
            & (t.gpu_start > t.gpu_start[row])
        )
        return int(same[np.argmin(t.gpu_start[same])]) if len(same) else -1

    def _max_string_id(self) -> int:
        with sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro&immutable=1", uri=True) as c:
            known = int(c.execute("SELECT MAX(id) FROM StringIds").fetchone()[0])
        return max([known, *self.new_strings])

    def _max_correlation(self) -> int:
        with sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro&immutable=1", uri=True) as c:
            return (
                int(c.execute(f"SELECT MAX(correlationId) FROM {_RUNTIME}").fetchone()[0] or 0)
                + 1000
            )


class _Loader:
    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path, self.connection = path, connection
        self.tables = {
            r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        self.strings = dict(connection.execute("SELECT id, value FROM StringIds"))
        self.threads: dict[int, int] = {}

    def thread(self, global_tid: int) -> int:
        if global_tid not in self.threads:
            self.threads[global_tid] = len(self.threads)
        return self.threads[global_tid]

    def rows(self, table: str, columns: str) -> list[tuple]:
        if table not in self.tables:
            return []
        return self.connection.execute(f"SELECT rowid, {columns} FROM {table}").fetchall()

    def load(self) -> NsysTrace:
        try:
            return self._load()
        finally:
            self.connection.close()

    def _load(self) -> NsysTrace:
        host: dict[str, list] = {
            k: [] for k in ("start", "end", "thread", "role", "name", "source")
        }
        runtime_of: dict[tuple[int, int], int] = {}
        for rowid, start, end, gtid, correlation, name_id in self.rows(
            _RUNTIME, 'start, "end", COALESCE(globalTid, 0), COALESCE(correlationId, -1), nameId'
        ):
            row = len(host["start"])
            name = _VERSION_SUFFIX.sub("", self.strings.get(name_id, ""))
            self._host(host, start, end, gtid, RUNTIME, name, (_RUNTIME, rowid))
            runtime_of[((gtid >> _PID_SHIFT) & _ID_MASK, correlation)] = row
        marks: list[tuple[int, int, int, int]] = []
        nvtx_columns = 'start, "end", COALESCE(globalTid, 0), COALESCE(text, ""), textId'
        for rowid, start, end, gtid, text, text_id in self.rows(_NVTX, nvtx_columns):
            label = text or (self.strings.get(text_id, "") if text_id is not None else "")
            if end is None:  # a mark: an instant, moved with its thread
                marks.append((rowid, start, start, self.thread(gtid)))
                continue
            role = OPERATOR if _TORCH_OP.match(label) else ANNOTATION
            self._host(host, start, end, gtid, role, torch_op_name(label), (_NVTX, rowid))
        gpu: dict[str, list] = {
            k: [] for k in ("start", "end", "device", "stream", "kind", "name", "launch", "source")
        }
        kernel_names = self._kernel_name_sql()
        for rowid, start, end, device, stream, correlation, gpid, name in self.rows(
            _KERNELS,
            f'start, "end", deviceId, streamId, COALESCE(correlationId, -1), '
            f"COALESCE(globalPid, 0), {kernel_names}",
        ):
            self._gpu(
                gpu,
                start,
                end,
                device,
                stream,
                KERNEL,
                self.strings.get(name, ""),
                runtime_of.get(((gpid >> _PID_SHIFT) & _ID_MASK, correlation), -1),
                (_KERNELS, rowid),
            )
        pageable = []
        copy_columns = 'start, "end", deviceId, streamId, COALESCE(correlationId, -1), COALESCE(globalPid, 0), COALESCE(copyKind, 0), COALESCE(dstKind, -1)'
        for rowid, start, end, device, stream, correlation, gpid, kind, dst in self.rows(
            _MEMCPY, copy_columns
        ):
            launch = runtime_of.get(((gpid >> _PID_SHIFT) & _ID_MASK, correlation), -1)
            name = (
                "Memcpy DtoH (Device -> Pageable)"
                if (kind, dst) == (_DTOH, _PAGEABLE)
                else f"Memcpy kind {kind}"
            )
            if (kind, dst) == (_DTOH, _PAGEABLE) and launch >= 0:
                pageable.append(launch)
            self._gpu(gpu, start, end, device, stream, COPY, name, launch, (_MEMCPY, rowid))
        set_columns = (
            'start, "end", deviceId, streamId, COALESCE(correlationId, -1), COALESCE(globalPid, 0)'
        )
        for rowid, start, end, device, stream, correlation, gpid in self.rows(_MEMSET, set_columns):
            launch = runtime_of.get(((gpid >> _PID_SHIFT) & _ID_MASK, correlation), -1)
            self._gpu(gpu, start, end, device, stream, SET, "Memset", launch, (_MEMSET, rowid))
        sync_stream = np.full(len(host["start"]), -1, dtype=np.int64)
        syncs = []
        for rowid, start, end, correlation, gpid, sync_type, stream in self.rows(
            _SYNC,
            'start, "end", COALESCE(correlationId, -1), COALESCE(globalPid, 0), COALESCE(syncType, -1), COALESCE(streamId, -1)',
        ):
            caller = runtime_of.get(((gpid >> _PID_SHIFT) & _ID_MASK, correlation), -1)
            if caller < 0:
                continue
            syncs.append((rowid, start, end, caller))
            if sync_type == _STREAM_SYNC and 0 <= stream < 2**31 - 1:
                sync_stream[caller] = stream
        overhead = [
            (rowid, start, end, self.thread(gtid))
            for rowid, start, end, gtid in self.rows(
                _OVERHEAD, 'start, "end", COALESCE(globalTid, 0)'
            )
        ]
        sync = np.array([bool(BLOCKING_CALL.match(n)) for n in host["name"]], dtype=bool)
        sync[pageable] = True
        timeline = Timeline(
            gpu_start=np.array(gpu["start"], dtype=np.int64),
            gpu_end=np.array(gpu["end"], dtype=np.int64),
            gpu_device=np.array(gpu["device"], dtype=np.int64),
            gpu_stream=np.array(gpu["stream"], dtype=np.int64),
            gpu_kind=np.array(gpu["kind"], dtype=np.int8),
            gpu_name=gpu["name"],
            gpu_launch=np.array(gpu["launch"], dtype=np.int64),
            host_start=np.array(host["start"], dtype=np.int64),
            host_end=np.array(host["end"], dtype=np.int64),
            host_thread=np.array(host["thread"], dtype=np.int64),
            host_role=np.array(host["role"], dtype=np.int8),
            host_name=host["name"],
            host_sync=sync,
            host_sync_stream=sync_stream,
            threads=[((gtid >> _PID_SHIFT) & _ID_MASK, gtid) for gtid in self.threads],
        )
        timeline.add_wait_deps()
        return NsysTrace(
            path=self.path,
            timeline=timeline,
            gpu_source=gpu["source"],
            host_source=host["source"],
            syncs=syncs,
            overhead=overhead,
            marks=marks,
        )

    def _host(self, host: dict, start, end, gtid, role, name, source) -> None:
        host["start"].append(start)
        host["end"].append(end)
        host["thread"].append(self.thread(gtid))
        host["role"].append(role)
        host["name"].append(name)
        host["source"].append(source)

    @staticmethod
    def _gpu(gpu: dict, start, end, device, stream, kind, name, launch, source) -> None:
        for key, value in zip(
            ("start", "end", "device", "stream", "kind", "name", "launch", "source"),
            (start, end, device, stream, kind, name, launch, source),
            strict=True,
        ):
            gpu[key].append(value)

    def _kernel_name_sql(self) -> str:
        columns = (
            {r[1] for r in self.connection.execute(f"PRAGMA table_info({_KERNELS})")}
            if _KERNELS in self.tables
            else set()
        )
        if "demangledName" in columns:
            return "demangledName"
        return "shortName"
