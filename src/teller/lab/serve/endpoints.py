"""The engine's HTTP endpoints on rank 0, the ones vLLM's API server has for operations.

`GET /metrics` (Prometheus text), `GET /health`, and, when a profile folder is configured (vLLM:
`VLLM_TORCH_PROFILER_DIR`), `POST /start_profile` and `POST /stop_profile`. It listens on
localhost unless told otherwise. The server runs on its own threads; the engine loop never waits
for it, only the profiler requests wait for the engine loop (`teller.lab.serve.control`).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

from teller.lab.serve.control import ControlError, ProfileControl
from teller.lab.serve.metrics import EngineMetrics


class EngineEndpoints:
    """A threaded HTTP server; `port` is the one bound (ask for 0 to get a free one)."""

    def __init__(
        self, host: str, port: int, metrics: EngineMetrics, control: ProfileControl | None
    ) -> None:
        handler = _handler(metrics, control)
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="engine-endpoints", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(metrics: EngineMetrics, control: ProfileControl | None) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, metrics.exposition(), CONTENT_TYPE_LATEST)
            elif self.path == "/health":
                self._send(200, b"", "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def do_POST(self) -> None:
            self._drain_body()
            actions = {"/start_profile": "start", "/stop_profile": "stop"}
            if self.path not in actions:
                self._send(404, b"not found\n", "text/plain")
                return
            if control is None:
                body = b"profiling is off: start the engine with a profile folder\n"
                self._send(404, body, "text/plain")
                return
            try:
                traces = control.request(actions[self.path])
            except ControlError as error:
                self._send(error.status, f"{error}\n".encode(), "text/plain")
                return
            body = json.dumps({"traces": [str(p) for p in traces]}).encode()
            self._send(200, body, "application/json")

        def _drain_body(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: a scraper polling /metrics every second would flood the engine log."""

    return Handler
