"""The Nsight Systems reader on real exports, checked against plain SQL over the same files.

Every expected number here comes from a query written out in the test, not from the reader, so a
reader that drops, duplicates or mislabels rows fails. Two real exports: FastVideo on 2×H100
(two processes, 16,782 NVTX operator ranges, 3,442 kernels) and a tiny one-process capture.
Where a real file lacks a feature (registered NVTX strings, NCCL kernels, a RANK variable), a
copy of a real export gets the missing rows in the export's own schema.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import real_trace
from teller.callchain.tree import EDGE_LAUNCH, build_tree
from teller.cli import main
from teller.errors import TraceError
from teller.ingest import nsys, read_trace
from teller.ingest.schema import LAYER_CODE

FASTVIDEO = "nsys_ai/fastvideo_h100_sp2_1s.sqlite"
TINY = "nsys_ai/mock_tiny_real_export.sqlite"
BOTH = [FASTVIDEO, TINY]
GPU_TABLES = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("kernel", "comm"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("memcpy",),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("memset",),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": ("sync",),
}
#: 2020-01-01 and 2040-01-01 in unix ns: a wall-clock timestamp outside this is a wrong anchor.
UNIX_2020_NS, UNIX_2040_NS = 1_577_836_800 * 10**9, 2_208_988_800 * 10**9


def sql(path: Path, query: str) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True) as con:
        return con.execute(query).fetchall()


def has_table(path: Path, table: str) -> bool:
    return bool(sql(path, f"SELECT 1 FROM sqlite_master WHERE name = '{table}'"))


def count(path: Path, table: str, where: str = "1") -> int:
    return (
        sql(path, f"SELECT count(*) FROM {table} WHERE {where}")[0][0]
        if has_table(path, table)
        else 0
    )


_cache: dict[str, object] = {}


def events_of(relative: str):
    """Each real export is read once per test session; the reader's output is not mutated."""
    path = real_trace(relative)
    if relative not in _cache:
        _cache[relative] = nsys.read(path)
    return path, _cache[relative]


def column(events, name: str) -> np.ndarray:
    return events.table.column(name).to_numpy(zero_copy_only=False)


def rows_from(events, table: str) -> np.ndarray:
    return column(events, "cat") == table


@pytest.mark.parametrize("relative", BOTH)
def test_rows_per_layer_equal_sql_counts(relative):
    path, events = events_of(relative)
    layers = column(events, "layer")
    for table, layer_names in GPU_TABLES.items():
        assert np.isin(layers[rows_from(events, table)], layer_names).all()
        assert int(rows_from(events, table).sum()) == count(path, table), table
    runtime = count(path, "CUPTI_ACTIVITY_KIND_RUNTIME")
    assert events.layer_counts().get("runtime", 0) == runtime > 0
    assert events.layer_counts().get("profiler", 0) == count(path, "CUPTI_ACTIVITY_KIND_OVERHEAD")
    # NVTX: PushPop (59) / StartEnd (60) ranges with an end, and marks (34)
    torch_ops = count(path, "NVTX_EVENTS", "eventType IN (59, 60) AND text LIKE '%, op_id = %'")
    ranges = count(path, "NVTX_EVENTS", 'eventType IN (59, 60) AND "end" >= start')
    marks = count(path, "NVTX_EVENTS", "eventType = 34")
    assert events.layer_counts().get("cpu_op", 0) == torch_ops
    assert events.layer_counts().get("engine", 0) == ranges - torch_ops
    assert events.layer_counts().get("instant", 0) == marks
    if relative == FASTVIDEO:  # the counts SOURCES.md states for this capture
        assert (torch_ops, runtime, count(path, "CUPTI_ACTIVITY_KIND_KERNEL")) == (
            16782,
            5796,
            3442,
        )


@pytest.mark.parametrize("relative", BOTH)
def test_runtime_names_lose_the_version_suffix(relative):
    path, events = events_of(relative)
    names = column(events, "name")[column(events, "layer") == "runtime"]
    assert not any(re.search(r"_v\d+$", n) for n in names)
    raw = sql(
        path,
        "SELECT s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId",
    )
    assert any(re.search(r"_v\d+$", v) for (v,) in raw)  # the suffix really is in the file
    assert Counter(names.tolist()) == Counter(re.sub(r"_v\d+$", "", v) for (v,) in raw)
    assert "cudaLaunchKernel" in names


@pytest.mark.parametrize("relative", BOTH)
def test_gpu_work_hangs_under_its_launching_runtime_call(relative):
    path, events = events_of(relative)
    tree = build_tree(events)
    parent = tree.parent
    launched = (parent >= 0) & (tree.edge == EDGE_LAUNCH)
    parent_layer = np.where(launched, tree.layer[np.maximum(parent, 0)], -1)
    for table, layer_names in GPU_TABLES.items():
        # CUPTI numbers correlations per process: join within the process, as nsys's own reports do
        joined = (
            sql(
                path,
                f"SELECT count(*) FROM {table} g JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                "ON r.correlationId = g.correlationId "
                "AND (r.globalTid & 0xFFFFFFFFFF000000) = g.globalPid",
            )[0][0]
            if has_table(path, table)
            else 0
        )
        codes = [LAYER_CODE[name] for name in layer_names]
        from_table = np.isin(tree.layer, codes)
        got = int((from_table & launched & (parent_layer == LAYER_CODE["runtime"])).sum())
        assert got == joined, table
    kernels = count(path, "CUPTI_ACTIVITY_KIND_KERNEL")
    assert 0 < int((np.isin(tree.layer, [LAYER_CODE["kernel"]]) & launched).sum()) <= kernels


def test_fastvideo_launch_names_match_sql():
    """The launching call of each kernel is the runtime row SQL joins it to, name for name."""
    path, events = events_of(FASTVIDEO)
    tree = build_tree(events)
    kernel = (tree.layer == LAYER_CODE["kernel"]) & (tree.parent >= 0)
    got = Counter(tree.names[tree.name[p]] for p in tree.parent[kernel].tolist())
    expected = Counter(
        re.sub(r"_v\d+$", "", v)
        for (v,) in sql(
            path,
            "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = k.correlationId "
            "AND (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid "
            "JOIN StringIds s ON s.id = r.nameId",
        )
    )
    assert got == expected
    assert set(got) == {"cudaLaunchKernel", "cudaLaunchKernelExC"}


def test_nvtx_text_and_torch_operator_ranges():
    path, events = events_of(FASTVIDEO)
    nvtx = rows_from(events, "NVTX_EVENTS")
    texts = [
        t
        for (t,) in sql(
            path,
            "SELECT COALESCE(n.text, s.value) FROM NVTX_EVENTS n "
            "LEFT JOIN StringIds s ON s.id = n.textId",
        )
    ]
    assert Counter(column(events, "name")[nvtx].tolist()) == Counter(
        t.split(", op_id = ")[0] for t in texts
    )
    args = column(events, "args")[nvtx]
    assert sorted(json.loads(a)["op_id"] for a in args) == sorted(
        int(t.split(", op_id = ")[1]) for t in texts
    )
    assert set(column(events, "layer")[nvtx]) == {"cpu_op"}


def test_nvtx_registered_strings_resolve_through_string_ids(tmp_path):
    """Registered NVTX strings (textId, no inline text): none of the real files has one."""
    path = tmp_path / "registered.sqlite"
    shutil.copy(real_trace(TINY), path)
    schema = sql(real_trace(FASTVIDEO), "SELECT sql FROM sqlite_master WHERE name = 'NVTX_EVENTS'")
    with sqlite3.connect(path) as con:
        con.execute(schema[0][0])
        con.execute("INSERT INTO StringIds (id, value) VALUES (900001, 'decode_step[bs=8]')")
        tid = con.execute("SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1").fetchone()[0]
        start, end = con.execute(
            'SELECT min(start), max("end") FROM CUPTI_ACTIVITY_KIND_RUNTIME'
        ).fetchone()
        con.executemany(
            'INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid, textId, domainId)'
            " VALUES (?, ?, ?, ?, ?, ?, 0)",
            [
                (start - 10, end + 10, 59, None, tid, 900001),  # registered push/pop range
                (start, None, 34, "checkpoint", tid, None),  # inline mark
                (start, None, 59, "never popped", tid, None),  # open range: counted, not read
            ],
        )
    events = nsys.read(path)
    nvtx = rows_from(events, "NVTX_EVENTS")
    assert sorted(
        zip(column(events, "layer")[nvtx], column(events, "name")[nvtx], strict=True)
    ) == [
        ("engine", "decode_step[bs=8]"),
        ("instant", "checkpoint"),
    ]
    assert any("no end" in reason for reason in events.sources[0].skipped)
    tree = build_tree(events)
    runtime_roots = [
        n for n in range(len(tree)) if tree.layer_name(n) == "runtime" and tree.parent[n] < 0
    ]
    assert runtime_roots == []  # every runtime call now nests inside the registered range


@pytest.mark.parametrize("relative", BOTH)
def test_timestamps_are_raw_plus_session_start(relative):
    path, events = events_of(relative)
    (anchor,) = sql(path, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0]
    source = events.sources[0]
    assert (source.clock, source.base_time_ns) == ("unix", anchor)
    ts = column(events, "ts_ns")
    assert ts.min() > UNIX_2020_NS and ts.max() < UNIX_2040_NS
    for table in [*GPU_TABLES, "CUPTI_ACTIVITY_KIND_RUNTIME"]:
        if not has_table(path, table):
            continue
        raw = sql(path, f'SELECT start, "end" - start FROM {table} ORDER BY start')
        mine = rows_from(events, table)
        order = np.argsort(ts[mine], kind="stable")
        assert (ts[mine][order] - anchor).tolist() == [start for start, _ in raw]
        assert sorted(column(events, "dur_ns")[mine].tolist()) == sorted(d for _, d in raw)


def test_without_a_session_anchor_rows_stay_on_the_session_clock(tmp_path):
    path = tmp_path / "no_anchor.sqlite"
    shutil.copy(real_trace(TINY), path)
    with sqlite3.connect(path) as con:
        con.execute("DROP TABLE TARGET_INFO_SESSION_START_TIME")
    events = nsys.read(path)
    assert events.sources[0].clock == "trace"
    assert any("utcEpochNs" in w for w in events.warnings)
    raw = sorted(s for (s,) in sql(path, "SELECT start FROM CUPTI_ACTIVITY_KIND_RUNTIME"))
    runtime = column(events, "layer") == "runtime"
    assert sorted(column(events, "ts_ns")[runtime].tolist()) == raw


def test_fastvideo_is_two_processes_two_ranks_two_devices():
    path, events = events_of(FASTVIDEO)
    assert events.ranks == [0, 1]
    assert [s.rank_source for s in events.sources] == ["process order", "process order"]
    process_device = dict(
        sql(
            path,
            "SELECT DISTINCT globalPid / 0x1000000 % 0x1000000, deviceId "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL",
        )
    )
    assert process_device == {111: 0, 112: 1}
    rank, device, pid = column(events, "rank"), column(events, "device"), column(events, "pid")
    on_gpu = device >= 0
    assert {(int(r), int(d)) for r, d in zip(rank[on_gpu], device[on_gpu], strict=True)} == {
        (0, 0),
        (1, 1),
    }
    assert set(pid[~on_gpu].tolist()) == {111, 112}  # CPU rows: pid from globalTid bits 24-47
    stream = column(events, "stream")
    assert (stream[~on_gpu] == -1).all() and (device[~on_gpu] == -1).all()
    tids = {
        (p, t)
        for p, t in sql(
            path,
            "SELECT DISTINCT globalTid / 0x1000000 % 0x1000000, globalTid % 0x1000000 "
            "FROM CUPTI_ACTIVITY_KIND_RUNTIME",
        )
    }
    runtime = column(events, "layer") == "runtime"
    assert (
        set(zip(pid[runtime].tolist(), column(events, "tid")[runtime].tolist(), strict=True))
        == tids
    )


def test_memcpy_names_and_bytes():
    path, events = events_of(FASTVIDEO)
    memcpy = column(events, "layer") == "memcpy"
    expected = Counter(
        {
            f"Memcpy {kind} ({src} -> {dst})": n
            for kind, src, dst, n in sql(
                path,
                "SELECT replace(replace(o.name, 'CUDA_MEMCPY_KIND_', ''), 'TO', 'to'), "
                "s.label, d.label, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m "
                "JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind "
                "JOIN ENUM_CUDA_MEM_KIND s ON s.id = m.srcKind "
                "JOIN ENUM_CUDA_MEM_KIND d ON d.id = m.dstKind GROUP BY 1, 2, 3",
            )
        }
    )
    assert Counter(column(events, "name")[memcpy].tolist()) == expected
    assert "Memcpy HtoD (Pinned -> Device)" in expected
    (total,) = sql(path, "SELECT sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY")[0]
    assert int(column(events, "bytes")[memcpy].sum()) == total


def test_single_process_rank_from_environment_and_file_name(tmp_path):
    named = tmp_path / "capture_rank5.sqlite"
    shutil.copy(real_trace(TINY), named)
    events = nsys.read(named)
    assert (events.ranks, events.sources[0].rank_source) == ([5], "file name")
    with sqlite3.connect(named) as con:
        con.execute(
            "INSERT INTO META_DATA_CAPTURE (name, value) "
            "VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', 'RANK=\"3\"')"
        )
    events = nsys.read(named)
    assert (events.ranks, events.sources[0].rank_source) == ([3], "environment RANK")
    assert nsys.read(named, rank=7).ranks == [7]


def test_nccl_kernels_become_comm_rows(tmp_path):
    """No real export here has NCCL kernels; give one real kernel a real NCCL kernel name."""
    path = tmp_path / "nccl.sqlite"
    shutil.copy(real_trace(TINY), path)
    name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    with sqlite3.connect(path) as con:
        con.execute("INSERT INTO StringIds (id, value) VALUES (900002, ?)", (name,))
        con.execute(
            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 900002 "
            "WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)"
        )
    events = nsys.read(path)
    comm = column(events, "layer") == "comm"
    assert column(events, "name")[comm].tolist() == [name]
    assert column(events, "coll_name")[comm].tolist() == ["allreduce"]
    assert events.layer_counts()["kernel"] == 1


def test_read_trace_dispatches_sqlite_to_this_reader():
    path = real_trace(TINY)
    events = read_trace(path)
    assert {s.format for s in events.sources} == {"nsys"}
    assert len(events) == len(events_of(TINY)[1])


def test_reading_never_writes_to_the_input():
    path = real_trace(TINY)
    before = hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns
    nsys.read(path)
    assert (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns) == before
    assert not path.with_name(path.name + "-journal").exists()


def test_bad_files_raise_trace_error_naming_the_file(tmp_path):
    text = tmp_path / "notes.sqlite"
    text.write_text("this is a text file, not a database\n")
    with pytest.raises(TraceError, match=r"notes\.sqlite.*not an SQLite database"):
        nsys.read(text)
    with pytest.raises(TraceError, match=r"notes\.sqlite"):
        read_trace(text)

    zero_bytes = tmp_path / "zero.sqlite"
    sqlite3.connect(zero_bytes).close()  # SQLite creates the file but writes nothing
    with pytest.raises(TraceError, match=r"zero\.sqlite: empty file"):
        nsys.read(zero_bytes)

    empty = tmp_path / "empty.sqlite"
    with sqlite3.connect(empty) as con:
        con.execute("PRAGMA user_version = 1")  # a valid database with no tables at all
    with pytest.raises(
        TraceError, match=r"empty\.sqlite.*without Nsight Systems tables \(tables: none\)"
    ):
        nsys.read(empty)

    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    with pytest.raises(TraceError, match=r"other\.sqlite.*without Nsight Systems tables.*users"):
        nsys.read(other)
    with pytest.raises(TraceError, match=r"other\.sqlite"):
        read_trace(other)

    truncated = tmp_path / "truncated.sqlite"
    truncated.write_bytes(real_trace(FASTVIDEO).read_bytes()[:65536])
    with pytest.raises(TraceError, match=r"truncated\.sqlite"):
        nsys.read(truncated)

    damaged = bytearray(real_trace(FASTVIDEO).read_bytes())
    middle = len(damaged) // 2
    damaged[middle : middle + 8192] = b"\xff" * 8192  # two pages of a table overwritten
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(bytes(damaged))
    with pytest.raises(TraceError, match=r"corrupt\.sqlite: table \w+: corrupt SQLite database"):
        nsys.read(corrupt)

    with pytest.raises(TraceError, match="no such file"):
        nsys.read(tmp_path / "missing.sqlite")


def test_export_without_events_is_an_error(tmp_path):
    path = tmp_path / "no_events.sqlite"
    shutil.copy(real_trace(TINY), path)
    with sqlite3.connect(path) as con:
        (runtime_schema,) = con.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_RUNTIME'"
        ).fetchone()
        for table in nsys.READ_TABLES:
            con.execute(f"DROP TABLE IF EXISTS {table}")
        con.execute(runtime_schema)  # the table is there, with no rows
    with pytest.raises(TraceError, match="no CUDA or NVTX events"):
        nsys.read(path)


def test_cli_info_and_tree_on_fastvideo(capsys):
    path = str(real_trace(FASTVIDEO))
    assert main(["-q", "info", path]) == 0
    out = capsys.readouterr().out
    assert "format nsys, rank 0" in out and "ranks [0, 1]" in out
    assert main(["-q", "tree", path, "--rank", "1", "--depth", "3"]) == 0
    out = capsys.readouterr().out
    assert "cudaLaunchKernel" in out and "[cpu_op]" in out
