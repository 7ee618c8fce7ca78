"""`teller analyze CASE --perfetto OUT.json`: a Chrome trace that teller's own Kineto reader reads
back event for event (every rank, every layer, every thread and argument, on the run's clock),
nested on each track as the profiler recorded it, with the verdict on top."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from conftest import real_trace
from teller.analysis import Analysis
from teller.cli import main
from teller.ingest.kineto import read
from teller.report.perfetto import VERDICT_PID, write_perfetto

VLLM = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"
#: Float µs in a Chrome trace round to a nanosecond; more than this past the parent is an overlap.
NESTING_TOLERANCE_US = 1e-3


def improperly_nested(events: list[dict]) -> dict[tuple, int]:
    """Per (pid, tid) track, the complete slices that start inside another and end after it."""
    tracks: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            start = float(e["ts"])
            tracks[(e["pid"], e["tid"])].append((start, start + float(e.get("dur", 0))))
    bad: dict[tuple, int] = {}
    for track, slices in tracks.items():
        slices.sort(key=lambda s: (s[0], -s[1]))
        open_ends: list[float] = []
        for start, end in slices:
            while open_ends and open_ends[-1] <= start + NESTING_TOLERANCE_US:
                open_ends.pop()
            if open_ends and end > open_ends[-1] + NESTING_TOLERANCE_US:
                bad[track] = bad.get(track, 0) + 1
            open_ends.append(end)
    return bad


def load(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.name.endswith(".gz") else data)


@pytest.fixture(scope="module")
def annotated(contention_case: Path, contention_analysis, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("perfetto") / "annotated.json"
    report = out.with_suffix(".txt")
    status = main(
        ["-q", "analyze", str(contention_case), "-o", str(report), "--perfetto", str(out)]
    )
    assert status == 0
    return out


def test_is_chrome_trace_json(annotated: Path):
    document = json.loads(annotated.read_text())
    assert document["otherData"]["teller.schema"] == "teller.verdict/1"
    for event in document["traceEvents"]:
        assert event["ph"] in {"X", "M", "i", "s", "f", "C"}
        assert isinstance(event["pid"], int)
        if event["ph"] in {"X", "i", "s", "f", "C"}:
            assert isinstance(event["ts"], float) and event["ts"] >= 0
        if event["ph"] == "X":
            assert event["dur"] >= 0


def test_reads_back_every_rank_and_layer_on_one_clock(annotated: Path, contention_analysis):
    back = read(annotated).table
    original = contention_analysis.event_table.table
    for rank in contention_analysis.event_table.ranks:
        mine = back.filter(pc.equal(back.column("pid"), rank))
        theirs = original.filter(pc.equal(original.column("rank"), rank))
        for layer in ("engine", "python", "cpu_op", "runtime", "kernel", "comm", "memcpy"):
            a = mine.filter(pc.equal(mine.column("layer"), layer)).column("ts_ns").to_numpy()
            b = theirs.filter(pc.equal(theirs.column("layer"), layer)).column("ts_ns").to_numpy()
            assert len(a) == len(b) > 0, (rank, layer)
            # One clock: the same instants to within float-µs rounding, not shifted per rank.
            assert np.abs(np.sort(a) - np.sort(b)).max() < 1_000, (rank, layer)


def test_verdict_track_and_suspects(annotated: Path, contention_analysis):
    verdict = contention_analysis.diagnose()
    events = json.loads(annotated.read_text())["traceEvents"]
    names = {(e["pid"], e.get("args", {}).get("name")) for e in events if e["ph"] == "M"}
    assert (VERDICT_PID, "teller verdict") in names
    assert {(r, f"rank {r}") for r in verdict.ranks} <= names
    slices = [e for e in events if e["ph"] == "X" and e["pid"] == VERDICT_PID]
    assert sorted(e["name"] for e in slices) == sorted(
        f"anomalous step {f.step}" for f in verdict.findings
    )
    with_node = [f for f in verdict.findings if f.operator_node is not None]
    markers = [e for e in events if e["ph"] == "i" and e["cat"] == "teller"]
    assert len(markers) == len(with_node) > 0
    suspects = [e for e in events if e["ph"] == "X" and e.get("args", {}).get("teller.suspect")]
    assert {e["args"]["teller.step"] for e in suspects} <= {f.step for f in with_node}
    assert {e["name"] for e in suspects} == {f.operator for f in with_node}
    assert {e["pid"] for e in suspects} == {f.rank for f in with_node}
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    evidence_nodes = [
        {f.operator_node} - {None} | {c["node"] for c in f.candidates if c.get("node") is not None}
        for f in verdict.findings
    ]
    assert starts.keys() == ends.keys()
    assert len(starts) == sum(len(nodes) for nodes in evidence_nodes) > len(with_node)
    for flow, end in ends.items():
        assert starts[flow]["pid"] == VERDICT_PID and end["pid"] in verdict.ranks
        assert end["ts"] >= starts[flow]["ts"]  # the arrow goes forward in time


def test_every_track_nests_and_threads_stay_apart(annotated: Path, contention_analysis):
    """No host thread is merged onto another: the lab's tracks nest, one track per thread."""
    events = load(annotated)["traceEvents"]
    assert improperly_nested(events) == {}
    original = contention_analysis.event_table.table
    for rank in contention_analysis.event_table.ranks:
        mine = original.filter(pc.equal(original.column("rank"), rank))
        mine = mine.filter(
            pc.invert(pc.is_in(mine.column("layer"), pa.array(["instant", "counter"])))
        )
        host = mine.filter(pc.equal(mine.column("stream"), -1))
        host_tids = set(host.column("tid").to_pylist())
        exported = {e["tid"] for e in events if e["ph"] == "X" and e["pid"] == rank}
        streams = set(mine.column("stream").to_pylist()) - {-1}
        assert exported == host_tids | streams, rank


@pytest.fixture(scope="module")
def vllm_export(tmp_path_factory) -> tuple[Analysis, Path]:
    run = Analysis(real_trace(VLLM), method="localizer")
    out = tmp_path_factory.mktemp("perfetto-real") / "annotated.json.gz"
    write_perfetto(run.diagnose(), run.tree, out, run.event_table)
    return run, out


def test_the_verdict_is_reached_without_holding_the_event_table():
    """The analysis reads the run without raw arguments and drops the table once the tree is
    built; the export reads it again, arguments included, with the rows the tree points at."""
    run = Analysis(real_trace(VLLM), method="localizer")
    run.diagnose()
    assert "event_table" not in run.__dict__
    assert run.sources and run.inputs.ranks == [s.rank for s in run.sources]
    full = run.event_table.table
    assert full.column("args").null_count < full.num_rows
    assert np.array_equal(full.column("ts_ns").to_numpy()[run.tree.row], run.tree.start)


def test_real_trace_survives_event_for_event(vllm_export):
    """Every original event comes back: name, thread, time, duration and arguments."""
    run, out = vllm_export
    original, back = run.event_table.table, read(out).table
    back = back.filter(pc.invert(pc.equal(back.column("cat").cast(pa.string()), "teller")))
    assert back.num_rows == original.num_rows > 10_000

    def rows(table) -> Counter:
        columns = ["name", "layer", "tid", "stream", "ts_ns", "dur_ns", "correlation", "args"]
        data = table.select(columns).to_pylist()
        origin = min(table.column("ts_ns").to_pylist())
        return Counter(
            (
                r["name"],
                r["layer"],
                r["tid"],
                r["stream"],
                (r["ts_ns"] - origin) // 1000,
                r["dur_ns"] // 1000,
                r["correlation"],
                json.loads(r["args"]) if r["args"] else None,
            ).__repr__()
            for r in data
        )

    assert rows(back) == rows(original)


def test_real_trace_nesting_is_the_recordings_own(vllm_export):
    """The export nests exactly as the profiler's file does (which has a few overlaps of its own)."""
    _, out = vllm_export
    exported = improperly_nested(load(out)["traceEvents"])
    recorded = improperly_nested(load(real_trace(VLLM))["traceEvents"])
    assert sum(exported.values()) == sum(recorded.values())
    assert len(exported) <= len(recorded)


def test_gz_output_is_compressed(vllm_export):
    _, out = vllm_export
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    plain = gzip.decompress(out.read_bytes())
    assert len(out.read_bytes()) < len(plain) / 4


def test_verdict_flows_reach_their_evidence(annotated: Path):
    """Each flow leaves the verdict track and lands inside a slice on the evidence node's track."""
    events = load(annotated)["traceEvents"]
    verdict_slices = [e for e in events if e["ph"] == "X" and e["pid"] == VERDICT_PID]
    assert verdict_slices and all("evidence" in e["args"] for e in verdict_slices)
    ends = [e for e in events if e["ph"] == "f"]
    assert ends
    slices = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for end in ends:
        assert end["pid"] != VERDICT_PID
        assert any(s <= end["ts"] <= e for s, e in slices[(end["pid"], end["tid"])])


def test_nsys_capture_nests_with_syncs_on_their_own_track(tmp_path: Path):
    """A device-side sync spans the copies it waits for: beside its stream, not on it."""
    run = Analysis(real_trace("nsys_ai/fastvideo_h100_sp2_1s.sqlite"), method="localizer")
    out = tmp_path / "nsys.json.gz"
    write_perfetto(run.diagnose(), run.tree, out, run.event_table)
    events = load(out)["traceEvents"]
    assert improperly_nested(events) == {}
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "stream 7 sync" in names and "stream 7" in names
    original, back = run.event_table.table, read(out).table

    def per_layer(table) -> Counter:
        columns = zip(
            *(table.column(c).to_pylist() for c in ("layer", "stream", "device")), strict=True
        )
        return Counter(columns)

    assert per_layer(back) == per_layer(original)
