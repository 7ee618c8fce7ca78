"""OTLP/JSON request spans (vLLM `llm_request`, gen_ai semantic conventions, llm.* keys)."""

from __future__ import annotations

import gzip
import json

import pytest

from teller.errors import TraceError
from teller.ingest.otlp import read_spans

ARRIVAL_NS = 1_739_446_413_120_000_000


def attr(key: str, value) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}  # int64 as a string, per OTLP/JSON
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    if isinstance(value, list):
        return {
            "key": key,
            "value": {"arrayValue": {"values": [{"stringValue": v} for v in value]}},
        }
    return {"key": key, "value": {"stringValue": value}}


def span(name: str, attributes: list[dict], start_ns: int, end_ns: int, span_id="a1") -> dict:
    return {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": span_id,
        "name": name,
        "kind": 2,
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(end_ns),
        "attributes": attributes,
    }


def export(*spans: dict) -> dict:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [attr("service.name", "vllm")]},
                "scopeSpans": [{"scope": {"name": "vllm.llm_engine"}, "spans": list(spans)}],
            }
        ]
    }


VLLM_SPAN = span(
    "llm_request",
    [
        attr("gen_ai.response.model", "Qwen/Qwen2.5-0.5B-Instruct"),
        attr("gen_ai.request.id", "chatcmpl-a269fdcb7c6ce890-a8a65d16"),
        attr("gen_ai.request.temperature", 0.7),
        attr("gen_ai.request.top_p", 1.0),
        attr("gen_ai.request.max_tokens", 128),
        attr("gen_ai.request.n", 1),
        attr("gen_ai.usage.num_sequences", 1),
        attr("gen_ai.usage.prompt_tokens", 21),
        attr("gen_ai.usage.completion_tokens", 128),
        attr("gen_ai.usage.cached_tokens", 16),
        attr("gen_ai.response.finish_reasons", ["length"]),
        attr("gen_ai.latency.time_in_queue", 0.0125),
        attr("gen_ai.latency.time_to_first_token", 0.0431),
        attr("gen_ai.latency.e2e", 1.2),
        attr("gen_ai.latency.time_in_scheduler", 0.002),
        attr("gen_ai.latency.time_in_model_forward", 0.9),
        attr("gen_ai.latency.time_in_model_execute", 1.0),
        attr("gen_ai.latency.time_in_model_prefill", 0.0306),
        attr("gen_ai.latency.time_in_model_decode", 1.1569),
        attr("gen_ai.latency.time_in_model_inference", 1.1875),
    ],
    ARRIVAL_NS,
    ARRIVAL_NS + 1_200_000_000,
)


def test_vllm_llm_request_span_maps_to_request_row(tmp_path):
    path = tmp_path / "spans.json"
    path.write_text(
        json.dumps(export(VLLM_SPAN, span("http get", [], ARRIVAL_NS, ARRIVAL_NS + 5, "b2")))
    )
    table = read_spans([path])
    assert len(table) == 1
    (row,) = table.table.to_pylist()
    assert row["request_id"] == "chatcmpl-a269fdcb7c6ce890-a8a65d16"
    assert row["request_key"] == "chatcmpl-a269fdcb7c6ce890"  # joins the API server's log lines
    assert row["service"] == "vllm" and row["model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert row["arrival_ns"] == ARRIVAL_NS and row["end_ns"] == ARRIVAL_NS + 1_200_000_000
    assert (row["queue_ns"], row["ttft_ns"], row["e2e_ns"]) == (
        12_500_000,
        43_100_000,
        1_200_000_000,
    )
    assert (row["prefill_ns"], row["decode_ns"], row["inference_ns"]) == (
        30_600_000,
        1_156_900_000,
        1_187_500_000,
    )
    assert (row["input_tokens"], row["output_tokens"], row["cached_tokens"]) == (21, 128, 16)
    assert (row["max_tokens"], row["n"], row["finish_reason"]) == (128, 1, "length")
    assert table.sources[0].skipped == {"not_a_request_span": 1}


def test_newer_gen_ai_and_llm_vocabularies_and_json_lines(tmp_path):
    semconv = span(
        "chat Qwen",
        [
            attr("gen_ai.usage.input_tokens", 7),
            attr("gen_ai.usage.output_tokens", 3),
            attr("gen_ai.response.id", "chatcmpl-1"),
        ],
        ARRIVAL_NS,
        ARRIVAL_NS + 10,
    )
    openinference = span(
        "LLM",
        [
            attr("llm.token_count.prompt", 11),
            attr("llm.token_count.completion", 5),
            attr("llm.model_name", "gpt-x"),
        ],
        ARRIVAL_NS + 100,
        ARRIVAL_NS + 300,
        span_id="c3",
    )
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps(export(semconv)) + "\n" + json.dumps(export(openinference)) + "\n")
    first, second = read_spans([tmp_path]).table.to_pylist()
    assert (first["request_id"], first["input_tokens"], first["output_tokens"]) == (
        "chatcmpl-1",
        7,
        3,
    )
    assert first["queue_ns"] == -1 and first["e2e_ns"] == 10  # no latency attributes: span length
    assert (second["request_id"], second["model"], second["input_tokens"]) == ("c3", "gpt-x", 11)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty span file"),
        ("{not json", "not OTLP/JSON"),
        ('{"traceEvents": []}', "no resourceSpans"),
        (
            json.dumps(export({**VLLM_SPAN, "startTimeUnixNano": "yesterday"})),
            r"resourceSpans\[0\]\.scopeSpans\[0\]\.spans\[0\]: startTimeUnixNano",
        ),
        (
            json.dumps(export(span("llm_request", [], ARRIVAL_NS, ARRIVAL_NS - 1))),
            "ends before it starts",
        ),
    ],
)
def test_bad_files_raise_trace_error_naming_file_and_place(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TraceError, match=message) as error:
        read_spans([path])
    assert error.value.path == str(path)


def test_engine_suffix_joins_a_client_id_read_in_the_same_spans(tmp_path):
    ids = ["myreq", "myreq-a8a65d16", "my-request-1", "my-request-2", "solo-0b1c2d3e"]
    spans = [
        span("llm_request", [attr("gen_ai.request.id", rid)], ARRIVAL_NS, ARRIVAL_NS + 5, f"s{k}")
        for k, rid in enumerate(ids)
    ]
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(export(*spans)))
    keys = read_spans([path]).column("request_key")
    assert keys == ["myreq", "myreq", "my-request-1", "my-request-2", "solo-0b1c2d3e"]


def test_llm_usage_and_request_attributes_in_a_gzipped_file(tmp_path):
    """OpenLLMetry's `llm.usage.*` / `llm.request.*` keys, in an export gzipped by the collector."""
    traceloop = span(
        "openai.chat",
        [
            attr("llm.request.id", "chatcmpl-9f8e7d6c5b4a3921"),
            attr("llm.request.model", "Qwen/Qwen2.5-0.5B-Instruct"),
            attr("llm.request.max_tokens", 64),
            attr("llm.usage.prompt_tokens", 17),
            attr("llm.usage.completion_tokens", 64),
            attr("llm.latency.e2e", 0.5),
        ],
        ARRIVAL_NS,
        ARRIVAL_NS + 600_000_000,
    )
    (tmp_path / "spans.json.gz").write_bytes(gzip.compress(json.dumps(export(traceloop)).encode()))
    (row,) = read_spans([tmp_path]).table.to_pylist()  # found in a directory by its suffix
    assert row["request_id"] == row["request_key"] == "chatcmpl-9f8e7d6c5b4a3921"
    assert row["model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (row["input_tokens"], row["output_tokens"], row["max_tokens"]) == (17, 64, 64)
    assert row["e2e_ns"] == 500_000_000 and row["file"].endswith("spans.json.gz")
