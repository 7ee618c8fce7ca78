"""Kineto / PyTorch-profiler JSON for the planted-fault suite: a `Timeline` in, a moved copy out.

The copy is the original document with only times changed: every event keeps its fields, its
order and its count, so a reader sees the same trace with a fault in it. Timestamps are written
as exact decimal microseconds from integer nanoseconds (`orjson.Fragment`), never through a
float: real traces carry nanosecond digits that a float64 at epoch scale cannot hold, and a copy
that rounded them would differ from the original in more than the fault.

How events move: GPU ops (kernels, copies, sets) as `replay` says; every host event (operators,
runtime calls, annotations, python frames, instants, flow starts) by its thread's displacement at
its start and at its end; GPU-side ranges (`gpu_user_annotation`) by the ops they cover; a
`cuda_sync` record with the runtime call it belongs to; flow ends on a GPU stream with the op they
point at; the profiler's own `Trace` span grows to cover whatever moved past its end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
from isal import igzip

from teller.errors import TraceError
from teller.eval.planting import (
    ANNOTATION,
    BLOCKING_CALL,
    COPY,
    KERNEL,
    OPERATOR,
    OTHER,
    PAGEABLE_DTOH,
    RUNTIME,
    SET,
    Replayed,
    Timeline,
)

_GPU_OPS = {
    "kernel": KERNEL,
    "Kernel": KERNEL,
    "gpu_memcpy": COPY,
    "Memcpy": COPY,
    "gpu_memset": SET,
    "Memset": SET,
}
_GPU_RANGES = frozenset({"gpu_user_annotation", "cuda_profiler_range"})
_HOST_ROLES = {
    "cpu_op": OPERATOR,
    "operator": OPERATOR,
    "Operator": OPERATOR,
    "cuda_runtime": RUNTIME,
    "Runtime": RUNTIME,
    "cuda_driver": RUNTIME,
    "xpu_runtime": RUNTIME,
    "privateuse1_runtime": RUNTIME,
    "privateuse1_driver": RUNTIME,
    "user_annotation": ANNOTATION,
}
_RAW_TS = re.compile(rb'"ts"\s*:\s*(-?\d+)(?:\.(\d+))?')


def _ns_text(ns: int) -> bytes:
    """Exact decimal microseconds for an integer number of nanoseconds."""
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    whole, frac = divmod(ns, 1000)
    return f"{sign}{whole}.{frac:03d}".encode() if frac else f"{sign}{whole}".encode()


@dataclass
class KinetoTrace:
    """One Kineto file, parsed, with its timeline and where each timeline row came from."""

    path: Path
    document: dict | list
    events: list
    ts_ns: np.ndarray  # per event; 0 where an event has no ts
    ts_text: list[bytes | None]  # the original ts text, for events that do not move
    dur_ns: np.ndarray
    timeline: Timeline
    gpu_event: np.ndarray  # timeline GPU row → event index
    host_event: np.ndarray  # timeline host row → event index
    event_thread: np.ndarray  # event index → thread number, -1 for GPU or metadata events

    @classmethod
    def load(cls, path: Path) -> KinetoTrace:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = igzip.decompress(raw)
        try:
            document = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            raise TraceError(
                path, f"not strict JSON ({error}); the suite plants in strict JSON only"
            ) from None
        events = document.get("traceEvents") if isinstance(document, dict) else document
        if not isinstance(events, list) or not events:
            raise TraceError(path, "no traceEvents: expected a Kineto/Chrome trace")
        ts_ns, ts_text = _exact_timestamps(raw, events)
        dur_ns = np.array(
            [round(float(e.get("dur") or 0) * 1000) if isinstance(e, dict) else 0 for e in events],
            dtype=np.int64,
        )
        return _Builder(path, document, events, ts_ns, ts_text, dur_ns).build()

    def write(self, replayed: Replayed, out: Path) -> Path:
        """The moved copy, uncompressed JSON (the reader does not care), at `out`."""
        new_ts, new_dur = self._moved_times(replayed)
        moved = (new_ts != self.ts_ns) | (new_dur != self.dur_ns)
        events = []
        for index, event in enumerate(self.events):
            if not isinstance(event, dict) or "ts" not in event:
                events.append(event)
                continue
            copy = dict(event)
            if moved[index]:
                copy["ts"] = orjson.Fragment(_ns_text(int(new_ts[index])))
                if "dur" in event:
                    copy["dur"] = orjson.Fragment(_ns_text(int(new_dur[index])))
            else:
                copy["ts"] = orjson.Fragment(
                    self.ts_text[index] or _ns_text(int(self.ts_ns[index]))
                )
            events.append(copy)
        document = dict(self.document) if isinstance(self.document, dict) else None
        if document is not None:
            document["traceEvents"] = events
        out.write_bytes(orjson.dumps(document if document is not None else events))
        return out

    def _moved_times(self, replayed: Replayed) -> tuple[np.ndarray, np.ndarray]:
        t = self.timeline
        start = self.ts_ns.copy()
        end = self.ts_ns + self.dur_ns
        host = np.flatnonzero(self.event_thread >= 0)
        threads = self.event_thread[host]
        start[host] += replayed.host_shifts(threads, self.ts_ns[host])
        end[host] += replayed.host_shifts(threads, self.ts_ns[host] + self.dur_ns[host])
        start[self.gpu_event] = replayed.gpu_start
        end[self.gpu_event] = replayed.gpu_end
        streams = _StreamShifts(self, replayed)
        for index, event in enumerate(self.events):
            if not isinstance(event, dict) or self.event_thread[index] >= 0:
                continue
            phase, category = event.get("ph"), event.get("cat")
            if phase == "X" and category in _GPU_RANGES:
                key = (event.get("pid"), event.get("tid"))
                start[index] = self.ts_ns[index] + streams.at_start(key, int(self.ts_ns[index]))
                end[index] = int(self.ts_ns[index] + self.dur_ns[index]) + streams.at_end(
                    key, int(self.ts_ns[index] + self.dur_ns[index])
                )
            elif phase == "X" and category == "cuda_sync":
                caller = streams.runtime_row(event)
                if caller >= 0:
                    thread = int(t.host_thread[caller])
                    start[index] += replayed.host_shift(thread, int(self.ts_ns[index]))
                    end[index] += replayed.host_shift(thread, int(end[index]))
            elif phase in ("s", "f", "t") and "ts" in event:
                key = (event.get("pid"), event.get("tid"))
                start[index] = self.ts_ns[index] + streams.at_start(key, int(self.ts_ns[index]))
                end[index] = start[index]
        overrun = int(end.max()) - int((self.ts_ns + self.dur_ns).max())
        if overrun > 0:  # the profiler's span covers what now ends later
            for index, event in enumerate(self.events):
                if isinstance(event, dict) and event.get("cat") == "Trace":
                    end[index] += overrun
        return start, end - start


class _StreamShifts:
    """How far GPU-side events that are not ops moved, from the ops on their stream."""

    def __init__(self, trace: KinetoTrace, replayed: Replayed) -> None:
        self.trace = trace
        self.replayed = replayed
        events = trace.events
        self.by_key: dict[tuple, np.ndarray] = {}
        keys = [(events[i].get("pid"), events[i].get("tid")) for i in trace.gpu_event.tolist()]
        grouped: dict[tuple, list[int]] = {}
        for row, key in enumerate(keys):
            grouped.setdefault(key, []).append(row)
        t = trace.timeline
        for key, rows in grouped.items():
            rows_array = np.array(rows, dtype=np.int64)
            self.by_key[key] = rows_array[np.argsort(t.gpu_start[rows_array], kind="stable")]
        self.exact = {(key, int(t.gpu_start[row])): row for row, key in enumerate(keys)}
        self.runtime_by_correlation: dict[int, int] | None = None

    def at_start(self, key: tuple, ts: int) -> int:
        """Shift of a time on a GPU stream: the op starting there, else the next op's start."""
        t, r = self.trace.timeline, self.replayed
        row = self.exact.get((key, ts))
        if row is not None:
            return int(r.gpu_start[row] - t.gpu_start[row])
        rows = self.by_key.get(key)
        if rows is None or not len(rows):
            return 0
        position = int(np.searchsorted(t.gpu_start[rows], ts, side="left"))
        if position < len(rows):
            row = int(rows[position])
            return int(r.gpu_start[row] - t.gpu_start[row])
        row = int(rows[-1])
        return int(r.gpu_end[row] - t.gpu_end[row])

    def at_end(self, key: tuple, ts: int) -> int:
        """Shift of the end of a range on a GPU stream: that of the last op ending by then."""
        t, r = self.trace.timeline, self.replayed
        rows = self.by_key.get(key)
        if rows is None or not len(rows):
            return 0
        ends = t.gpu_end[rows]
        inside = np.flatnonzero(ends <= ts)
        if not len(inside):
            return self.at_start(key, ts)
        row = int(rows[inside[np.argmax(ends[inside])]])
        return int(r.gpu_end[row] - t.gpu_end[row])

    def runtime_row(self, event: dict) -> int:
        if self.runtime_by_correlation is None:
            t, trace = self.trace.timeline, self.trace
            self.runtime_by_correlation = {}
            for row in np.flatnonzero(t.host_role == RUNTIME).tolist():
                args = trace.events[int(trace.host_event[row])].get("args") or {}
                correlation = args.get("correlation")
                if isinstance(correlation, int):
                    self.runtime_by_correlation[correlation] = row
        correlation = (event.get("args") or {}).get("correlation")
        return (
            self.runtime_by_correlation.get(correlation, -1) if isinstance(correlation, int) else -1
        )


def _exact_timestamps(raw: bytes, events: list) -> tuple[np.ndarray, list[bytes | None]]:
    """Every event's ts in integer ns, from the raw text where it matches event for event (as
    teller's reader does), else from the parsed float."""
    has_ts = [i for i, e in enumerate(events) if isinstance(e, dict) and e.get("ts") is not None]
    ts_ns = np.zeros(len(events), dtype=np.int64)
    text: list[bytes | None] = [None] * len(events)
    matches = list(_RAW_TS.finditer(raw))
    if len(matches) == len(has_ts):
        for index, match in zip(has_ts, matches, strict=True):
            whole, frac = match.group(1), match.group(2) or b""
            value = int(whole) * 1000
            part = int((frac + b"000")[:3])
            ts_ns[index] = value - part if whole.startswith(b"-") else value + part
            text[index] = raw[match.start(1) : match.end(2) if match.group(2) else match.end(1)]
    else:
        for index in has_ts:
            ts_ns[index] = round(float(events[index]["ts"]) * 1000)
    return ts_ns, text


class _Builder:
    """One pass over the events, sorting them into GPU ops, host rows and the rest."""

    def __init__(self, path, document, events, ts_ns, ts_text, dur_ns) -> None:
        self.path, self.document, self.events = path, document, events
        self.ts_ns, self.ts_text, self.dur_ns = ts_ns, ts_text, dur_ns
        self.threads: dict[tuple, int] = {}

    def thread(self, pid: object, tid: object) -> int:
        key = (pid, tid)
        if key not in self.threads:
            self.threads[key] = len(self.threads)
        return self.threads[key]

    def build(self) -> KinetoTrace:
        events = self.events
        gpu_rows: list[int] = []
        host_rows: list[int] = []
        event_thread = np.full(len(events), -1, dtype=np.int64)
        gpu_keys = set()
        for index, event in enumerate(events):
            if not isinstance(event, dict):
                continue
            phase, category = event.get("ph"), event.get("cat")
            if phase == "X" and category in _GPU_OPS:
                gpu_rows.append(index)
                gpu_keys.add((event.get("pid"), event.get("tid")))
        for index, event in enumerate(events):
            if not isinstance(event, dict) or event.get("ts") is None:
                continue
            phase, category = event.get("ph"), event.get("cat")
            key = (event.get("pid"), event.get("tid"))
            if phase == "M" or category in _GPU_OPS or category in _GPU_RANGES:
                continue
            if category in ("cuda_sync", "Trace") or key in gpu_keys:
                continue
            event_thread[index] = self.thread(*key)
            if phase == "X":
                host_rows.append(index)
        timeline = self._timeline(gpu_rows, host_rows, event_thread)
        return KinetoTrace(
            path=self.path,
            document=self.document,
            events=events,
            ts_ns=self.ts_ns,
            ts_text=self.ts_text,
            dur_ns=self.dur_ns,
            timeline=timeline,
            gpu_event=np.array(gpu_rows, dtype=np.int64),
            host_event=np.array(host_rows, dtype=np.int64),
            event_thread=event_thread,
        )

    def _timeline(
        self, gpu_rows: list[int], host_rows: list[int], event_thread: np.ndarray
    ) -> Timeline:
        events, ts, dur = self.events, self.ts_ns, self.dur_ns
        host_index = np.array(host_rows, dtype=np.int64)
        gpu_index = np.array(gpu_rows, dtype=np.int64)
        host_names = [str(events[i].get("name", "")) for i in host_rows]
        roles = np.array(
            [_HOST_ROLES.get(events[i].get("cat"), OTHER) for i in host_rows], dtype=np.int8
        )
        runtime_by_correlation: dict[int, int] = {}
        for row, index in enumerate(host_rows):
            if roles[row] == RUNTIME:
                correlation = (events[index].get("args") or {}).get("correlation")
                if isinstance(correlation, int):
                    runtime_by_correlation[correlation] = row
        launch = np.full(len(gpu_rows), -1, dtype=np.int64)
        device = np.zeros(len(gpu_rows), dtype=np.int64)
        stream = np.zeros(len(gpu_rows), dtype=np.int64)
        kind = np.zeros(len(gpu_rows), dtype=np.int8)
        names = []
        for row, index in enumerate(gpu_rows):
            event = events[index]
            args = event.get("args") or {}
            launch[row] = runtime_by_correlation.get(args.get("correlation"), -1)
            device[row] = _int(args.get("device"), _int(event.get("pid"), 0))
            stream[row] = _int(args.get("stream"), _int(event.get("tid"), 0))
            kind[row] = _GPU_OPS[event["cat"]]
            names.append(str(event.get("name", "")))
        sync = np.array([bool(BLOCKING_CALL.match(n)) for n in host_names], dtype=bool)
        for row in np.flatnonzero((kind == COPY) & (launch >= 0)).tolist():
            if PAGEABLE_DTOH.search(names[row]):
                sync[launch[row]] = True
        timeline = Timeline(
            gpu_start=ts[gpu_index] if len(gpu_index) else np.zeros(0, dtype=np.int64),
            gpu_end=(ts + dur)[gpu_index] if len(gpu_index) else np.zeros(0, dtype=np.int64),
            gpu_device=device,
            gpu_stream=stream,
            gpu_kind=kind,
            gpu_name=names,
            gpu_launch=launch,
            host_start=ts[host_index] if len(host_index) else np.zeros(0, dtype=np.int64),
            host_end=(ts + dur)[host_index] if len(host_index) else np.zeros(0, dtype=np.int64),
            host_thread=event_thread[host_index]
            if len(host_index)
            else np.zeros(0, dtype=np.int64),
            host_role=roles,
            host_name=host_names,
            host_sync=sync,
            host_sync_stream=np.full(len(host_rows), -1, dtype=np.int64),
            threads=list(self.threads),
        )
        timeline.add_wait_deps()
        return timeline


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
