"""An annotated Chrome-trace file that opens in Perfetto (ui.perfetto.dev) or chrome://tracing.

The file is the run itself, every event of the event table on its original thread or GPU stream
with its original arguments (shapes, correlation ids), so a person who follows teller's pointer
sees what the profiler recorded, nested as it was recorded. All ranks land in one file on the
common clock, one process per rank. teller's conclusions are added where a person looks: a
"teller verdict" process with one slice per anomalous step carrying the finding and its evidence,
flow arrows from that slice to the suspect operator and the other candidates, an instant on each
suspect, and `teller.*` args on the suspect nodes themselves.

A path ending in `.gz` is written gzip-compressed (Perfetto and teller's reader open it as is):
the plain JSON of a run is several times the size of the profiler's own compressed files.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson

from teller.atomic import atomic_path
from teller.ingest.schema import LAYER_CODE, LAYERS

if TYPE_CHECKING:
    from teller.callchain.tree import CallTree
    from teller.ingest.schema import EventTable
    from teller.rca.verdict import Finding, Verdict

VERDICT_PID = -1  # the verdict track's process id (sorts first)
VERDICT_TID = 0
#: Offset that moves a host thread whose id equals a GPU stream id of the same rank off that track.
HOST_TID_OFFSET = 1 << 31
#: Offset of a stream's synchronisation track: a device-side sync spans the copies and kernels it
#: waits for on the same stream, so on the stream's own track it would overlap them.
SYNC_TID_OFFSET = 1 << 30
#: Layer → the Kineto category that reads back as that layer (teller's own reader, HTA, TraceLens);
#: used where the source was not Kineto (Nsight Systems, the lab) and its category means nothing.
LAYER_CATEGORY = {
    "request": "user_annotation",
    "engine": "user_annotation",
    "python": "python_function",
    "cpu_op": "cpu_op",
    "runtime": "cuda_runtime",
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "sync": "cuda_sync",
    "instant": "cpu_instant_event",
    "counter": "counter",
    "profiler": "Trace",
}
GZIP_LEVEL = 6


def write_perfetto(verdict: Verdict, tree: CallTree, path: Path, events: EventTable) -> Path:
    """Write the run's events with the verdict on top; gzip-compressed when `path` ends in .gz."""
    document = perfetto_document(verdict, tree, events)
    data = orjson.dumps(document)
    if path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
    with atomic_path(path) as partial:
        partial.write_bytes(data)
    return path


def perfetto_document(verdict: Verdict, tree: CallTree, events: EventTable) -> dict:
    """The Chrome-trace document: original events per (rank, thread), then the verdict."""
    table = events.table
    rank = table.column("rank").to_numpy()
    shift_ns = _rank_shifts(tree, table.column("ts_ns").to_numpy(), rank)
    ts_ns = table.column("ts_ns").to_numpy() + shift_ns[rank - rank.min()] if len(rank) else rank
    origin = int(ts_ns.min()) if len(ts_ns) else 0
    stream = table.column("stream").to_numpy()
    layer = table.column("layer").combine_chunks().indices.to_numpy()
    gpu_sync = (layer == LAYER_CODE["sync"]) & (stream >= 0)
    tid = _track_ids(rank, table.column("tid").to_numpy(), stream, gpu_sync)
    device = table.column("device").to_numpy()
    names = _strings(table, "name")
    cats = _categories(table, events, layer)
    args = table.column("args").to_pylist()
    dur_ns = table.column("dur_ns").to_numpy()
    correlation = table.column("correlation").to_numpy()
    external = table.column("external_id").to_numpy()
    suspect_rows = {
        int(tree.row[f.operator_node]): f for f in verdict.findings if f.operator_node is not None
    }
    instant, counter = LAYER_CODE["instant"], LAYER_CODE["counter"]
    trace_events: list[dict] = _metadata(events, rank, tid, stream)
    ts_us = (ts_ns - origin) / 1000.0
    dur_us = dur_ns / 1000.0
    for i in range(len(table)):
        event = {
            "ph": "X",
            "name": names[i],
            "cat": cats[i],
            "pid": int(rank[i]),
            "tid": int(tid[i]),
            "ts": float(ts_us[i]),
        }
        code = layer[i]
        if code == instant:
            event["ph"], event["s"] = "i", "t"
        elif code == counter:
            event["ph"] = "C"
        else:
            event["dur"] = float(dur_us[i])
        finding = suspect_rows.get(i)
        if finding is not None:
            event["args"] = _suspect_args(args[i], finding)
        elif gpu_sync[i]:  # off its stream's track: the stream is named in args, as Kineto does
            event["args"] = _sync_args(args[i], int(stream[i]), int(device[i]))
        elif args[i] is not None:
            event["args"] = orjson.Fragment(args[i])
        elif correlation[i] >= 0 or external[i] >= 0:
            event["args"] = _link_args(int(correlation[i]), int(external[i]))
        trace_events.append(event)
    trace_events.extend(_verdict_events(verdict, tree, origin, tid))
    return {
        "displayTimeUnit": "ns",
        "baseTimeNanoseconds": origin,  # ts are µs after this: readers restore the common clock
        "otherData": {"teller.schema": verdict.schema, "clock_origin_unix_ns": origin},
        "traceEvents": trace_events,
    }


def _rank_shifts(tree: CallTree, table_ts_ns: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Per rank (indexed from the lowest), the shift that puts its rows on the tree's common clock.

    The tree's nodes were moved by the clock alignment; the event table keeps each file's clock.
    """
    if not len(rank):
        return np.zeros(0, dtype=np.int64)
    low = int(rank.min())
    shifts = np.zeros(int(rank.max()) - low + 1, dtype=np.int64)
    if len(tree):
        ranks, first = np.unique(np.asarray(tree.rank), return_index=True)
        rows = np.asarray(tree.row)[first]
        shifts[ranks - low] = np.asarray(tree.start)[first] - table_ts_ns[rows]
    return shifts


def _track_ids(
    rank: np.ndarray, tid: np.ndarray, stream: np.ndarray, gpu_sync: np.ndarray
) -> np.ndarray:
    """Thread id per row: the stream on the GPU (as Kineto writes it), the host's own tid on the CPU.

    A host thread whose id is also a stream id of its rank moves by HOST_TID_OFFSET, so the two never
    share a track; a stream's device-side syncs get a track of their own (SYNC_TID_OFFSET).
    """
    on_gpu = stream >= 0
    track = np.where(on_gpu, stream, tid).astype(np.int64)
    track[gpu_sync] += SYNC_TID_OFFSET
    gpu_keys = set(zip(rank[on_gpu].tolist(), stream[on_gpu].tolist(), strict=True))
    if gpu_keys:
        host = np.flatnonzero(~on_gpu)
        clash = np.array(
            [
                (r, t) in gpu_keys
                for r, t in zip(rank[host].tolist(), tid[host].tolist(), strict=True)
            ],
            dtype=bool,
        )
        track[host[clash]] += HOST_TID_OFFSET
    return track


def _strings(table, column: str) -> list[str]:
    chunked = table.column(column).combine_chunks()
    dictionary = chunked.dictionary.to_pylist()
    return [dictionary[i] if i is not None else "" for i in chunked.indices.to_pylist()]


def _categories(table, events: EventTable, layer: np.ndarray) -> list[str]:
    """The source's own category for Kineto ranks; one that reads back as the layer otherwise."""
    kineto_ranks = {s.rank for s in events.sources if s.format == "kineto"}
    source_cats = _strings(table, "cat")
    rank = table.column("rank").to_numpy()
    by_layer = [LAYER_CATEGORY.get(name, "cpu_op") for name in LAYERS]
    comm = LAYER_CODE["comm"]
    stream = table.column("stream").to_numpy()
    cats = []
    for i, code in enumerate(layer.tolist()):
        if rank[i] in kineto_ranks and source_cats[i]:
            cats.append(source_cats[i])
        elif code == comm:  # the reader tells a collective by its name, on the GPU or the host
            cats.append("kernel" if stream[i] >= 0 else "cpu_op")
        else:
            cats.append(by_layer[code])
    return cats


def _link_args(correlation: int, external: int) -> dict:
    linked = {}
    if correlation >= 0:
        linked["correlation"] = correlation
    if external >= 0:
        linked["External id"] = external
    return linked


def _sync_args(raw: str | None, stream: int, device: int) -> dict:
    original = orjson.loads(raw) if raw else {}
    if not isinstance(original, dict):
        original = {"value": original}
    return {"stream": stream, "device": device} | original


def _suspect_args(raw: str | None, finding: Finding) -> dict:
    original = orjson.loads(raw) if raw else {}
    if not isinstance(original, dict):
        original = {"value": original}
    return original | {
        "teller.suspect": True,
        "teller.step": finding.step,
        "teller.fault_type": finding.fault_type,
        "teller.explanation": finding.explanation,
    }


def _metadata(events: EventTable, rank: np.ndarray, tid: np.ndarray, stream: np.ndarray) -> list:
    """Process names (the verdict, then one per rank) and every track's thread name."""
    named: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": VERDICT_PID, "args": {"name": "teller verdict"}},
        {"ph": "M", "name": "process_sort_index", "pid": VERDICT_PID, "args": {"sort_index": -1}},
        {
            "ph": "M",
            "name": "thread_name",
            "pid": VERDICT_PID,
            "tid": VERDICT_TID,
            "args": {"name": "anomalous steps"},
        },
    ]
    for r in sorted(set(rank.tolist())):
        named.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        named.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
    thread_names: dict[tuple[int, int], str] = {}
    for source in events.sources:
        for key, name in source.thread_names.items():
            raw_tid = key.rsplit(":", 1)[-1]
            if raw_tid.lstrip("-").isdigit() and name:
                thread_names[(source.rank, int(raw_tid))] = name
    on_gpu = stream >= 0
    tracks = set(zip(rank.tolist(), tid.tolist(), on_gpu.tolist(), strict=True))
    for r, t, gpu in sorted(tracks):
        if gpu and t >= SYNC_TID_OFFSET:
            name = f"stream {t - SYNC_TID_OFFSET} sync"
        elif gpu:
            name = f"stream {t}"
        else:
            original = t - HOST_TID_OFFSET if t >= HOST_TID_OFFSET else t
            name = thread_names.get((r, original), f"thread {original}")
        named.append({"ph": "M", "name": "thread_name", "pid": r, "tid": t, "args": {"name": name}})
    return named


def _verdict_events(
    verdict: Verdict, tree: CallTree, origin: int, row_tid: np.ndarray
) -> list[dict]:
    """One slice per finding on the verdict track, flows to its suspect and candidates.

    `row_tid` is the track id of every event-table row, so a flow lands on its node's track.
    """

    def us(ns: int) -> float:
        return (int(ns) - origin) / 1000.0

    def track_of(node: int) -> dict:
        return {"pid": int(tree.rank[node]), "tid": int(row_tid[tree.row[node]])}

    out: list[dict] = []
    flow_id = 0
    for finding in verdict.findings:
        steps = [s for s in verdict.steps if s.step == finding.step]
        if not steps:
            continue
        start = min(s.start_ns for s in steps)
        end = max(s.start_ns + s.dur_ns for s in steps)
        out.append(
            {
                "ph": "X",
                "name": f"anomalous step {finding.step}",
                "cat": "teller",
                "pid": VERDICT_PID,
                "tid": VERDICT_TID,
                "ts": us(start),
                "dur": (end - start) / 1000.0,
                "args": {
                    "explanation": finding.explanation,
                    "rank": finding.rank,
                    "operator": finding.operator,
                    "fault_type": finding.fault_type,
                    "score": finding.score,
                    "evidence": [
                        f"{e.what}: {e.observed_ns} ns against {e.normal_ns} ns normal "
                        f"(z {e.z:.1f}; {e.reference})"
                        for e in finding.evidence
                    ],
                },
            }
        )
        node = finding.operator_node
        if node is not None:
            out.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": f"teller suspect (step {finding.step})",
                    "cat": "teller",
                    "ts": us(tree.start[node]),
                    **track_of(node),
                    "args": {"explanation": finding.explanation},
                }
            )
        targets = [node] if node is not None else []
        targets += [
            int(c["node"])
            for c in finding.candidates
            if c.get("node") is not None and int(c["node"]) not in targets
        ]
        for target in targets:
            if not 0 <= target < len(tree):
                continue
            flow_id += 1
            common = {"id": flow_id, "name": "teller evidence", "cat": "teller"}
            out.append(
                {"ph": "s", **common, "pid": VERDICT_PID, "tid": VERDICT_TID, "ts": us(start)}
            )
            out.append(
                {"ph": "f", "bp": "e", **common, "ts": us(tree.start[target]), **track_of(target)}
            )
    return out
