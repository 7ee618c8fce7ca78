"""The Kineto reader on every real trace we have, each quirk shown on the file that has it.

Expected numbers are computed independently in the test with the standard library's json parser,
never copied from the reader's output.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from conftest import real_trace
from teller.callchain.tree import EDGE_LAUNCH, build_tree
from teller.errors import TraceError
from teller.ingest import find_trace_files, kineto, read_trace
from teller.ingest.schema import LAYER_CODE, read_parquet, write_parquet

KINETO_FILES = [
    "hta/amd_mi250_rocm62.json.gz",
    "hta/critical_path_alexnet.json.gz",
    "hta/cuda_event_sync.json.gz",
    "hta/cuda_event_sync_multi_stream.json.gz",
    "hta/cupti_profiler_counters.json.gz",
    "hta/df_index_resolver_rank1_of2_216k_events.json.gz",
    "hta/gpu_user_annotation_steps.json.gz",
    "hta/large_integer_comms_id.pt.trace.json.gz",
    "hta/legacy_inference_rank1_oldcats.json.gz",
    "hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz",
    "hta/queue_len_rank0_of16.json.gz",
    "hta/sampled_rank0_of128.json.gz",
    "hta/sampled_rank1_of128.json.gz",
    "hta/simple_add_kineto_pair.json.gz",
    "tracelens/hf_qwen1.5-0.5b_h100.json.gz",
    "tracelens/sglang_Qwen3-8B_prefilldecode.json.gz",
    "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz",
    "tracelens/vllm_prefilldecode_piecewise/graph_capture_rank_0.1773709679453551615.pt.trace.json.gz",
]
GPU_ACTIVITY_CATS = {
    "kernel",
    "Kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_sync",
    "cuda_profiler_range",
}
RUNTIME_CATS = {"cuda_runtime", "Runtime", "cuda_driver"}


def raw_events(path: Path) -> list[dict]:
    document = json.loads(gzip.decompress(path.read_bytes()))
    return document if isinstance(document, list) else document["traceEvents"]


def write_gz(path: Path, document: object) -> Path:
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return path


@pytest.mark.parametrize("relative", KINETO_FILES)
def test_every_real_file_reads_with_independent_counts(relative: str) -> None:
    path = real_trace(relative)
    events = raw_events(path)
    placed = [e for e in events if e.get("ph") in ("X", "i", "I", "C")]
    expected_by_category = Counter(e.get("cat") or e["ph"] for e in placed)

    table = read_trace(path)

    assert len(table) == len(placed)
    source = table.sources[0]
    for category, count in expected_by_category.items():
        assert source.events_by_category[category] == count, category
    # nothing vanished: every event is a row, a consumed flow/metadata event, or counted as skipped
    consumed = sum(1 for e in events if e.get("ph") in ("s", "f", "t", "M"))
    assert len(table) + consumed == len(events)


@pytest.mark.parametrize("relative", KINETO_FILES)
def test_kernels_hang_under_their_launching_call(relative: str) -> None:
    path = real_trace(relative)
    events = raw_events(path)
    runtime_ids = {
        (e.get("args") or {}).get("correlation")
        for e in events
        if e.get("cat") in RUNTIME_CATS and e.get("ph") == "X"
    }
    runtime_ids.discard(None)
    expected = sum(
        1
        for e in events
        if e.get("cat") in GPU_ACTIVITY_CATS
        and e.get("ph") == "X"
        and (e.get("args") or {}).get("correlation") in runtime_ids
    )

    tree = build_tree(read_trace(path))

    gpu_codes = [LAYER_CODE[n] for n in ("kernel", "memcpy", "memset", "sync", "comm")]
    on_gpu = (tree.stream >= 0) & np.isin(tree.layer, gpu_codes)
    launched = on_gpu & (tree.edge == EDGE_LAUNCH)
    assert int(launched.sum()) == expected
    parents = tree.parent[launched]
    assert np.all(tree.layer[parents] == LAYER_CODE["runtime"])


def test_legacy_categories_and_lowercase_external_id() -> None:
    table = read_trace(real_trace("hta/legacy_inference_rank1_oldcats.json.gz"))
    frame = table.to_pandas()
    assert set(frame.loc[frame["cat"] == "Kernel", "layer"]) == {"kernel"}
    assert set(frame.loc[frame["cat"] == "Runtime", "layer"]) == {"runtime"}
    # `external id` (lower case) is lifted: the occupancy query carries external id 6294
    runtime = frame[frame["name"] == "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"]
    assert 6294 in set(runtime["external_id"])
    assert (runtime["external_id"] > 0).all()
    # string pids ("Spans") get stable ids instead of being dropped
    assert "PyTorch Profiler (0)" in set(frame["name"])


def test_legacy_async_gpu_flows_link_launches_without_correlation(tmp_path: Path) -> None:
    events = raw_events(real_trace("hta/legacy_inference_rank1_oldcats.json.gz"))
    for event in events:
        if event.get("cat") == "Kernel":
            event["args"].pop("correlation")
    stripped = write_gz(tmp_path / "legacy_no_corr.json.gz", {"traceEvents": events})
    flows = {e["id"] for e in events if e.get("cat") == "async_gpu" and e["ph"] == "f"}

    tree = build_tree(read_trace(stripped))

    kernels = tree.layer == LAYER_CODE["kernel"]
    assert int((kernels & (tree.edge == EDGE_LAUNCH)).sum()) == len(flows) == 4


def test_rocm_hip_runtime_launches() -> None:
    tree = build_tree(read_trace(real_trace("hta/amd_mi250_rocm62.json.gz")))
    runtime_names = {tree.node_name(i) for i in np.flatnonzero(tree.layer == LAYER_CODE["runtime"])}
    assert any(name.startswith("hip") for name in runtime_names)
    kernels = np.flatnonzero(tree.layer == LAYER_CODE["kernel"])
    launchers = {tree.node_name(tree.parent[k]) for k in kernels if tree.parent[k] >= 0}
    assert launchers and all(name.startswith("hip") for name in launchers)


def test_ns_display_unit_keeps_every_nanosecond_digit() -> None:
    path = real_trace("hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz")
    document = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    assert document["displayTimeUnit"] == "ns"
    placed = [e for e in document["traceEvents"] if e.get("ph") in ("X", "i", "I", "C")]
    expected_ns = [int(Decimal(e["ts"]) * 1000) for e in placed]
    assert any(Decimal(e["ts"]) % 1 for e in placed)  # the file does carry sub-µs digits

    table = read_trace(path)

    assert sorted(table.table.column("ts_ns").to_pylist()) == sorted(expected_ns)


def test_integers_beyond_int64_survive_in_args(tmp_path: Path) -> None:
    path = real_trace("hta/large_integer_comms_id.pt.trace.json.gz")
    table = read_trace(path)
    frame = table.to_pandas()
    args = frame.loc[frame["name"] == "record_param_comms", "args"].iloc[0]
    assert json.loads(args)["Comms Id"] == 10159970886766084423
    # beyond 64 bits entirely: parsed leniently, value kept exactly, a warning says so
    text = gzip.decompress(path.read_bytes()).replace(b"10159970886766084423", b"1" + b"0" * 30)
    bigger = tmp_path / "bigger.json"
    bigger.write_bytes(text)
    frame = read_trace(bigger).to_pandas()
    assert "1" + "0" * 30 in frame.loc[frame["name"] == "record_param_comms", "args"].iloc[0]


def test_raw_control_characters_in_names(tmp_path: Path) -> None:
    text = gzip.decompress(real_trace("hta/simple_add_kineto_pair.json.gz").read_bytes())
    broken = text.replace(b'"name": "aten::add', b'"name": "aten::\tadd\x01', 1)
    assert broken != text
    path = tmp_path / "ctrl.json"
    path.write_bytes(broken)

    table = read_trace(path)

    assert "aten::\tadd\x01" in set(table.to_pandas()["name"])
    assert any("not strict JSON" in w for w in table.warnings)
    assert len(table) == len(read_trace(real_trace("hta/simple_add_kineto_pair.json.gz")))


def test_base_time_nanoseconds_gives_unix_wall_clock() -> None:
    path = real_trace("tracelens/hf_qwen1.5-0.5b_h100.json.gz")
    document = json.loads(gzip.decompress(path.read_bytes()))
    base = document["baseTimeNanoseconds"]
    first_us = min(e["ts"] for e in document["traceEvents"] if e.get("ph") == "X")

    table = read_trace(path)

    ts = table.table.column("ts_ns").to_numpy()
    assert table.sources[0].clock == "unix"
    assert abs(int(ts.min()) - (base + round(first_us * 1000))) <= 1
    assert 1.7e18 < ts.min() < 1.9e18  # 2023..2030 in unix ns


def test_rank_from_distributed_info_then_file_name_then_comms(tmp_path: Path) -> None:
    assert read_trace(real_trace("hta/sampled_rank1_of128.json.gz")).sources[0].rank == 1
    assert read_trace(real_trace("hta/sampled_rank1_of128.json.gz")).sources[0].world_size == 128

    amd = real_trace("hta/amd_mi250_rocm62.json.gz")  # no distributedInfo
    renamed = tmp_path / "job.rank3.pt.trace.json.gz"
    renamed.write_bytes(amd.read_bytes())
    source = read_trace(renamed).sources[0]
    assert (source.rank, source.rank_source) == (3, "file name")

    events = raw_events(real_trace("hta/large_integer_comms_id.pt.trace.json.gz"))
    events[1]["args"]["Rank"] = 5
    with_rank_arg = write_gz(
        tmp_path / "comms.json.gz", {"schemaVersion": 1, "traceEvents": events}
    )
    source = read_trace(with_rank_arg).sources[0]
    assert (source.rank, source.rank_source) == (5, "record_param_comms")


def test_collective_metadata_from_record_param_comms() -> None:
    path = real_trace("hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz")
    first = min(
        (e for e in raw_events(path) if e.get("name") == "record_param_comms"),
        key=lambda e: e["ts"],
    )
    frame = read_trace(path).to_pandas()
    row = frame[(frame["name"] == "record_param_comms")].sort_values("ts_ns").iloc[0]
    assert row["layer"] == "comm"
    assert row["coll_name"] == first["args"]["Collective name"] == "broadcast"
    assert row["group"] == str(first["args"]["Process Group ID"])
    assert first["args"]["dtype"] == "Float"
    assert row["bytes"] == first["args"]["In msg nelems"] * 4


def test_communication_recognised_by_name() -> None:
    frame = read_trace(real_trace("hta/sampled_rank0_of128.json.gz")).to_pandas()
    nccl_kernels = frame[frame["name"].str.startswith("ncclKernel")]
    assert len(nccl_kernels) > 0 and set(nccl_kernels["layer"]) == {"comm"}
    assert set(nccl_kernels["coll_name"]) == {"sendrecv"}
    annotations = frame[frame["name"].isin(["nccl:all_reduce", "nccl:all_to_all"])]
    assert set(annotations["layer"]) == {"comm"}
    assert set(annotations["coll_name"]) == {"allreduce", "alltoall"}


def test_bare_event_list_file(tmp_path: Path) -> None:
    events = raw_events(real_trace("hta/critical_path_alexnet.json.gz"))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(events))
    assert len(read_trace(bare)) == len(read_trace(real_trace("hta/critical_path_alexnet.json.gz")))


def test_parquet_round_trip(tmp_path: Path) -> None:
    table = read_trace(real_trace("hta/critical_path_alexnet.json.gz"))
    write_parquet(table, tmp_path / "t.parquet")
    back = read_parquet(tmp_path / "t.parquet")
    assert back.table.equals(table.table)
    assert back.sources[0].rank == table.sources[0].rank
    assert back.sources[0].events_by_category == table.sources[0].events_by_category


def test_directory_finds_only_trace_files() -> None:
    directory = real_trace("tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz").parent
    found = find_trace_files([directory])
    names = sorted(p.name for p in found)
    assert "execution_details.json" not in names
    assert "graph_execution.json.gz" in names
    et = real_trace("hta/simple_add_execution_trace_et.json.gz")
    assert et not in find_trace_files([et.parent])  # an execution trace is not a Kineto trace


# -- bad input: one clear error naming the file, where, and what was expected ---------------------


def test_truncated_gzip_is_read_up_to_its_last_complete_event(tmp_path: Path) -> None:
    data = real_trace("hta/cuda_event_sync.json.gz").read_bytes()
    whole = read_trace(real_trace("hta/cuda_event_sync.json.gz"))
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    events = read_trace(path)
    assert 0 < len(events) < len(whole)
    assert any("gzip stream truncated at byte" in w for w in events.warnings)
    assert any("complete events up to byte" in w for w in events.warnings)


def test_truncated_json_is_read_up_to_its_last_complete_event(tmp_path: Path) -> None:
    text = gzip.decompress(real_trace("hta/cuda_event_sync.json.gz").read_bytes())
    path = tmp_path / "cut.json"
    path.write_bytes(text[:5000])
    events = read_trace(path)
    (warning,) = [w for w in events.warnings if "truncated" in w]
    assert "truncated at byte 5000" in warning
    expected = read_trace(real_trace("hta/cuda_event_sync.json.gz")).table.slice(0, len(events))
    assert events.table.column("ts_ns").equals(expected.column("ts_ns"))


def test_a_cut_in_the_keys_after_the_events_keeps_every_event(tmp_path: Path) -> None:
    text = gzip.decompress(real_trace("hta/cuda_event_sync.json.gz").read_bytes())
    path = tmp_path / "cut.json"
    path.write_bytes(text[:-5])  # inside "traceName", after the event list
    events = read_trace(path)
    assert len(events) == len(read_trace(real_trace("hta/cuda_event_sync.json.gz")))
    assert any("after all" in w and "keys after the cut are missing" in w for w in events.warnings)


def test_a_cut_before_any_complete_event_or_a_corrupt_middle_is_refused(tmp_path: Path) -> None:
    text = gzip.decompress(real_trace("hta/cuda_event_sync.json.gz").read_bytes())
    head = tmp_path / "head.json"
    head.write_bytes(text[: text.index(b'"traceEvents"') + 30])
    with pytest.raises(TraceError) as error:
        read_trace(head)
    assert "truncated" in error.value.what and error.value.where.startswith("byte ")
    middle = tmp_path / "middle.json"
    at = len(text) // 2
    middle.write_bytes(text[:at] + b"}}}{{{" + text[at:])
    with pytest.raises(TraceError, match="not valid JSON"):
        read_trace(middle)


def test_not_json(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    path.write_text("this is { not json")
    with pytest.raises(TraceError, match="not valid JSON") as error:
        read_trace(path)
    assert error.value.where == "byte 0"


def test_wrong_schema(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"nodes": [], "schema": "1.0"}))
    with pytest.raises(TraceError, match="traceEvents"):
        read_trace(path)
    events_wrong = tmp_path / "wrong_events.json"
    events_wrong.write_text(json.dumps({"traceEvents": [1, 2, 3]}))
    with pytest.raises(TraceError) as error:
        read_trace(events_wrong)
    assert error.value.where == "event 0"


def test_empty_inputs(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    with pytest.raises(TraceError, match="empty"):
        read_trace(empty)
    no_events = tmp_path / "none.json"
    no_events.write_text('{"traceEvents": []}')
    with pytest.raises(TraceError, match="no events"):
        read_trace(no_events)
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "missing.json")


def test_malformed_events_are_counted_not_dropped_silently(tmp_path: Path) -> None:
    events = raw_events(real_trace("hta/cuda_event_sync.json.gz"))
    events.insert(3, {"ph": "X", "cat": "cpu_op", "name": "no ts", "dur": 3})
    events.insert(4, "not an event")
    path = write_gz(tmp_path / "odd.json.gz", {"traceEvents": events})
    table = read_trace(path)
    warnings = " ".join(table.warnings)
    assert "missing or non-numeric ts" in warnings and "malformed" in warnings


def test_reader_is_deterministic() -> None:
    path = real_trace("tracelens/sglang_Qwen3-8B_prefilldecode.json.gz")
    assert kineto.read(path).table.equals(kineto.read(path).table)


def test_warnings_do_not_depend_on_the_interpreters_hash_seed(tmp_path: Path) -> None:
    # several unknown categories, each warned on: in the order first seen, not a set's order
    events = [
        {"ph": "X", "cat": f"custom_{i}", "name": "x", "pid": 1, "tid": 1, "ts": i, "dur": 1}
        for i in range(8)
    ]
    path = write_gz(tmp_path / "custom.json.gz", {"traceEvents": events})
    code = "import sys; from teller.ingest import kineto; print(kineto.read(sys.argv[1]).warnings)"
    said = {
        subprocess.run(
            [sys.executable, "-c", code, str(path)],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in (1, 2, 3)
    }
    assert len(said) == 1
    assert "custom_0" in next(iter(said))


def test_a_merged_file_keeps_each_process_rank(tmp_path: Path) -> None:
    """teller's annotated Perfetto export (and any trace whose processes are named "rank N")."""
    events = [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "rank 0"}},
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "rank 1"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 0, "tid": 1, "ts": 10, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 11, "dur": 7},
    ]
    path = tmp_path / "merged.json"
    path.write_text(json.dumps({"traceEvents": events}))
    table = read_trace(path)
    assert table.ranks == [0, 1]
    assert table.table.column("rank").to_pylist() == [0, 1]
    assert {s.rank_source for s in table.sources} == {"process name"}


def test_host_collective_size_from_its_input_tensor_without_nccl_args(tmp_path) -> None:
    """gloo (and older PyTorch) record no "In msg nelems": the size comes from the input tensor."""
    events = raw_events(real_trace("hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz"))
    comms = sorted(
        (e for e in events if e.get("name") == "record_param_comms"), key=lambda e: e["ts"]
    )
    for event in comms:
        for key in ("In msg nelems", "dtype"):
            event["args"].pop(key, None)
    comms[0]["args"].update({"Input Dims": [[1, 93, 384]], "Input type": ["float"]})
    comms[1]["args"].update({"Input Dims": [[8, 2]], "Input type": ["c10::BFloat16"]})
    comms[2]["args"].update({"Input Dims": [["x"]], "Input type": ["float"]})
    comms[3]["args"].update({"Input Dims": [[4]], "Input type": ["an unknown type"]})
    path = write_gz(tmp_path / "gloo.json.gz", {"schemaVersion": 1, "traceEvents": events})
    frame = read_trace(path).to_pandas()
    sizes = frame[frame["name"] == "record_param_comms"].sort_values("ts_ns")["bytes"].tolist()
    assert sizes[:4] == [93 * 384 * 4, 8 * 2 * 2, -1, -1]
