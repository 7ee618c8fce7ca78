"""Small HTTP servers the watch tests talk to: an OTLP/HTTP receiver, a webhook, a fake engine.

The receiver decodes what arrives with the OpenTelemetry protobuf definitions, as a collector
does. The fake engine serves vLLM's metric families from a real prometheus-client registry and
writes two-rank Kineto traces (tests/builders.py) into its profile folder on `/stop_profile`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

TOKEN_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)


class Server:
    """A ThreadingHTTPServer on a free localhost port, serving `handler` on a thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(self, status: int, body: bytes = b"", content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class OtlpReceiver(Server):
    """Accepts OTLP/HTTP protobuf on /v1/traces and /v1/logs, keeping every span and log record."""

    def __init__(self) -> None:
        self.spans: list = []
        self.logs: list = []
        self.hooks: list[dict] = []

        class Handler(_Handler):
            def do_POST(self) -> None:
                owner: OtlpReceiver = self.server.owner  # type: ignore[attr-defined]
                body = self.body()
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest.FromString(body)
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            owner.spans.extend(scope.spans)
                elif self.path == "/v1/logs":
                    request = ExportLogsServiceRequest.FromString(body)
                    for resource in request.resource_logs:
                        for scope in resource.scope_logs:
                            owner.logs.extend(scope.log_records)
                elif self.path == "/hook":
                    owner.hooks.append(json.loads(body))
                else:
                    self.reply(404)
                    return
                self.reply(200, b"", "application/x-protobuf")

        super().__init__(Handler)


def attributes(item) -> dict:
    """A span's or log record's attributes as plain Python values."""
    values = {}
    for attribute in item.attributes:
        value = attribute.value
        values[attribute.key] = getattr(value, value.WhichOneof("value"))
    return values


class FakeEngine(Server):
    """vLLM's /metrics (ITL histogram, waiting gauge) and profiler endpoints, driven by the test.

    Each scrape first records `per_scrape` tokens at `itl_s`; `restart()` begins the counters
    again; `write_traces(profile_dir, capture_number)` runs on each stop; `fail_stop` makes the
    stop answer 500 as an engine that died mid-capture leaves its client with an error.
    """

    def __init__(self, profile_dir: Path, write_traces: Callable[[Path, int], None]) -> None:
        self.profile_dir = profile_dir
        self.write_traces = write_traces
        self.itl_s = 0.02
        self.per_scrape = 30
        self.fail_stop = False
        self.starts = 0
        self.stops = 0
        self.profiling = False
        self.restart()

        class Handler(_Handler):
            def do_GET(self) -> None:
                owner: FakeEngine = self.server.owner  # type: ignore[attr-defined]
                if self.path != "/metrics":
                    self.reply(404)
                    return
                self.reply(200, owner.scrape(), "text/plain; version=0.0.4")

            def do_POST(self) -> None:
                owner: FakeEngine = self.server.owner  # type: ignore[attr-defined]
                self.body()
                if self.path == "/start_profile" and not owner.profiling:
                    owner.starts += 1
                    owner.profiling = True
                    self.reply(200)
                elif self.path == "/stop_profile" and owner.profiling:
                    owner.stops += 1
                    owner.profiling = False
                    if owner.fail_stop:
                        self.reply(500, b"engine core died")
                        return
                    owner.write_traces(owner.profile_dir, owner.stops)
                    self.reply(200)
                else:
                    self.reply(409 if self.path.endswith("_profile") else 404)

        super().__init__(Handler)

    def restart(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("model_name", "engine")
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            buckets=TOKEN_LATENCY_BUCKETS_S,
            registry=self.registry,
        ).labels("fake/llama", "0")
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting.", labels, registry=self.registry
        ).labels("fake/llama", "0")

    def scrape(self) -> bytes:
        for _ in range(self.per_scrape):
            self.itl.observe(self.itl_s)
        return generate_latest(self.registry)
