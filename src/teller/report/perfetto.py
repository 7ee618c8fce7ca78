"""An annotated Chrome-trace file that opens in Perfetto (ui.perfetto.dev) or chrome://tracing.

All ranks land in one file on the common clock, one process per rank. teller's conclusions are
added where a person looks: a "teller verdict" track with one slice per anomalous step, an instant
event on each suspect node, flow arrows from the verdict slice to the suspect, and `teller.*` args
on the suspect nodes themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson

from teller.ingest.schema import LAYERS, TREE_LAYERS
from teller.report import write_atomic

if TYPE_CHECKING:
    from teller.callchain.tree import CallTree
    from teller.rca.verdict import Verdict

VERDICT_PID = -1  # the verdict track's process id (sorts first)
#: Layer → the Kineto category that reads back as that layer (teller's own reader, HTA, TraceLens).
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
}


def write_perfetto(verdict: Verdict, tree: CallTree, path: Path) -> Path:
    origin = int(tree.start.min()) if len(tree) else 0

    def us(ns: int) -> float:
        return (int(ns) - origin) / 1000.0

    suspects = {f.operator_node: f for f in verdict.findings if f.operator_node is not None}
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": VERDICT_PID, "args": {"name": "teller verdict"}},
        {"ph": "M", "name": "process_sort_index", "pid": VERDICT_PID, "args": {"sort_index": -1}},
    ]
    for rank in sorted(set(tree.rank.tolist())):
        events.append(
            {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}}
        )
    tree_layers = {LAYERS.index(name) for name in TREE_LAYERS}
    gpu_threads: set[tuple[int, int]] = set()
    for node in np.flatnonzero(np.isin(tree.layer, list(tree_layers))).tolist():
        on_gpu = tree.stream[node] >= 0
        layer = LAYERS[tree.layer[node]]
        if on_gpu:
            gpu_threads.add((int(tree.rank[node]), int(tree.stream[node])))
        event = {
            "ph": "X",
            "name": tree.node_name(node),
            # comm: the reader tells a collective by its name, on the GPU or the host
            "cat": LAYER_CATEGORY.get(layer, "kernel" if on_gpu else "cpu_op"),
            "pid": int(tree.rank[node]),
            "tid": int(tree.stream[node]) if on_gpu else "cpu",
            "ts": us(tree.start[node]),
            "dur": int(tree.dur[node]) / 1000.0,
        }
        finding = suspects.get(node)
        if finding is not None:
            event["args"] = {
                "teller.suspect": True,
                "teller.step": finding.step,
                "teller.fault_type": finding.fault_type,
                "teller.explanation": finding.explanation,
            }
        events.append(event)
    for flow_id, finding in enumerate(verdict.findings, start=1):
        steps = [s for s in verdict.steps if s.step == finding.step]
        if not steps:
            continue
        start = min(s.start_ns for s in steps)
        end = max(s.start_ns + s.dur_ns for s in steps)
        events.append(
            {
                "ph": "X",
                "name": f"anomalous step {finding.step}",
                "cat": "teller",
                "pid": VERDICT_PID,
                "tid": "anomalous steps",
                "ts": us(start),
                "dur": (end - start) / 1000.0,
                "args": {
                    "explanation": finding.explanation,
                    "rank": finding.rank,
                    "operator": finding.operator,
                    "score": finding.score,
                },
            }
        )
        node = finding.operator_node
        if node is None:
            continue
        target = {
            "pid": int(tree.rank[node]),
            "tid": int(tree.stream[node]) if tree.stream[node] >= 0 else "cpu",
        }
        events.append(
            {
                "ph": "i",
                "s": "t",
                "name": f"teller suspect (step {finding.step})",
                "cat": "teller",
                "ts": us(tree.start[node]),
                **target,
                "args": {"explanation": finding.explanation},
            }
        )
        events.append(
            {
                "ph": "s",
                "id": flow_id,
                "name": "teller",
                "cat": "teller",
                "pid": VERDICT_PID,
                "tid": "anomalous steps",
                "ts": us(start),
            }
        )
        events.append(
            {
                "ph": "f",
                "bp": "e",
                "id": flow_id,
                "name": "teller",
                "cat": "teller",
                "ts": us(tree.start[node]),
                **target,
            }
        )
    events.extend(
        {
            "ph": "M",
            "name": "thread_name",
            "pid": rank,
            "tid": stream,
            "args": {"name": f"stream {stream}"},
        }
        for rank, stream in sorted(gpu_threads)
    )
    document = {
        "displayTimeUnit": "ns",
        "baseTimeNanoseconds": origin,  # ts are µs after this: readers restore the common clock
        "otherData": {"teller.schema": verdict.schema, "clock_origin_unix_ns": origin},
        "traceEvents": events,
    }
    return write_atomic(path, orjson.dumps(document).decode())
