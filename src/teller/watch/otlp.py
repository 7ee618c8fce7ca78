"""Each incident as one OpenTelemetry span and one log record, sent over OTLP/HTTP.

The span covers the capture's interval, so a trace backend shows it on the service's timeline
beside the requests it slowed; the log record (same trace and span ids) carries the explanation
for log-first backends. Attributes: `teller.fault_type`, `teller.rank`, `teller.operator`,
`teller.step` and what else the verdict says, plus `gen_ai.request.model` / `gen_ai.system` where
the engine's metrics name the model and engine. Export is synchronous (one incident is rare and
small) and a failure to export is reported, never fatal.
"""

from __future__ import annotations

from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from teller.watch.incident import Incident

SERVICE_NAME = "teller-watch"
SPAN_NAME = "teller.incident"
#: An unreachable receiver holds the watcher (never the engine) this long per signal, once.
EXPORT_TIMEOUT_S = 5.0


def incident_attributes(incident: Incident) -> dict[str, str | int | float]:
    """The span's and log record's attributes (OpenTelemetry drops None values, so leave them out)."""
    values: dict[str, str | int | float | None] = {
        "teller.fault_type": incident.fault_type or "unknown",
        "teller.rank": incident.rank,
        "teller.operator": incident.operator,
        "teller.step": incident.step,
        "teller.view": incident.view,
        "teller.method": incident.method,
        "teller.case_dir": incident.case_dir,
        "teller.anomalous_steps": incident.anomalous_steps,
        "teller.objective": ", ".join(incident.objectives_broken),
        "teller.explanation": incident.explanation or incident.summary,
        "teller.engine_url": incident.engine_url,
        "gen_ai.request.model": incident.model_name,
        "gen_ai.system": incident.engine,
    }
    for objective, value in incident.observed.items():
        values[f"teller.observed.{objective.split('<')[0]}"] = value
    return {key: value for key, value in values.items() if value is not None}


class OtlpExporter:
    """Spans to `URL/v1/traces` and log records to `URL/v1/logs` of an OTLP/HTTP receiver."""

    def __init__(self, url: str) -> None:
        base = url.rstrip("/")
        for suffix in ("/v1/traces", "/v1/logs"):
            base = base.removesuffix(suffix)
        resource = Resource.create({"service.name": SERVICE_NAME})
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(
            SimpleSpanProcessor(
                OTLPSpanExporter(endpoint=f"{base}/v1/traces", timeout=EXPORT_TIMEOUT_S)
            )
        )
        self.logger_provider = LoggerProvider(resource=resource)
        self.logger_provider.add_log_record_processor(
            SimpleLogRecordProcessor(
                OTLPLogExporter(endpoint=f"{base}/v1/logs", timeout=EXPORT_TIMEOUT_S)
            )
        )
        self.tracer = self.tracer_provider.get_tracer("teller.watch")
        self.logger = self.logger_provider.get_logger("teller.watch")

    def export(self, incident: Incident) -> None:
        attributes = incident_attributes(incident)
        span = self.tracer.start_span(
            SPAN_NAME,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=incident.capture_start_ns,
        )
        span.set_status(Status(StatusCode.ERROR, incident.one_line()))
        self.logger.emit(
            timestamp=incident.capture_end_ns,
            context=set_span_in_context(span),
            severity_number=SeverityNumber.WARN,
            severity_text="WARN",
            body=incident.explanation or incident.summary,
            attributes=attributes,
            event_name=SPAN_NAME,
        )
        span.end(end_time=incident.capture_end_ns)

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.logger_provider.shutdown()
