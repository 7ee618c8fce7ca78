"""The per-rank map: each file built into its forest where it is read, the forests joined,
gives the tree one table of the whole run gives, and the same reading warnings."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from builders import simulated_straggler
from conftest import real_trace
from teller.callchain.per_rank import read_tree
from teller.callchain.tree import CallTree, build_tree
from teller.ingest import read_run
from teller.lab.sim import Topology


def _same_tree(joined: CallTree, whole: CallTree) -> None:
    for part, other in ((joined, whole), (joined.steps, whole.steps), (joined.comm, whole.comm)):
        for field in fields(part):
            mine, theirs = getattr(part, field.name), getattr(other, field.name)
            if isinstance(mine, np.ndarray):
                assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), field.name
            elif field.name not in ("steps", "comm"):
                assert mine == theirs, field.name


@pytest.fixture(scope="module")
def eight_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two TP2 x PP2 replicas: two engines, send/recv and all-reduces between the files."""
    case = tmp_path_factory.mktemp("per-rank") / "straggler"
    return simulated_straggler(case, Topology(4, 2, 2, 2), steps=10, rank=5, window=(3, 6))


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_joined_forests_are_the_whole_runs_tree(eight_ranks: Path, jobs: int) -> None:
    run = read_tree([eight_ranks], jobs=jobs)
    whole = read_run([eight_ranks])
    _same_tree(run.tree, build_tree(whole))
    assert run.sources == whole.sources and len(run.sources) == 8


def test_real_rank_files_join_as_one_table_reads_them() -> None:
    """Two sampled ranks of a 128-rank job (names unified across files, collectives joined),
    and two captures of one rank taken minutes apart (warned on as read_run warns)."""
    sampled = [real_trace(f"hta/sampled_rank{r}_of128.json.gz") for r in (0, 1)]
    captures = real_trace("tracelens/vllm_prefilldecode_piecewise")
    for paths in (sampled, [captures]):
        run = read_tree(paths, jobs=1)
        whole = read_run(paths)
        _same_tree(run.tree, build_tree(whole))
        assert run.sources == whole.sources
        assert len(run.tree.comm) or paths != sampled
    assert any("begins" in w for s in read_tree([captures]).sources for w in s.warnings)


def test_a_refused_rank_file_is_named_and_the_others_are_joined(tmp_path: Path) -> None:
    good = real_trace("hta/sampled_rank0_of128.json.gz")
    bad = tmp_path / "rank1.json"
    bad.write_text('{"traceEvents": [')
    run = read_tree([good, bad])
    assert len(run.sources) == 1
    assert any("rank file left out" in w and "rank1.json" in w for w in run.sources[0].warnings)
