"""`--jobs`: rank files read in worker processes give the run, and the verdict, read in one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from builders import simulated_straggler
from teller.cli import main
from teller.ingest import read_run
from teller.ingest.worker import _malloc_trim, release_freed_heap
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


def _resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(
    not Path("/proc/self/statm").is_file() or _malloc_trim() is None,
    reason="needs Linux's /proc and glibc's malloc_trim",
)
def test_a_worker_gives_back_the_heap_a_file_freed() -> None:
    """What a finished file's reading freed is not kept mapped by the idle worker."""
    import numpy as np

    blocks = [np.ones(8192) for _ in range(2000)]  # 64 kB each: heap, not mmap
    pinned = np.ones(8192)  # above them, so the heap's top cannot simply shrink
    held = _resident_bytes()
    del blocks
    release_freed_heap()
    assert _resident_bytes() < held - (80 << 20)
    assert pinned.sum() == 8192
