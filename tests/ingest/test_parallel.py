"""`--jobs`: rank files read in worker processes give the run, and the verdict, read in one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders import simulated_straggler
from teller.cli import main
from teller.ingest import read_run
from teller.lab.sim import Topology


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TP4 straggler case, small enough for seconds."""
    case = tmp_path_factory.mktemp("parallel") / "straggler"
    return simulated_straggler(case, Topology(1, 4, 4, 1), steps=40, rank=2, window=(15, 22))


def test_two_workers_read_the_same_run(four_ranks: Path) -> None:
    alone, pooled = read_run([four_ranks], jobs=1), read_run([four_ranks], jobs=2)
    assert pooled.table.equals(alone.table)
    assert [s.path for s in pooled.sources] == [s.path for s in alone.sources]
    assert len(alone.ranks) == 4


def test_a_refused_rank_file_is_named_from_a_worker(four_ranks: Path, tmp_path: Path) -> None:
    broken = tmp_path / "rank9.pt.trace.json"
    broken.write_text('{"traceEvents": [{"ph": "X", "name": ')
    files = [*sorted((four_ranks / "traces").iterdir()), broken]
    run = read_run(files, jobs=2)
    assert len(run.ranks) == 4
    assert any("rank file left out" in w and "rank9" in w for w in run.warnings)


def test_jobs_1_and_2_give_the_same_verdict(
    four_ranks: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    verdicts = []
    for jobs in ("1", "2"):
        argv = ["-q", "analyze", str(four_ranks), "--format", "json", "--method", "localizer"]
        assert main([*argv, "--jobs", jobs]) == 0
        verdicts.append(capsys.readouterr().out)
    assert verdicts[0] == verdicts[1]
    assert json.loads(verdicts[0])["findings"], "the straggler's steps are found at all"


def test_jobs_below_one_is_refused(four_ranks: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-q", "analyze", str(four_ranks), "--jobs", "0"]) != 0
    assert "--jobs 0" in capsys.readouterr().err
