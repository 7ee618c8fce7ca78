"""Property-based tests (hypothesis): any JSON in a trace event's fields, any text in a log line,
any attribute value in a span, ends in a table or a TraceError; what is read holds no wrapped
values; what the terminal is shown carries no control character."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from teller.errors import TraceError, printable
from teller.ingest import read_trace
from teller.ingest.logs import read_logs
from teller.ingest.otlp import read_spans

#: Fixed seed and a bounded number of examples: the default run is repeatable and quick.
SETTINGS = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
event_fields = st.fixed_dictionaries(
    {},
    optional={
        key: json_values | st.sampled_from(choices)
        for key, choices in (
            ("ph", ["X", "i", "M", "s", "f", "C", "B"]),
            ("cat", ["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy", "ac2g"]),
            ("name", ["aten::mm", "ncclKernel_AllReduce", "process_name"]),
            ("pid", [0, 1, "Spans"]),
            ("tid", [0, 7]),
            ("ts", [1.5, 1.7e15]),
            ("dur", [0, 3.25]),
            ("args", [{"correlation": 1, "stream": 7}, {"name": "rank 0"}]),
        )
    },
)


@SETTINGS
@given(events=st.lists(event_fields, min_size=1, max_size=8))
def test_any_event_fields_read_or_raise_trace_error(tmp_path_factory, events) -> None:
    path = Path(tmp_path_factory.mktemp("trace")) / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}, allow_nan=True))
    try:
        table = read_trace(path).table
    except TraceError as error:
        assert error.path == str(path)
        return
    assert min(table.column("dur_ns").to_pylist(), default=0) >= 0


@SETTINGS
@given(lines=st.lists(st.text(max_size=80), min_size=1, max_size=10))
def test_any_log_text_reads(tmp_path_factory, lines) -> None:
    path = Path(tmp_path_factory.mktemp("logs")) / "rank0.log"
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    path.write_bytes(data)
    logs = read_logs([path], year=2025)
    assert len(logs) <= data.count(b"\n") + 1  # a record holds one or more lines


@SETTINGS
@given(
    value=json_values,
    key=st.sampled_from(["intValue", "doubleValue", "stringValue", "arrayValue", "kvlistValue"]),
)
def test_any_span_attribute_value_reads_or_raises_trace_error(tmp_path_factory, value, key) -> None:
    span = {
        "name": "llm_request",
        "startTimeUnixNano": "1739446413120000000",
        "endTimeUnixNano": "1739446414120000000",
        "attributes": [{"key": "gen_ai.usage.prompt_tokens", "value": {key: value}}],
    }
    path = Path(tmp_path_factory.mktemp("spans")) / "spans.json"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}))
    try:
        read_spans([path])
    except TraceError as error:
        assert error.path == str(path)


@SETTINGS
@given(text=st.text())
def test_printable_leaves_no_control_character(text) -> None:
    shown = printable(text, one_line=True)
    assert not any(unicodedata.category(c) in ("Cc", "Cs") for c in shown)
    assert not any("\u202a" <= c <= "\u202e" or "\u2066" <= c <= "\u2069" for c in shown)
