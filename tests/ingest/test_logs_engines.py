"""SGLang batch lines and TensorRT-LLM iteration JSON, as quoted in shared/formats/engine-logs.md."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from teller.ingest.logs import read_logs

SGLANG_LINES = [
    "[2025-02-27 04:46:39 TP0] Decode batch. #running-req: 8, #token: 62531, token usage: 0.12, gen throughput (token/s): 186.64, #queue-req: 0",
    "[16:43:29 TP0] Prefill batch. #new-seq: 1, #new-token: 2062, #cached-token: 0, cache hit rate: 0.00%, token usage: 0.00, #running-req: 0, #queue-req: 0",
    "[2026-08-23 09:05:37 TP0 EP0] Decode batch, #running-req: 1, #full token: 165376, full token usage: 0.02, #swa token: 768, swa token usage: 0.00, accept len: 5.30, accept rate: 0.86, cuda graph: True, gen throughput (token/s): 167.04, #queue-req: 0",
]
TRTLLM_LINE = '[TensorRT-LLM][INFO] {"Active Request Count":249,"Context Requests":8,"Free KV cache blocks":0,"Generation Requests":231,"Iteration Counter":90,"Max KV cache blocks":2448}'


def rows(path):
    out = read_logs([path]).table.to_pylist()
    for row in out:
        row["fields"] = json.loads(row["fields"]) if row["fields"] else {}
    return out


def unix_ns(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()) * 1_000_000_000


def test_sglang_batches_old_and_new_fields_with_and_without_date(tmp_path):
    path = tmp_path / "sglang.log"
    path.write_text("\n".join(SGLANG_LINES) + "\n")
    decode, prefill, decode_new = rows(path)
    assert (decode["event"], decode["rank"], decode["process"]) == ("decode_batch", 0, "TP0")
    assert decode["fields"] == {
        "tp": 0,
        "running_req": 8,
        "token": 62531,
        "token_usage": 0.12,
        "gen_throughput_token_s": 186.64,
        "queue_req": 0,
    }
    assert decode["ts_ns"] == unix_ns("2025-02-27 04:46:39") + 500_000_000
    assert prefill["event"] == "prefill_batch"
    assert prefill["fields"]["new_token"] == 2062 and prefill["fields"]["cache_hit_rate_pct"] == 0.0
    # a line without a date takes the date of the dated line before it; 16:43 < 04:46 would be
    # a day later only if the time went backwards by more than half a day
    assert prefill["ts_ns"] == unix_ns("2025-02-27 16:43:29") + 500_000_000
    assert decode_new["process"] == "TP0 EP0" and decode_new["fields"]["ep"] == 0
    assert (
        decode_new["fields"]["full_token"] == 165376 and decode_new["fields"]["cuda_graph"] is True
    )
    assert decode_new["fields"]["accept_len"] == 5.3


def test_sglang_time_only_lines_roll_over_midnight(tmp_path):
    path = tmp_path / "sglang.log"
    path.write_text(
        "[2025-02-27 23:59:58 TP0] Decode batch. #running-req: 1, #queue-req: 0\n"
        "[00:00:03 TP1] Decode batch. #running-req: 2, #queue-req: 0\n"
    )
    first, second = rows(path)
    assert second["rank"] == 1
    assert second["ts_ns"] - first["ts_ns"] == 5_000_000_000


def test_trtllm_iteration_json(tmp_path):
    path = tmp_path / "trtllm.log"
    path.write_text(
        "[2025-01-22 10:01:02] server started\n"
        + TRTLLM_LINE
        + "\n"
        + TRTLLM_LINE.replace(
            '"Iteration Counter":90', '"Iteration Counter":91,"Timestamp":"01-22-2025 10:01:07"'
        )
        + "\n[TensorRT-LLM][INFO] {broken json\n"
    )
    started, iteration, stamped, broken = rows(path)
    assert iteration["event"] == "iteration" and iteration["format"] == "trtllm"
    assert iteration["fields"] == {
        "active_request_count": 249,
        "context_requests": 8,
        "free_kv_cache_blocks": 0,
        "generation_requests": 231,
        "iteration_counter": 90,
        "max_kv_cache_blocks": 2448,
    }
    # no time of its own: carried over from the line before, never exact
    assert iteration["ts_ns"] >= started["ts_ns"] and not iteration["ts_exact"]
    # the broken line carries the stamped line's second over, so the two share that second
    assert stamped["ts_ns"] == unix_ns("2025-01-22 10:01:07") + 333_333_333
    assert broken["ts_ns"] == unix_ns("2025-01-22 10:01:07") + 666_666_666
    assert broken["event"] == "other" and broken["format"] == "trtllm"


#: SGLang's scheduler line when a decode step finds no free KV slot (its format string:
#: "KV cache pool is full. Retract requests. #retracted_reqs: {n}, #new_token_ratio: {a} -> {b}").
SGLANG_RETRACT = (
    "[2026-09-13 16:06:07 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, "
    "#new_token_ratio: 0.0980 -> 0.3487"
)


def test_sglang_retract_lines_are_preemptions_with_their_count(tmp_path):
    path = tmp_path / "sglang.log"
    path.write_text(SGLANG_RETRACT + "\n" + SGLANG_RETRACT.replace(" TP0]", "]") + "\n")
    tagged, untagged = rows(path)
    assert (tagged["event"], tagged["level"], tagged["rank"]) == ("request_preempted", "WARNING", 0)
    assert tagged["fields"]["retracted_reqs"] == 3
    assert untagged["event"] == "request_preempted" and untagged["rank"] == -1
    assert untagged["template"] == tagged["template"]
