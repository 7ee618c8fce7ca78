"""teller's own `/metrics`: incidents and the objectives, where Prometheus already scrapes.

`teller_incidents_total{fault_type,rank}` counts verdicts; `teller_last_verdict_info` (labels:
fault type, rank, operator, objective; value 1) and the `teller_last_verdict_*` gauges say what
the last one found; `teller_watch_objective_value`/`_broken` and `teller_watch_engine_up` show
what the watcher sees between incidents. Served by prometheus-client's own HTTP server, on
localhost unless told otherwise.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from teller.watch.incident import Incident
from teller.watch.slo import BROKEN, Check


class WatchMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.incidents = Counter(
            "teller_incidents",
            "Verdicts on captures triggered by a broken objective.",
            ["fault_type", "rank"],
            registry=registry,
        )
        self.last_info = Gauge(
            "teller_last_verdict_info",
            "The last verdict (value 1): its fault type, rank, operator and broken objective.",
            ["fault_type", "rank", "operator", "objective"],
            registry=registry,
        )
        self.last_time = Gauge(
            "teller_last_verdict_timestamp_seconds",
            "When the last verdict's capture ended (unix seconds).",
            registry=registry,
        )
        self.last_step = Gauge(
            "teller_last_verdict_step",
            "Step of the last verdict's worst finding.",
            registry=registry,
        )
        self.last_anomalous = Gauge(
            "teller_last_verdict_anomalous_steps",
            "Anomalous steps the last verdict found in its capture.",
            registry=registry,
        )
        self.captures = Counter(
            "teller_watch_captures", "Captures by outcome.", ["outcome"], registry=registry
        )
        self.objective_value = Gauge(
            "teller_watch_objective_value",
            "Each objective's value over the window (seconds for latencies).",
            ["objective"],
            registry=registry,
        )
        self.objective_broken = Gauge(
            "teller_watch_objective_broken",
            "1 while the objective is broken, 0 while it holds.",
            ["objective"],
            registry=registry,
        )
        self.engine_up = Gauge(
            "teller_watch_engine_up",
            "1 when the last scrape of the engine worked.",
            registry=registry,
        )
        self._server = None

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the HTTP server; the port it listens on."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        return int(self._server.server_port)

    def checks(self, checks: list[Check]) -> None:
        for check in checks:
            if check.observed is not None:
                self.objective_value.labels(check.objective.text).set(check.observed)
            self.objective_broken.labels(check.objective.text).set(int(check.state == BROKEN))

    def incident(self, incident: Incident) -> None:
        fault_type = incident.fault_type or "unknown"
        rank = "" if incident.rank is None else str(incident.rank)
        self.incidents.labels(fault_type, rank).inc()
        self.last_info.clear()
        objective = (
            incident.objectives_broken[0].split(":")[0] if incident.objectives_broken else ""
        )
        self.last_info.labels(fault_type, rank, incident.operator or "", objective).set(1)
        self.last_time.set(incident.capture_end_ns / 1e9)
        self.last_step.set(-1 if incident.step is None else incident.step)
        self.last_anomalous.set(incident.anomalous_steps)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
