"""vLLM V0/V1 lines, exactly as users' servers print them (quoted in shared/formats/engine-logs.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from teller.ingest.logs import read_logs

V0_LINES = [
    "INFO 10-01 18:43:28 logger.py:36] Received request cmpl-c5044c83c77b430d9038ecd2b7d1089e-0: prompt: 'Who is the president of us', params: SamplingParams(n=1, ...), prompt_token_ids: [6526, 349, 272, 4951, 302, 592], lora_request: None, prompt_adapter_request: None.",
    "INFO 10-01 18:43:28 engine.py:255] Added request cmpl-c5044c83c77b430d9038ecd2b7d1089e-0.",
    "INFO 10-22 12:13:24 async_llm_engine.py:173] Finished request cmpl-1f94a8f598ea45e386c00f39ef6ab30c-0.",
    "INFO 08-26 12:07:05 metrics.py:411] Avg prompt throughput: 1480.7 tokens/s, Avg generation throughput: 143.6 tokens/s, Running: 7 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 1.6%, CPU KV cache usage: 0.0%.",
    "WARNING 06-16 21:24:15 scheduler.py:1089] Sequence group 165 is preempted by PreemptionMode.SWAP mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=151",
    "INFO 05-06 01:42:03 llm_engine.py:123] Initializing an LLM engine with config: ...",
]
V1_LINES = [
    "(APIServer pid=90458) INFO 02-13 11:33:33 [logger.py:49] Received request chatcmpl-a269fdcb7c6ce890: params: SamplingParams(n=1, ...), lora_request: None.",
    "(APIServer pid=90458) INFO 02-13 11:33:33 [async_llm.py:382] Added request chatcmpl-a269fdcb7c6ce890-a8a65d16.",
    "(APIServer pid=90458) INFO 02-13 11:33:39 [loggers.py:257] Engine 000: Avg prompt throughput: 0.8 tokens/s, Avg generation throughput: 4.6 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%",
    "(APIServer pid=3402897) INFO 08-17 02:59:34 [loggers.py:310] Engine 000: Avg prompt throughput: 5.7 tokens/s, Avg generation throughput: 1.5 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%",
    "(EngineCore_0 pid=3945189) INFO 08-21 07:17:09 [scheduler.py:495] Preempted request cmpl-e5951453df7d471e8aac25957dbc9096-0 has been resumed!",
    "(Worker_TP0 pid=447) WARNING 08-14 14:09:46 [jit_monitor.py:135] Triton kernel JIT compilation during inference: _causal_conv1d_fwd_kernel. This causes a latency spike; consider extending warmup to cover this shape/config.",
    'INFO:     172.18.0.1:49422 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
]
ITERATION_LINE = "Engine 000: Iteration(42): 3 context requests, 6144 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 187.32 ms, GPU KV cache usage: 41.2%"
NCCL_LINE = "[rank3]:[E1001 16:06:04.889919061 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 3] Timeout at NCCL work: 1, last enqueued NCCL work: 1, last completed NCCL work: -1."


def read_lines(tmp_path: Path, lines: list[str], year: int | None = 2025, name="engine.log"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return read_logs([path], year=year)


def rows(table) -> list[dict]:
    out = table.table.to_pylist()
    for row in out:
        row["fields"] = json.loads(row["fields"]) if row["fields"] else {}
    return out


def test_v0_request_lifecycle_stats_and_preemption(tmp_path):
    got = rows(read_lines(tmp_path, V0_LINES))
    assert [r["event"] for r in got] == [
        "request_received",
        "request_added",
        "request_finished",
        "stats",
        "request_preempted",
        "engine_config",
    ]
    received, added = got[0], got[1]
    assert received["request_id"] == "cmpl-c5044c83c77b430d9038ecd2b7d1089e-0"
    assert (
        received["request_key"] == added["request_key"] == "cmpl-c5044c83c77b430d9038ecd2b7d1089e"
    )
    assert received["fields"]["prompt_tokens"] == 6
    assert received["source"] == "logger.py:36" and received["level"] == "INFO"
    assert got[3]["fields"] == {
        "avg_prompt_throughput_tokens_per_s": 1480.7,
        "avg_generation_throughput_tokens_per_s": 143.6,
        "running": 7,
        "swapped": 0,
        "pending": 0,
        "gpu_kv_cache_usage_pct": 1.6,
        "cpu_kv_cache_usage_pct": 0.0,
    }
    preempted = got[4]
    assert preempted["level"] == "WARNING" and preempted["request_id"] == "165"
    assert preempted["fields"] == {"mode": "swap", "total_num_cumulative_preemption": 151}


def test_v1_process_prefix_and_engine_request_id_suffix(tmp_path):
    got = rows(read_lines(tmp_path, V1_LINES))
    received, added = got[0], got[1]
    assert (received["process"], received["pid"]) == ("APIServer", 90458)
    assert received["request_id"] == "chatcmpl-a269fdcb7c6ce890"
    assert added["request_id"] == "chatcmpl-a269fdcb7c6ce890-a8a65d16"
    assert added["request_key"] == received["request_key"] == "chatcmpl-a269fdcb7c6ce890"
    assert got[2]["event"] == "stats"
    assert got[2]["fields"]["engine"] == 0 and got[2]["fields"]["waiting"] == 0
    assert got[3]["fields"]["running"] == 1 and got[3]["fields"]["gpu_kv_cache_usage_pct"] == 1.0
    resumed = got[4]
    assert resumed["event"] == "request_resumed" and resumed["process"] == "EngineCore_0"
    assert resumed["request_key"] == "cmpl-e5951453df7d471e8aac25957dbc9096"
    jit = got[5]
    assert (jit["event"], jit["rank"], jit["level"]) == ("jit_compile", 0, "WARNING")
    assert jit["fields"] == {"kernel": "_causal_conv1d_fwd_kernel"}
    access = got[6]
    assert access["event"] == "http_access" and access["format"] == "uvicorn"
    assert access["fields"]["status"] == 200 and access["fields"]["path"] == "/v1/chat/completions"
    # an access line prints no time: it carries the previous record's over, marked inexact
    assert access["ts_ns"] >= jit["ts_ns"] and not access["ts_exact"]


@pytest.mark.parametrize(
    ("prefix", "process", "rank"),
    [
        ("(EngineCore_DP0 pid=11) ", "EngineCore_DP0", -1),
        ("(VllmWorker TP0 pid=12) ", "VllmWorker TP0", 0),
        ("(VllmWorker rank=1 pid=13) ", "VllmWorker rank=1", 1),
        ("(Worker_TP0 pid=14) ", "Worker_TP0", 0),
        ("(VllmWorkerProcess pid=15) ", "VllmWorkerProcess", -1),
        ("(RayWorkerWrapper pid=16) ", "RayWorkerWrapper", -1),
        ("(RayWorkerWrapper pid=17, ip=10.0.0.2) ", "RayWorkerWrapper", -1),
        ("", "", -1),
    ],
)
def test_every_process_prefix(tmp_path, prefix, process, rank):
    line = (
        prefix
        + "INFO 02-13 11:33:33 [async_llm.py:382] Added request chatcmpl-a269fdcb7c6ce890-a8a65d16."
    )
    (row,) = rows(read_lines(tmp_path, [line]))
    assert (row["process"], row["rank"], row["event"]) == (process, rank, "request_added")
    assert row["pid"] == (
        int(prefix.split("pid=")[1].split(")")[0].split(",")[0]) if prefix else -1
    )
    assert row["host"] == ("10.0.0.2" if "ip=" in prefix else "")


def test_ansi_colour_codes_are_removed(tmp_path):
    line = "\x1b[1;36m(APIServer pid=90458)\x1b[0;0m INFO 02-13 11:33:33 [async_llm.py:382] Added request chatcmpl-a269fdcb7c6ce890-a8a65d16."
    (row,) = rows(read_lines(tmp_path, [line]))
    assert row["process"] == "APIServer" and row["event"] == "request_added"
    assert "\x1b" not in row["raw"]


def test_a_line_without_brackets_round_its_source(tmp_path):
    """Some vLLM builds print `file.py:N` bare, with neither bracket, before the message."""
    line = (
        "INFO 10-01 18:43:28 engine.py:255 Added request cmpl-c5044c83c77b430d9038ecd2b7d1089e-0."
    )
    (row,) = rows(read_lines(tmp_path, [line]))
    assert (row["format"], row["event"], row["source"]) == (
        "vllm",
        "request_added",
        "engine.py:255",
    )
    assert row["request_key"] == "cmpl-c5044c83c77b430d9038ecd2b7d1089e"


def test_iteration_details_line(tmp_path):
    line = "(APIServer pid=1) INFO 02-13 11:33:40 [loggers.py:257] " + ITERATION_LINE
    (row,) = rows(read_lines(tmp_path, [line]))
    assert row["event"] == "iteration"
    assert row["fields"] == {
        "engine": 0,
        "iteration": 42,
        "context_requests": 3,
        "context_tokens": 6144,
        "generation_requests": 0,
        "generation_tokens": 0,
        "iteration_elapsed_time_ms": 187.32,
        "gpu_kv_cache_usage_pct": 41.2,
    }


def test_nccl_watchdog_timeout_has_exact_time_and_rank(tmp_path):
    older = "[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600020 milliseconds before timing out."
    got = rows(read_lines(tmp_path, [NCCL_LINE, older], year=2024))
    first, second = got
    assert (first["event"], first["rank"], first["level"]) == ("nccl_timeout", 3, "ERROR")
    assert first["ts_exact"] and first["ts_ns"] == 1727798764_889919061  # 2024-10-01T16:06:04Z
    assert first["source"] == "ProcessGroupNCCL.cpp:1709"
    assert first["fields"] == {
        "pg": 0,
        "pg_name": "default_pg",
        "seq": 1,
        "last_enqueued_seq": 1,
        "last_completed_seq": -1,
    }
    assert second["event"] == "nccl_timeout" and second["rank"] == 3
    assert second["fields"] == {
        "seq": 1,
        "op_type": "allreduce",
        "timeout_ms": 600000,
        "ran_for_ms": 600020,
    }


def test_lines_within_one_second_keep_file_order_and_are_inexact(tmp_path):
    lines = [
        V0_LINES[0],
        V0_LINES[1],
        "INFO 10-01 18:43:28 engine.py:255] Added request cmpl-x-1.",
        "INFO 10-01 18:43:29 engine.py:255] Added request cmpl-y-1.",
    ]
    got = rows(read_lines(tmp_path, lines, year=2024))
    second = 1727808208 * 1_000_000_000  # 2024-10-01T18:43:28Z
    assert [r["ts_ns"] - second for r in got[:3]] == [250_000_000, 500_000_000, 750_000_000]
    assert got[3]["ts_ns"] == second + 1_500_000_000
    assert not any(r["ts_exact"] for r in got)


def test_year_comes_from_argument_else_file_time_with_a_warning(tmp_path):
    table = read_lines(tmp_path, [V0_LINES[1]], year=None)
    modified = (tmp_path / "engine.log").stat().st_mtime
    printed = datetime.fromtimestamp(table.column("ts_ns")[0] / 1e9, UTC)
    assert printed.year == datetime.fromtimestamp(modified, UTC).year
    assert any("no year" in w for w in table.warnings)
    explicit = read_lines(tmp_path, [V0_LINES[1]], year=2023)
    assert datetime.fromtimestamp(explicit.column("ts_ns")[0] / 1e9, UTC).year == 2023
    assert not explicit.warnings


def test_new_year_rolls_over(tmp_path):
    lines = [
        "INFO 12-31 23:59:59 engine.py:255] Added request cmpl-a-0.",
        "INFO 01-01 00:00:01 engine.py:255] Added request cmpl-b-0.",
    ]
    first, second = read_lines(tmp_path, lines, year=2024).column("ts_ns")
    assert 1.5e9 < second - first < 2.5e9


def test_multiline_traceback_is_one_record(tmp_path):
    lines = [
        "(EngineCore_0 pid=12) ERROR 08-14 14:09:50 [core.py:700] EngineCore encountered a fatal error.",
        "(EngineCore_0 pid=12) ERROR 08-14 14:09:50 [core.py:700] Traceback (most recent call last):",
        '(EngineCore_0 pid=12) ERROR 08-14 14:09:50 [core.py:700]   File "/vllm/v1/engine/core.py", line 691, in run_engine_core',
        "(EngineCore_0 pid=12) ERROR 08-14 14:09:50 [core.py:700]     engine_core.run_busy_loop()",
        "(EngineCore_0 pid=12) ERROR 08-14 14:09:50 [core.py:700] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "(APIServer pid=11) INFO 08-14 14:09:51 [async_llm.py:382] Added request chatcmpl-a269fdcb7c6ce890-a8a65d16.",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.12/asyncio/runners.py", line 118, in run',
        "    return self._loop.run_until_complete(task)",
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "serve.py", line 3, in <module>',
        "RuntimeError: Engine core initialization failed.",
        "INFO 08-14 14:09:52 engine.py:255] Added request cmpl-c-0.",
    ]
    table = read_lines(tmp_path, lines)
    got = rows(table)
    assert [r["event"] for r in got] == [
        "other",
        "traceback",
        "request_added",
        "traceback",
        "request_added",
    ]
    engine_tb, python_tb = got[1], got[3]
    assert engine_tb["raw"].count("\n") == 3 and engine_tb["line"] == 2
    assert engine_tb["fields"]["exception"] == "torch.OutOfMemoryError"
    assert engine_tb["template"] == "traceback torch.OutOfMemoryError"
    assert python_tb["fields"]["exception"] == "RuntimeError"
    assert python_tb["raw"].count("\n") == 9 and python_tb["format"] == "python"
    assert sum(1 for _ in lines) == sum(r["raw"].count("\n") + 1 for r in got)


def test_back_to_back_tracebacks_are_two_records(tmp_path):
    prefix = "(EngineCore_0 pid=12) ERROR 08-14 14:09:50 [core.py:700] "
    one = [
        prefix + "Traceback (most recent call last):",
        prefix + '  File "/vllm/v1/engine/core.py", line 691, in run_engine_core',
        prefix + "ValueError: first",
    ]
    two = [line.replace("ValueError: first", "KeyError: 'second'") for line in one]
    got = rows(read_lines(tmp_path, one + two))
    assert [r["fields"]["exception"] for r in got] == ["ValueError", "KeyError"]
    assert [r["line"] for r in got] == [1, 4]


def test_aborted_requests_v0_and_v1(tmp_path):
    """V0's engine and older V1 print one id; newer V1 prints `Aborted request(s)`, comma-joined."""
    lines = [
        "INFO 10-22 12:13:24 async_llm_engine.py:180] Aborted request cmpl-1f94a8f598ea45e386c00f39ef6ab30c-0.",
        "(APIServer pid=90458) INFO 02-13 11:33:35 [async_llm.py:443] Aborted request chatcmpl-a269fdcb7c6ce890.",
        "(APIServer pid=90458) INFO 02-13 11:33:36 [async_llm.py:534] Aborted request(s) chatcmpl-a269fdcb7c6ce890-a8a65d16.",
        "(APIServer pid=90458) INFO 02-13 11:33:37 [async_llm.py:534] Aborted request(s) chatcmpl-b1-a8a65d16,chatcmpl-c2-0b1c2d3e.",
    ]
    got = rows(read_lines(tmp_path, lines))
    assert {r["event"] for r in got} == {"request_aborted"}
    assert [r["request_key"] for r in got] == [
        "cmpl-1f94a8f598ea45e386c00f39ef6ab30c",
        "chatcmpl-a269fdcb7c6ce890",
        "chatcmpl-a269fdcb7c6ce890",
        "chatcmpl-b1",
    ]
    assert got[2]["request_id"] == "chatcmpl-a269fdcb7c6ce890-a8a65d16" and not got[2]["fields"]
    assert got[3]["fields"] == {"request_ids": ["chatcmpl-b1-a8a65d16", "chatcmpl-c2-0b1c2d3e"]}
