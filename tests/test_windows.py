"""A run read in time windows (`teller.callchain.windows`, `Analysis(window_events=N)`): the same
steps with the same ids as the whole run's analysis, each reported once, a planted fault found,
on a simulated run and on real recorded traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import real_trace
from teller.analysis import Analysis
from teller.cli import main
from teller.rca.verdict import Verdict

RESOLVER = "hta/df_index_resolver_rank1_of2_216k_events.json.gz"
FAULT_STEPS = range(600, 630)


@pytest.fixture(scope="module")
def tp2_case(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated TP2 engine of 1,200 steps (several seconds, so that a window's margins do not
    reach across the run), rank 1's GPU throttled over steps 600-629."""
    from teller.lab.sim import FaultSpec, SimConfig, simulate
    from teller.lab.sim.topology import Topology

    case = tmp_path_factory.mktemp("windows") / "case"
    fault = FaultSpec("gpu_throttle", rank=1, intensity=1.0, window=(600, 630))
    config = SimConfig(
        Topology(1, 2, 2, 1), steps=1200, layers=2, python_frames=False, fault=fault, seed=5
    )
    simulate(config, case)
    return case


@pytest.fixture(scope="module")
def whole_and_windowed(tp2_case: Path) -> tuple[Analysis, Analysis]:
    whole = Analysis(tp2_case, method="localizer")
    windowed = Analysis(tp2_case, method="localizer", window_events=150_000, jobs=2)
    whole.diagnose(), windowed.diagnose()
    return whole, windowed


def _step_facts(analysis: Analysis) -> list[tuple]:
    return sorted((r.rank, r.step, r.name, r.kind, r.dur_ns) for r in analysis.verdict.steps)


def _largest_start_move(a: Analysis, b: Analysis) -> int:
    """How far apart the two analyses put a step's start, at most (each window puts its ranks
    on one clock from its own collectives, which may move a rank by a few ns)."""
    start_of = {(r.rank, r.step): r.start_ns for r in a.verdict.steps}
    return max(abs(start_of[(r.rank, r.step)] - r.start_ns) for r in b.verdict.steps)


def test_windows_keep_the_whole_runs_steps_and_ids(whole_and_windowed) -> None:
    whole, windowed = whole_and_windowed
    assert windowed.windowed and not whole.windowed
    assert len(windowed._ledger.passes) >= 3  # the run was really cut
    assert max(first[0] for first in windowed._ledger.first_of_rank) > 0  # a window reads part
    assert "tree" not in vars(windowed)  # and its whole tree never built
    # every step once, with the id, name and times the whole run gives it
    assert _step_facts(windowed) == _step_facts(whole)
    assert _largest_start_move(windowed, whole) < 1000
    rows = windowed.breakdown().rows
    assert rows is not None
    keys = [(row["rank"], row["step"]) for row in rows]
    assert len(keys) == len(set(keys)) == len(whole.breakdown().steps)


def test_windows_find_the_planted_fault_as_the_whole_run_does(whole_and_windowed) -> None:
    whole, windowed = whole_and_windowed
    found = {f.step for f in windowed.verdict.findings}
    planted = set(FAULT_STEPS)
    assert len(found & planted) >= 0.8 * len(planted)
    assert {f.rank for f in windowed.verdict.findings if f.step in planted} == {1}
    # a window compares a step with fewer others than the whole run: a few more of the
    # simulator's host stalls (steps 2-3x their expected time) stand out, and no more
    steps = len({r.step for r in whole.verdict.steps})
    assert len(found - planted) <= 0.01 * steps
    assert {f.step for f in whole.verdict.findings} <= found
    assert windowed.verdict.warnings[0].startswith("read in ")


def test_a_windowed_run_says_how_its_time_went_over_its_owned_steps(whole_and_windowed) -> None:
    whole, windowed = whole_and_windowed
    for summed, measured in zip(windowed.breakdown().runs, whole.breakdown().runs, strict=True):
        assert summed.rank == measured.rank
        # the sum of the steps, which the whole run's span holds with the time between them
        assert summed.span_ns <= measured.span_ns
        assert summed.busy.busy_ns == pytest.approx(measured.busy.busy_ns, rel=0.05)


def test_a_real_trace_read_in_windows_gets_the_whole_reads_verdict() -> None:
    path = real_trace(RESOLVER)
    whole = Analysis(path, method="localizer")
    windowed = Analysis(path, method="localizer", window_events=50_000)
    assert len(windowed.verdict.steps) == len(whole.verdict.steps)
    assert _step_facts(windowed) == _step_facts(whole)
    assert _largest_start_move(windowed, whole) == 0  # one rank: nothing to put on one clock
    assert windowed.verdict.summary == whole.verdict.summary
    assert len(windowed._ledger.passes) >= 3


def test_windows_only_read_kineto_json(capsys) -> None:
    sqlite = real_trace("nsys_ai/healthy_1pct.sqlite")
    code = main(["-q", "analyze", str(sqlite), "--method", "localizer", "--window-events", "1000"])
    assert code == 2
    err = capsys.readouterr().err
    assert str(sqlite) in err and "time windows" in err
    assert Analysis(sqlite, method="localizer").windowed is False  # never on its own


def test_a_windowed_runs_json_verdict_keeps_its_schema(tp2_case: Path, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "verdict.json"
    argv = ["-q", "analyze", str(tp2_case), "--method", "localizer", "--window-events", "150000"]
    assert main([*argv, "--format", "json", "-o", str(out)]) == 0
    schema_path = Path(__file__).resolve().parents[1] / "src/teller/report/verdict.schema.json"
    verdict = json.loads(out.read_text())
    jsonschema.validate(verdict, json.loads(schema_path.read_text()))
    rows = verdict["breakdown"]["steps"]
    assert len({(r["rank"], r["step"]) for r in rows}) == len(rows) == 2 * 1200
    assert main([*argv, "--perfetto", str(tmp_path / "p.json.gz")]) == 2  # every event: refused


def test_window_warnings_that_differ_in_their_count_are_said_once() -> None:
    from teller.rca.merge import EngineOutcome, _engine_warnings

    def said(index: int, *warnings: str) -> EngineOutcome:
        verdict = Verdict(
            inputs=[],
            ranks=[],
            method="localizer",
            summary="",
            findings=[],
            steps=[],
            warnings=list(warnings),
        )
        return EngineOutcome(verdict, None, 0, index)  # type: ignore[arg-type]

    outcomes = [
        said(0, "no collectives in the trace"),
        said(1, "no collectives in the trace", "196 GPU activities have no launch"),
        said(2, "no collectives in the trace", "3 GPU activities have no launch", "cut here"),
    ]
    assert _engine_warnings(outcomes, "window") == [
        "no collectives in the trace",
        "no collectives in the trace",
        "no collectives in the trace",
        "window 2: cut here",
        "windows 1 and 2: 199 GPU activities have no launch",
    ]
