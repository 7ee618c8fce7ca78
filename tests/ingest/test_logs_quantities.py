"""Typed quantity columns: each engine's own names for the KV cache's fill, the request counts,
the iteration and the collective land in one typed column each, null where a line says nothing."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from ingest.test_logs_engines import SGLANG_LINES, TRTLLM_LINE
from ingest.test_logs_vllm import ITERATION_LINE, NCCL_LINE, V0_LINES, V1_LINES
from teller.ingest.logs import read_logs
from teller.ingest.logs.quantities import ENGINE_FIELDS, QUANTITIES
from teller.ingest.logs.table import LogColumns

LAB_LOGS = Path(__file__).resolve().parent.parent / "align" / "data" / "lab_none_tp2" / "logs"
WATCHDOG_WORK_LINE = "[rank1]:[E1001 16:06:04.889919061 ProcessGroupNCCL.cpp:1709] [PG 1 (tp) Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600020 milliseconds before timing out."


def quantities_of(tmp_path: Path, lines: list[str]) -> list[dict]:
    """Each record's typed quantities, with its event."""
    path = tmp_path / "engine.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    table = read_logs([path], year=2025).table
    return table.select(["event", *QUANTITIES]).to_pylist()


def stated(row: dict) -> dict:
    """The quantities a record states (the non-null ones)."""
    return {k: v for k, v in row.items() if k != "event" and v is not None}


def test_vllm_v0_stats_state_running_pending_and_the_fill(tmp_path):
    got = quantities_of(tmp_path, V0_LINES)
    stats = next(row for row in got if row["event"] == "stats")
    assert stated(stats) == {
        "kv_cache_fill": pytest.approx(0.016),
        "requests_running": 7,
        "requests_waiting": 0,  # V0's `Pending`
    }
    # request, preemption and config lines state none of them
    assert all(not stated(row) for row in got if row is not stats)


def test_vllm_v1_stats_state_running_waiting_and_the_fill(tmp_path):
    got = quantities_of(tmp_path, V1_LINES)
    stats = [row for row in got if row["event"] == "stats"]
    assert [stated(row) for row in stats] == [
        {"kv_cache_fill": 0.0, "requests_running": 0, "requests_waiting": 0},
        {"kv_cache_fill": pytest.approx(0.01), "requests_running": 1, "requests_waiting": 0},
    ]
    assert all(not stated(row) for row in got if row["event"] != "stats")


def test_vllm_iteration_details_state_the_batch_and_its_elapsed_time(tmp_path):
    line = f"INFO 02-13 11:33:39 [loggers.py:257] {ITERATION_LINE}"
    (row,) = quantities_of(tmp_path, [line])
    assert stated(row) == {
        "kv_cache_fill": pytest.approx(0.412),
        "context_requests": 3,
        "generation_requests": 0,
        "iteration_counter": 42,
        "iteration_elapsed_ns": 187_320_000,
    }


def test_sglang_batches_state_running_queued_and_token_usage(tmp_path):
    decode, prefill, decode_new = quantities_of(tmp_path, SGLANG_LINES)
    assert stated(decode) == {"kv_cache_fill": 0.12, "requests_running": 8, "requests_waiting": 0}
    assert stated(prefill) == {"kv_cache_fill": 0.0, "requests_running": 0, "requests_waiting": 0}
    # the hybrid-attention shape prints `full token usage` and `swa token usage`, not `token
    # usage`: no one number is the cache's fill, so none is taken for it
    assert stated(decode_new) == {"requests_running": 1, "requests_waiting": 0}


def test_trtllm_iteration_json_states_its_batch_and_the_fill_from_blocks(tmp_path):
    half_free = TRTLLM_LINE.replace('"Free KV cache blocks":0', '"Free KV cache blocks":612')
    no_blocks = TRTLLM_LINE.replace('"Max KV cache blocks":2448', '"Max KV cache blocks":0')
    full, quarter_free, unknown = quantities_of(tmp_path, [TRTLLM_LINE, half_free, no_blocks])
    assert stated(full) == {
        "kv_cache_fill": 1.0,  # no block free
        "requests_running": 249,  # `Active Request Count`
        "context_requests": 8,
        "generation_requests": 231,
        "iteration_counter": 90,
    }
    assert quarter_free["kv_cache_fill"] == pytest.approx(0.75)
    assert unknown["kv_cache_fill"] is None  # a cache of no blocks has no fill


def test_nccl_watchdog_lines_state_the_collective_and_its_process_group(tmp_path):
    counters, work = quantities_of(tmp_path, [NCCL_LINE, WATCHDOG_WORK_LINE])
    assert stated(counters) == {
        "collective_seq": 1,
        "process_group": "0",
        "process_group_desc": "default_pg",
    }
    assert stated(work) == {"collective_seq": 7, "process_group": "1", "process_group_desc": "tp"}


def test_a_stats_line_behind_an_unknown_prefix_still_states_its_quantities(tmp_path):
    """docker compose prefixes every line: the reader does not know the shape and mines it, and
    the field names still say what the numbers are."""
    stats = V1_LINES[2]
    (row,) = quantities_of(tmp_path, [f"vllm-1  | {stats}"])
    assert stated(row) == {"kv_cache_fill": 0.0, "requests_running": 0, "requests_waiting": 0}


def test_a_usage_above_100_percent_is_clipped_to_a_full_cache(tmp_path):
    line = V1_LINES[3].replace("GPU KV cache usage: 1.0%", "GPU KV cache usage: 100.4%")
    (row,) = quantities_of(tmp_path, [line])
    assert row["kv_cache_fill"] == 1.0


def test_real_lab_logs_state_the_fill_their_lines_print(tmp_path):
    """A real `teller lab run` case (tests/align/data): every stats and iteration line's fill is
    the percentage it prints, every other record has none; the accessor gives NaN for those."""
    logs = read_logs(sorted(LAB_LOGS.glob("rank*.log")))
    printed = [
        float(m.group(1)) / 100 if (m := re.search(r"GPU KV cache usage: ([\d.]+)%", raw)) else None
        for raw in logs.column("raw")
    ]
    assert sum(p is not None for p in printed) > 50
    fill = logs.kv_cache_fill()
    assert fill.dtype == np.float64 and len(fill) == len(logs)
    for value, expected in zip(fill.tolist(), printed, strict=True):
        if expected is None:
            assert math.isnan(value)
        else:
            assert value == pytest.approx(expected)
    iterations = logs.table.filter(pc.equal(logs.table.column("event"), "iteration"))
    assert iterations.num_rows > 0
    assert iterations.column("iteration_elapsed_ns").null_count == 0
    assert iterations.column("context_requests").null_count == 0


def test_quantity_gives_counts_as_floats_with_nan_and_refuses_names(tmp_path):
    path = tmp_path / "engine.log"
    path.write_text(f"{V1_LINES[3]}\n{NCCL_LINE}\n", encoding="utf-8")
    logs = read_logs([path], year=2025)
    assert logs.quantity("requests_running")[0] == 1.0
    assert math.isnan(logs.quantity("requests_running")[1])
    assert logs.column("process_group") == [None, "0"]
    with pytest.raises(ValueError, match="names"):
        logs.quantity("process_group")


def test_columns_are_the_same_across_chunk_boundaries(tmp_path, monkeypatch):
    lines = [*V0_LINES, *V1_LINES, NCCL_LINE, *V1_LINES]
    whole = quantities_of(tmp_path, lines)
    monkeypatch.setattr(LogColumns, "CHUNK_ROWS", 3)
    assert quantities_of(tmp_path, lines) == whole


def test_every_engine_field_names_one_typed_column_once():
    assert all(row.column in QUANTITIES for row in ENGINE_FIELDS)
    names = [row.field for row in ENGINE_FIELDS]
    assert len(names) == len(set(names))
