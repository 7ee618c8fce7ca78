"""A file's forest kept on disk between a run's two passes (`teller.callchain.kept_forest`): what
is loaded back is what the file's own reading built, and a run read that way parses each file
once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import teller.callchain.per_rank as per_rank
from conftest import real_trace
from teller.analysis import Analysis
from teller.callchain.kept_forest import NODE_COLUMNS, keep_forest, load_forest
from teller.callchain.per_rank import file_forest

SAMPLED = ("hta/sampled_rank0_of128.json.gz", "hta/sampled_rank1_of128.json.gz")


def test_a_kept_forest_loads_back_as_it_was_built(tmp_path: Path) -> None:
    built = file_forest(real_trace(SAMPLED[0]))
    loaded = load_forest(keep_forest(built, tmp_path))
    for column in NODE_COLUMNS:
        ours, theirs = getattr(loaded.forest, column), getattr(built.forest, column)
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs), column
    assert loaded.forest.names == built.forest.names
    assert len(built.forest.comm.node) > 0  # the file's collectives travel too
    for field in ("node", "seq", "bytes"):
        assert np.array_equal(getattr(loaded.forest.comm, field), getattr(built.forest.comm, field))
    assert loaded.forest.comm.kind == built.forest.comm.kind
    assert loaded.forest.comm.group == built.forest.comm.group
    for field in ("table_rows", "overlaps", "unlaunched"):
        assert getattr(loaded.forest, field) == getattr(built.forest, field)
    assert loaded.sources == built.sources
    assert loaded.path == built.path
    assert loaded.traced_pids == built.traced_pids and loaded.span == built.span


def _no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path):
        raise AssertionError(f"{path} parsed a second time")

    monkeypatch.setattr(per_rank, "file_forest", refuse)


def test_a_run_of_one_engine_is_built_from_the_forests_its_first_pass_kept(monkeypatch) -> None:
    paths = [real_trace(p) for p in SAMPLED]
    run = Analysis(paths, method="localizer")
    assert run.split is None  # one job's ranks: held whole
    kept_dir = Path(run._kept_dir.name)
    assert len(run.kept_forests) == 2
    _no_parsing(monkeypatch)
    verdict = run.diagnose()
    assert not kept_dir.exists()  # let go once the tree is built
    monkeypatch.undo()
    assert verdict == Analysis(paths, method="localizer", by_engine=False).diagnose()


def test_a_file_refused_on_the_first_pass_is_left_out_of_the_run(tmp_path: Path) -> None:
    bad = tmp_path / "rank9.pt.trace.json"
    bad.write_text('{"traceEvents": [')
    run = Analysis([*(real_trace(p) for p in SAMPLED), bad], method="localizer")
    verdict = run.diagnose()
    assert run.split is None and {s.rank for s in run.sources} == {0, 1}
    assert any("rank file left out: " + str(bad) in w for w in verdict.warnings)
