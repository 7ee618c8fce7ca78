"""The event-table cache: a trace read once is read from Parquet while it is unchanged, with
the same table and the same reading warnings; a changed file, a changed setting or a broken
cache entry falls back to the file itself. And what `teller ingest` writes reads back as the
trace it came from."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import teller.ingest
from conftest import real_trace
from teller.cli import main
from teller.errors import TraceError
from teller.ingest import find_trace_files, read_run, read_trace
from teller.ingest.cache import CACHE_DIR_ENV, CACHE_MAX_ENV

#: A real trace whose reading warns (events skipped, the profiler's own clock).
TRACE = "hta/large_integer_comms_id.pt.trace.json.gz"
#: A larger one (216k events): where the cache matters.
LARGE = "hta/df_index_resolver_rank1_of2_216k_events.json.gz"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(directory))
    return directory


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file the format readers parse (the cache's misses)."""
    seen: list[Path] = []
    real = teller.ingest._read_source

    def counting(path: Path):
        seen.append(path)
        return real(path)

    monkeypatch.setattr(teller.ingest, "_read_source", counting)
    return seen


def _copy(relative: str, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(real_trace(relative), where))


def test_a_second_read_comes_from_the_cache_with_the_same_table(
    cache: Path, parsed: list[Path]
) -> None:
    path = real_trace(LARGE)
    first = read_trace(path)
    second = read_trace(path)
    assert parsed == [path]
    assert second.table.equals(first.table)
    assert second.table.schema.equals(first.table.schema)
    assert [c.num_chunks for c in second.table.columns] == [1] * second.table.num_columns
    assert second.sources == first.sources
    assert len(list(cache.glob("*.parquet"))) == 1


def test_the_analysis_read_leaves_out_the_raw_arguments_alone(
    cache: Path, parsed: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`args=False` (what `Analysis` reads) is the full table with `args` all null, parsed or
    from the cache; the cache keeps the arguments for a later read that wants them."""
    path = real_trace(LARGE)
    full = read_trace(path)
    assert full.table.column("args").null_count < full.table.num_rows
    for slim in (read_trace(path, args=False), read_run([path], args=False)):
        assert slim.table.schema.equals(full.table.schema)
        assert slim.table.column("args").null_count == slim.table.num_rows
        assert slim.table.drop_columns(["args"]).equals(full.table.drop_columns(["args"]))
        assert slim.sources == full.sources
    assert read_trace(path).table.equals(full.table)
    assert parsed == [path]
    monkeypatch.setenv(CACHE_DIR_ENV, "off")
    parsed_slim = read_trace(path, args=False)
    assert parsed_slim.table.drop_columns(["args"]).equals(full.table.drop_columns(["args"]))


def test_reading_warnings_survive_the_cache(cache: Path) -> None:
    fresh = read_trace(real_trace(TRACE)).warnings
    assert fresh
    assert read_trace(real_trace(TRACE)).warnings == fresh


def test_a_changed_file_is_read_again(cache: Path, parsed: list[Path], tmp_path: Path) -> None:
    path = _copy(TRACE, tmp_path / "run")
    read_trace(path)
    other = real_trace("hta/gpu_user_annotation_steps.json.gz")
    path.write_bytes(other.read_bytes())
    changed = read_trace(path)
    assert parsed == [path, path]
    assert changed.table.equals(teller.ingest._read_source(other).table)


def test_off_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parsed: list[Path]
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    read_trace(real_trace(TRACE))
    read_trace(real_trace(TRACE))
    assert len(parsed) == 2
    assert not (tmp_path / "xdg").exists()


def test_the_default_directory_is_under_xdg_cache_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    read_trace(real_trace(TRACE))
    assert len(list((tmp_path / "xdg" / "teller" / "events").glob("*.parquet"))) == 1


def test_a_corrupt_entry_is_replaced_by_a_fresh_read(cache: Path, parsed: list[Path]) -> None:
    path = real_trace(TRACE)
    expected = read_trace(path)
    [entry] = cache.glob("*.parquet")
    entry.write_bytes(b"PAR1 not really")
    again = read_trace(path)
    assert again.table.equals(expected.table)
    assert len(parsed) == 2
    assert read_trace(path).table.equals(expected.table) and len(parsed) == 2


def test_an_unwritable_cache_leaves_the_read_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocked / "cache"))
    assert len(read_trace(real_trace(TRACE))) > 0


def test_the_directory_is_trimmed_least_recently_used_first(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first, second = _copy(TRACE, tmp_path / "a"), _copy(TRACE, tmp_path / "b")
    read_trace(first)
    [older] = cache.glob("*.parquet")
    os.utime(older, ns=(1, 1))
    monkeypatch.setenv(CACHE_MAX_ENV, str(older.stat().st_size / 1e6 * 1.5))
    read_trace(second)
    left = list(cache.glob("*.parquet"))
    assert older not in left and len(left) == 1


def test_pool_workers_share_the_cache(cache: Path) -> None:
    paths = [
        real_trace("hta/sampled_rank0_of128.json.gz"),
        real_trace("hta/sampled_rank1_of128.json.gz"),
    ]
    first = read_run(paths, jobs=2)
    assert len(list(cache.glob("*.parquet"))) == 2
    assert read_run(paths, jobs=2).table.equals(first.table)


def test_what_ingest_writes_is_analysed_as_the_trace_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    trace = real_trace("hta/gpu_user_annotation_steps.json.gz")
    tables = tmp_path / "tables"
    assert main(["-q", "ingest", str(trace), "-o", str(tables)]) == 0
    capsys.readouterr()
    assert [p.suffix for p in find_trace_files([tables])] == [".parquet"]
    verdicts = []
    for source in (trace, tables):
        assert (
            main(["-q", "analyze", str(source), "--format", "json", "--method", "localizer"]) == 0
        )
        verdict = json.loads(capsys.readouterr().out)
        verdict.pop("inputs")
        verdicts.append(verdict)
    assert verdicts[0] == verdicts[1]


def test_tables_written_beside_their_traces_are_not_read_twice(tmp_path: Path) -> None:
    trace = _copy("hta/gpu_user_annotation_steps.json.gz", tmp_path / "run")
    assert main(["-q", "ingest", str(trace), "-o", str(tmp_path / "run" / "tables")]) == 0
    assert find_trace_files([tmp_path / "run"]) == [trace]


def test_a_parquet_file_that_is_not_an_event_table_is_refused_by_name(tmp_path: Path) -> None:
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), other)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    assert find_trace_files([tmp_path]) == []
    for path in (other, garbage):
        with pytest.raises(TraceError) as error:
            read_trace(path)
        assert path.name in str(error.value) and "teller ingest" in str(error.value)
