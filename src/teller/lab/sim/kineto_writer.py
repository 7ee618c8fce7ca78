"""Write one rank's Kineto trace as PyTorch does, streamed: events go to the gzip stream as made.

The layout follows real files (studied in ../shared/traces): the document's header keys first
(`schemaVersion`, `deviceProperties`, CUDA versions, `distributedInfo` with `pg_config`,
`record_shapes`, `with_stack`, `trace_id`, `displayTimeUnit`, `baseTimeNanoseconds`), then
`traceEvents`, then `traceName`. Timestamps are µs floats relative to `baseTimeNanoseconds`, with ns
digits. Event keys keep Kineto's order: X events `ph, cat, name, pid, tid, ts, dur, args`; flows
`ph, id, pid, tid, ts, cat, name[, bp]`; metadata `name, ph, ts, pid, tid, args`.

The gzip header carries no file name and mtime 0, so the same events give the same bytes.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import orjson

GPU_PROCESS_SORT_BASE = 5_000_000


def us(t_ns: int) -> float:
    """ns → µs float with the ns digits (exact for the relative clock the writer uses)."""
    return t_ns / 1000.0


class KinetoWriter:
    """One rank's trace file; `write` appends encoded events, `close` finishes and renames."""

    def __init__(
        self,
        path: Path,
        header: dict,
        base_time_ns: int,
        trace_name: str,
        compresslevel: int = 3,
    ) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp")
        self.base_time_ns = base_time_ns
        self.trace_name = trace_name
        self._raw = open(self.tmp, "wb")  # noqa: SIM115 - closed in close()
        self._gz = gzip.GzipFile(
            filename="", mode="wb", fileobj=self._raw, compresslevel=compresslevel, mtime=0
        )
        head = orjson.dumps(header)[:-1]  # leave the object open
        self._gz.write(
            head
            + b',"displayTimeUnit":"ms","baseTimeNanoseconds":'
            + str(base_time_ns).encode()
            + b',"traceEvents":[\n'
        )
        self._first = True
        self.events = 0

    def write(self, encoded: list[bytes]) -> None:
        if not encoded:
            return
        joined = b",\n".join(encoded)
        self._gz.write(joined if self._first else b",\n" + joined)
        self._first = False
        self.events += len(encoded)

    def close(self) -> None:
        self._gz.write(b"\n],\n" + b'"traceName":' + orjson.dumps(self.trace_name) + b"}\n")
        self._gz.close()
        self._raw.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self._gz.close()
        self._raw.close()
        self.tmp.unlink(missing_ok=True)


class EventEncoder:
    """Kineto-shaped event encoders for one rank (pid, device, clock base); GPU events name their
    stream, and the streams used get their thread metadata at the end."""

    def __init__(self, pid: int, device: int, base_time_ns: int) -> None:
        self.pid = pid
        self.device = device
        self.base = base_time_ns

    def cpu(self, cat: str, name: str, ts_ns: int, dur_ns: int, args: dict) -> bytes:
        return orjson.dumps(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": self.pid,
                "tid": self.pid,
                "ts": us(ts_ns - self.base),
                "dur": us(dur_ns),
                "args": args,
            }
        )

    def gpu(self, cat: str, name: str, ts_ns: int, dur_ns: int, stream: int, args: dict) -> bytes:
        return orjson.dumps(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": self.device,
                "tid": stream,
                "ts": us(ts_ns - self.base),
                "dur": us(dur_ns),
                "args": args,
            }
        )

    def flow_start(self, correlation: int, ts_ns: int) -> bytes:
        return orjson.dumps(
            {
                "ph": "s",
                "id": correlation,
                "pid": self.pid,
                "tid": self.pid,
                "ts": us(ts_ns - self.base),
                "cat": "ac2g",
                "name": "ac2g",
            }
        )

    def flow_end(self, correlation: int, ts_ns: int, stream: int) -> bytes:
        return orjson.dumps(
            {
                "ph": "f",
                "id": correlation,
                "pid": self.device,
                "tid": stream,
                "ts": us(ts_ns - self.base),
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            }
        )

    def metadata(self, ts_ns: int, process_name: str, gpus: int, streams: list[int]) -> list[bytes]:
        """Process/thread name events as Kineto writes them at the end of a trace: every process,
        then each GPU stream that ran work (in stream order), then the host thread."""
        ts = us(ts_ns - self.base)

        def m(name: str, pid: int, tid: int, args: dict) -> bytes:
            return orjson.dumps(
                {"name": name, "ph": "M", "ts": ts, "pid": pid, "tid": tid, "args": args}
            )

        out = [
            m("process_name", self.pid, 0, {"name": process_name}),
            m("process_labels", self.pid, 0, {"labels": "CPU"}),
            m("process_sort_index", self.pid, 0, {"sort_index": self.pid}),
        ]
        for gpu in range(gpus):
            out += [
                m("process_name", gpu, 0, {"name": process_name}),
                m("process_labels", gpu, 0, {"labels": f"GPU {gpu}"}),
                m("process_sort_index", gpu, 0, {"sort_index": GPU_PROCESS_SORT_BASE + gpu}),
            ]
        for stream in sorted(streams):
            out += [
                m("thread_name", self.device, stream, {"name": f"stream {stream} "}),
                m("thread_sort_index", self.device, stream, {"sort_index": stream}),
            ]
        out += [
            m("thread_name", self.pid, self.pid, {"name": f"thread {self.pid} ({process_name})"}),
            m("thread_sort_index", self.pid, self.pid, {"sort_index": self.pid}),
        ]
        return out

    def profiler_span(self, start_ns: int, end_ns: int) -> list[bytes]:
        ts = us(start_ns - self.base)
        return [
            orjson.dumps(
                {
                    "ph": "X",
                    "cat": "Trace",
                    "ts": ts,
                    "dur": us(end_ns - start_ns),
                    "pid": "Spans",
                    "tid": "PyTorch Profiler",
                    "name": "PyTorch Profiler (0)",
                    "args": {"Op count": 0},
                }
            ),
            orjson.dumps(
                {
                    "name": "process_sort_index",
                    "ph": "M",
                    "ts": ts,
                    "pid": "Spans",
                    "tid": 0,
                    "args": {"sort_index": 536870912},
                }
            ),
            orjson.dumps(
                {
                    "name": "Iteration Start: PyTorch Profiler",
                    "ph": "i",
                    "s": "g",
                    "pid": "Traces",
                    "tid": "Trace PyTorch Profiler",
                    "ts": ts,
                }
            ),
            orjson.dumps(
                {
                    "name": "Record Window End",
                    "ph": "i",
                    "s": "g",
                    "pid": "",
                    "tid": "",
                    "ts": us(end_ns - self.base),
                }
            ),
        ]
