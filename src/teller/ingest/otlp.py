"""OpenTelemetry spans (OTLP/JSON) → a request table: when each request arrived, waited, ran.

vLLM (`--otlp-traces-endpoint`) exports one `llm_request` span per finished request whose start is
the arrival time and whose `gen_ai.latency.*` attributes (seconds) split the request's life into
queue, prefill and decode; OpenLLMetry and OpenInference write token counts under `llm.*` keys and
newer semantic conventions under `gen_ai.usage.input_tokens`/`output_tokens`. All map to one table,
one row per request span:

| column           | type   | meaning                                                        |
|------------------|--------|----------------------------------------------------------------|
| request_id       | string | `gen_ai.request.id` (else `gen_ai.response.id`, else span id)  |
| request_key      | string | the id without engine suffixes (joins logs, see `request_key`) |
| trace_id/span_id | string | the span's OTel ids                                            |
| name             | string | span name                                                      |
| model            | string | `gen_ai.response.model` / `gen_ai.request.model` / `llm.model_name` |
| service          | string | resource `service.name`                                        |
| arrival_ns       | int64  | span start, unix ns                                            |
| end_ns           | int64  | span end, unix ns                                              |
| queue_ns, ttft_ns, prefill_ns, decode_ns, inference_ns, e2e_ns,           | int64 | -1 if absent |
| scheduler_ns, model_forward_ns, model_execute_ns                          |       |              |
| input_tokens, output_tokens, cached_tokens, max_tokens, n | int64 | -1 if absent           |
| finish_reason    | string | first of `gen_ai.response.finish_reasons`                      |
| file             | string | the file it came from                                          |

A file holds one OTLP export object (`{"resourceSpans": [...]}`) or one per line (the collector's
file exporter); a directory is searched for `*.json` / `*.jsonl`. A file that is not OTLP/JSON,
or a span without valid start/end times, raises `TraceError` naming the file and the span.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pyarrow as pa

from teller.errors import TraceError
from teller.ingest.files import guard_reader
from teller.ingest.logs.table import request_key

NS_PER_S = 1_000_000_000

#: Latency attributes (seconds) → column. First key present wins.
LATENCY_KEYS: dict[str, tuple[str, ...]] = {
    "queue_ns": ("gen_ai.latency.time_in_queue", "llm.latency.time_in_queue"),
    "ttft_ns": ("gen_ai.latency.time_to_first_token", "llm.latency.time_to_first_token"),
    "prefill_ns": ("gen_ai.latency.time_in_model_prefill",),
    "decode_ns": ("gen_ai.latency.time_in_model_decode",),
    "inference_ns": ("gen_ai.latency.time_in_model_inference",),
    "e2e_ns": ("gen_ai.latency.e2e", "llm.latency.e2e"),
    "scheduler_ns": ("gen_ai.latency.time_in_scheduler",),
    "model_forward_ns": ("gen_ai.latency.time_in_model_forward",),
    "model_execute_ns": ("gen_ai.latency.time_in_model_execute",),
}
#: Count attributes → column, across the vLLM, semantic-convention and llm.* vocabularies.
COUNT_KEYS: dict[str, tuple[str, ...]] = {
    "input_tokens": (
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.prompt_tokens",
        "llm.usage.prompt_tokens",
        "llm.token_count.prompt",
    ),
    "output_tokens": (
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.completion_tokens",
        "llm.usage.completion_tokens",
        "llm.token_count.completion",
    ),
    "cached_tokens": (
        "gen_ai.usage.cached_tokens",
        "gen_ai.usage.cache_read_input_tokens",
        "llm.token_count.prompt_details.cache_read",
    ),
    "max_tokens": ("gen_ai.request.max_tokens", "llm.request.max_tokens"),
    "n": ("gen_ai.request.n", "gen_ai.usage.num_sequences"),
}
ID_KEYS = ("gen_ai.request.id", "gen_ai.response.id", "llm.request.id")
MODEL_KEYS = (
    "gen_ai.response.model",
    "gen_ai.request.model",
    "llm.model_name",
    "llm.request.model",
)
#: A span is a request span if it has this name or any attribute with one of these prefixes.
REQUEST_SPAN_NAMES = frozenset({"llm_request"})
_REQUEST_PREFIXES = ("gen_ai.latency.", "gen_ai.usage.", "llm.token_count.", "llm.usage.")

_COLUMNS = (
    ["request_id", "request_key", "trace_id", "span_id", "name", "model", "service"],
    ["arrival_ns", "end_ns", *LATENCY_KEYS, *COUNT_KEYS],
    ["finish_reason", "file"],
)
REQUEST_SCHEMA = pa.schema(
    [pa.field(name, pa.string()) for name in _COLUMNS[0]]
    + [pa.field(name, pa.int64()) for name in _COLUMNS[1]]
    + [pa.field(name, pa.string()) for name in _COLUMNS[2]]
)


@dataclass
class SpanSource:
    path: str
    spans: int = 0
    request_spans: int = 0
    skipped: dict[str, int] = field(default_factory=dict)


@dataclass
class RequestTable:
    """One row per request span (REQUEST_SCHEMA), plus what each file held."""

    table: pa.Table
    sources: list[SpanSource]

    def __len__(self) -> int:
        return self.table.num_rows

    def column(self, name: str) -> list:
        return self.table.column(name).to_pylist()


#: Largest span file read (after gunzip); exports are small, so a larger one is not spans.
MAX_SPAN_FILE_BYTES = 2 << 30
#: Latencies beyond this many seconds (about 290 years) do not fit int64 ns and are read as unknown.
_MAX_LATENCY_S = 9.2e9


def read_spans(paths: Iterable[str | Path]) -> RequestTable:
    """Read OTLP/JSON files (or directories of them) into one request table."""
    paths = list(paths)
    files = _find_span_files(paths)
    if not files:
        shown = ", ".join(str(p) for p in paths)
        raise TraceError(shown, "no OTLP JSON files found (looked for *.json, *.jsonl)")
    rows: list[dict] = []
    sources = []
    for path in files:
        file_rows, source = _read_file(path)
        rows.extend(file_rows)
        sources.append(source)
    seen = frozenset(row["request_id"] for row in rows)
    for row in rows:  # V1's engine suffix joins an id only against the others read
        row["request_key"] = request_key(row["request_id"], seen)
    columns = {name: [row[name] for row in rows] for name in REQUEST_SCHEMA.names}
    return RequestTable(pa.table(columns, schema=REQUEST_SCHEMA), sources)


def _find_span_files(paths: list[str | Path]) -> list[Path]:
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found.extend(
                p
                for p in sorted(path.rglob("*"))
                if p.is_file() and p.name.endswith((".json", ".jsonl", ".json.gz", ".jsonl.gz"))
            )
        else:
            found.append(path)
    return found


def _read_file(path: Path) -> tuple[list[dict], SpanSource]:
    with guard_reader(path, "OTLP/JSON spans"):
        return _read_spans_file(path)


def _read_spans_file(path: Path) -> tuple[list[dict], SpanSource]:
    try:
        if path.stat().st_size > MAX_SPAN_FILE_BYTES:
            raise TraceError(
                path, f"larger than the {MAX_SPAN_FILE_BYTES} bytes read per span file"
            )
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = _gunzip(path, data)
    except OSError as error:
        raise TraceError(path, f"cannot read span file: {error.strerror or error}") from error
    except (EOFError, zlib.error) as error:
        raise TraceError(path, f"corrupt gzip: {error}") from error
    exports = _parse_exports(path, data)
    source = SpanSource(path=str(path))
    rows: list[dict] = []
    for e, export in enumerate(exports):
        resource_spans = export.get("resourceSpans") if isinstance(export, dict) else None
        if not isinstance(resource_spans, list):
            raise TraceError(path, "not OTLP/JSON: no resourceSpans list", f"object {e}")
        for r, resource in enumerate(resource_spans):
            resource = _object(path, resource, f"resourceSpans[{r}]")
            resource_attrs = _attributes(path, resource.get("resource", {}), f"resourceSpans[{r}]")
            service = str(resource_attrs.get("service.name", ""))
            scopes = resource.get("scopeSpans", resource.get("instrumentationLibrarySpans", []))
            for s, scope in enumerate(_array(path, scopes, f"resourceSpans[{r}].scopeSpans")):
                where = f"resourceSpans[{r}].scopeSpans[{s}]"
                spans = _object(path, scope, where).get("spans", [])
                for k, span in enumerate(_array(path, spans, f"{where}.spans")):
                    where = f"resourceSpans[{r}].scopeSpans[{s}].spans[{k}]"
                    span = _object(path, span, where)
                    source.spans += 1
                    row = _request_row(path, span, where, service)
                    if row is None:
                        source.skipped["not_a_request_span"] = (
                            source.skipped.get("not_a_request_span", 0) + 1
                        )
                        continue
                    source.request_spans += 1
                    rows.append(row)
    return rows, source


def _gunzip(path: Path, data: bytes) -> bytes:
    """Inflate in bounded steps: a stream that expands absurdly is refused before it is held."""
    decompressor = zlib.decompressobj(wbits=31)
    parts, total = [], 0
    chunk = data
    while True:
        piece = decompressor.decompress(chunk, 1 << 22)
        parts.append(piece)
        total += len(piece)
        consumed = len(data) - len(decompressor.unconsumed_tail)
        if total > MAX_SPAN_FILE_BYTES or (total > 64 << 20 and total > 200 * consumed):
            raise TraceError(path, "gzip stream inflates absurdly (a gzip bomb?): not a span file")
        if decompressor.eof:
            return b"".join(parts)
        chunk = decompressor.unconsumed_tail
        if not chunk and not piece:
            raise EOFError("compressed file ended before the end-of-stream marker")


def _object(path: Path, value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise TraceError(path, f"a JSON {type(value).__name__} where an object was expected", where)
    return value


def _array(path: Path, value: object, where: str) -> list:
    if not isinstance(value, list):
        raise TraceError(path, f"a JSON {type(value).__name__} where a list was expected", where)
    return value


def _parse_exports(path: Path, data: bytes) -> list:
    if not data.strip():
        raise TraceError(path, "empty span file")
    try:
        return [orjson.loads(data)]
    except orjson.JSONDecodeError as whole_error:
        exports = []
        for number, line in enumerate(data.splitlines(), 1):
            if not line.strip():
                continue
            try:
                exports.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                raise TraceError(
                    path, f"not OTLP/JSON: {whole_error}", f"line {number}"
                ) from whole_error
        return exports


def _request_row(path: Path, span: dict, where: str, service: str) -> dict | None:
    attrs = _attributes(path, span, where)
    name = str(span.get("name", ""))
    if name not in REQUEST_SPAN_NAMES and not any(k.startswith(_REQUEST_PREFIXES) for k in attrs):
        return None
    start_ns = _unix_ns(path, span, "startTimeUnixNano", where)
    end_ns = _unix_ns(path, span, "endTimeUnixNano", where)
    if end_ns < start_ns:
        raise TraceError(path, "span ends before it starts", where)
    request_id = _first(attrs, ID_KEYS)
    span_id = str(span.get("spanId", ""))
    request_id = str(request_id) if request_id is not None else span_id
    row: dict = {
        "request_id": request_id,
        "trace_id": str(span.get("traceId", "")),
        "span_id": span_id,
        "name": name,
        "model": str(_first(attrs, MODEL_KEYS) or ""),
        "service": service,
        "arrival_ns": start_ns,
        "end_ns": end_ns,
        "file": str(path),
    }
    for column, keys in LATENCY_KEYS.items():
        seconds = _first(attrs, keys)
        in_range = _is_number(seconds) and abs(seconds) < _MAX_LATENCY_S  # type: ignore[operator]
        row[column] = round(float(seconds) * NS_PER_S) if in_range else -1  # type: ignore[arg-type]
    if row["e2e_ns"] < 0:
        row["e2e_ns"] = end_ns - start_ns
    for column, keys in COUNT_KEYS.items():
        count = _first(attrs, keys)
        row[column] = int(count) if _is_number(count) else -1
    reasons = attrs.get("gen_ai.response.finish_reasons")
    if isinstance(reasons, list):
        row["finish_reason"] = str(reasons[0]) if reasons else None
    else:
        row["finish_reason"] = str(reasons) if reasons is not None else None
    return row


def _attributes(path: Path, holder: dict, where: str) -> dict:
    """`[{key, value: {stringValue|intValue|doubleValue|boolValue|arrayValue}}]` → a dict."""
    raw = holder.get("attributes", []) if isinstance(holder, dict) else None
    if not isinstance(raw, list):
        raise TraceError(path, "attributes is not a list", where)
    out = {}
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or "key" not in item:
            raise TraceError(path, "attribute without a key", f"{where}.attributes[{i}]")
        out[item["key"]] = _value(item.get("value", {}))
    return out


def _value(value: dict) -> object:
    if not isinstance(value, dict) or not value:
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:  # int64 travels as a JSON string in OTLP/JSON
        try:
            number = int(value["intValue"])
        except (TypeError, ValueError, OverflowError):
            return None
        return number if -(2**63) <= number < 2**63 else None
    if "doubleValue" in value:
        try:
            return float(value["doubleValue"])
        except (TypeError, ValueError):
            return None
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        values = value["arrayValue"].get("values") if isinstance(value["arrayValue"], dict) else []
        return [_value(v) for v in values] if isinstance(values, list) else None
    if "kvlistValue" in value:
        pairs = value["kvlistValue"].get("values") if isinstance(value["kvlistValue"], dict) else []
        if not isinstance(pairs, list):
            return None
        return {
            str(kv.get("key")): _value(kv.get("value", {})) for kv in pairs if isinstance(kv, dict)
        }
    return None


def _unix_ns(path: Path, span: dict, key: str, where: str) -> int:
    value = span.get(key)
    try:
        ns = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise TraceError(path, f"{key} missing or not an integer ({value!r})", where) from None
    if not 0 < ns < 2**63:
        raise TraceError(path, f"{key} is not a unix time in int64 ns ({value!r:.40})", where)
    return ns


def _first(attrs: dict, keys: tuple[str, ...]) -> object:
    for key in keys:
        value = attrs.get(key)
        if value is not None:
            return value
    return None


def _is_number(value: object) -> bool:
    """A finite number small enough for an int64 count or nanosecond latency."""
    return isinstance(value, int | float) and not isinstance(value, bool) and abs(value) < 2**53
