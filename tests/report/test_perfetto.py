"""`teller analyze CASE --perfetto OUT.json`: a Chrome trace that teller's own Kineto reader reads
back event for event (every rank, every layer, on the run's clock), with the verdict on top."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from teller.cli import main
from teller.ingest.kineto import read
from teller.report.perfetto import VERDICT_PID


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
        assert event["ph"] in {"X", "M", "i", "s", "f"}
        assert isinstance(event["pid"], int)
        if event["ph"] in {"X", "i", "s", "f"}:
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
    markers = [e for e in events if e["ph"] == "i"]
    assert len(markers) == len(with_node) > 0
    suspects = [e for e in events if e["ph"] == "X" and e.get("args", {}).get("teller.suspect")]
    assert {e["args"]["teller.step"] for e in suspects} <= {f.step for f in with_node}
    assert {e["name"] for e in suspects} == {f.operator for f in with_node}
    assert {e["pid"] for e in suspects} == {f.rank for f in with_node}
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and len(starts) == len(with_node)
    for flow, end in ends.items():
        assert starts[flow]["pid"] == VERDICT_PID and end["pid"] in verdict.ranks
        assert end["ts"] >= starts[flow]["ts"]  # the arrow goes forward in time
