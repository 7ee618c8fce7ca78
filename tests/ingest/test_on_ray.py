"""`--engine ray`: rank files read as Ray tasks give the run, and the verdict, read here.

Each test starts a private Ray on this machine (2 CPUs, bound to 127.0.0.1) and stops it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from builders import simulated_straggler, two_tp2_replicas
from conftest import real_trace
from teller.cli import main
from teller.errors import TellerError
from teller.ingest import read_run
from teller.lab.sim import Topology

pytest.importorskip("ray", reason="Ray is not installed: pip install 'teller-rca[ray]'")
pytestmark = pytest.mark.slow  # a Ray start takes seconds


@pytest.fixture(scope="module")
def sixteen_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TP8 x PP2 straggler case over two simulated nodes."""
    case = tmp_path_factory.mktemp("on-ray") / "straggler"
    return simulated_straggler(case, Topology(2, 8, 8, 2), steps=12, rank=5, window=(4, 8))


def test_real_rank_files_read_as_ray_tasks_are_the_run_read_here() -> None:
    files = [real_trace(f"hta/sampled_rank{r}_of128.json.gz") for r in (0, 1)]
    here, on_ray = read_run(files, jobs=1), read_run(files, jobs=2, engine="ray")
    assert on_ray.table.equals(here.table)
    assert [s.path for s in on_ray.sources] == [s.path for s in here.sources]
    assert len(here.ranks) == 2


def test_ray_and_both_pools_give_the_same_verdict_on_16_ranks(
    sixteen_ranks: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    verdicts = []
    argv = ["-q", "analyze", str(sixteen_ranks), "--format", "json", "--method", "localizer"]
    for engine in (["--jobs", "1"], ["--jobs", "2"], ["--engine", "ray", "--jobs", "2"]):
        assert main([*argv, *engine]) == 0
        verdicts.append(capsys.readouterr().out)
    assert verdicts[0] == verdicts[1] == verdicts[2]


def test_a_run_of_two_engines_on_ray_is_cut_by_engine_to_the_same_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first pass's Ray tasks keep their forests where the analysing process reads them."""
    case = two_tp2_replicas(tmp_path / "case")
    verdicts = []
    argv = ["-q", "analyze", str(case), "--format", "json", "--method", "localizer"]
    for engine in (["--jobs", "1"], ["--engine", "ray", "--jobs", "2"]):
        assert main([*argv, *engine]) == 0
        verdicts.append(capsys.readouterr().out)
    assert '"2 engines in one run' in verdicts[0]
    assert verdicts[0] == verdicts[1]


def test_without_ray_the_error_says_how_to_install_it(
    sixteen_ranks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(TellerError, match=r"pip install 'teller-rca\[ray\]'"):
        read_run([sixteen_ranks], engine="ray")


def test_a_ray_address_needs_the_ray_engine(
    sixteen_ranks: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["-q", "analyze", str(sixteen_ranks), "--ray-address", "auto"]) != 0
    assert "--engine ray" in capsys.readouterr().err
