"""The watch loop: poll the engine's metrics, judge the objectives, capture, analyse, export.

One thread does it all, in order, so there is never more than one capture and the engine is only
ever asked for what one capture costs: scrapes are one GET each `interval_s`, captures at most one
per `min_interval_s`, and analysis happens in this process (at the priority `watch` was given),
not in the engine's. An engine that stops answering is polled on until it is back; one whose
counters began again (a restart) starts a fresh window and a fresh reference.
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from teller.errors import TellerError
from teller.rca.verdict import Verdict
from teller.watch import disk
from teller.watch.capture import capture
from teller.watch.incident import Incident, make_incident
from teller.watch.own_metrics import WatchMetrics
from teller.watch.persistence import StateDurations
from teller.watch.profiler import CaptureError, EngineProfiler
from teller.watch.ratelimit import CaptureBudget
from teller.watch.reference import Reference, add_reference, store_reference
from teller.watch.scrape import EngineUnreachable, MetricsFormatError, fetch_metrics, parse_metrics
from teller.watch.slo import BROKEN, HELD, Check, Objective, check
from teller.watch.window import MetricsWindow


@dataclass
class WatchConfig:
    """Everything `teller watch` is told; the defaults are what the command line defaults to."""

    engine_url: str  # the engine's base URL: URL/metrics, URL/start_profile, URL/stop_profile
    objectives: list[Objective]
    out_dir: Path
    profile_dir: Path  # where the engine writes its traces (vLLM: VLLM_TORCH_PROFILER_DIR)
    log_files: list[Path] = field(default_factory=list)  # the engine's log files, if any
    interval_s: float = 5.0
    window_s: float = 60.0
    min_samples: int = 20
    sustain_s: float = 15.0  # broken (or, for a reference, held) this long before a capture
    capture_s: float = 5.0
    min_interval_s: float = 600.0  # at most one incident capture per this many seconds
    keep: int = 20  # cases kept on disk
    reference: bool = True
    reference_capture_s: float = 3.0  # normal steps to compare against: a few seconds is plenty
    reference_every_s: float = 3600.0
    otlp_url: str | None = None
    metrics_port: int | None = None  # teller's own /metrics; None: not served
    metrics_host: str = "127.0.0.1"
    webhook_url: str | None = None
    method: str = "model"
    model_dir: Path | None = None
    max_incidents: int | None = None  # stop after this many reports (scripts, tests)


class Watcher:
    def __init__(self, config: WatchConfig, status: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.status = status or _status
        self.engine_url = config.engine_url.rstrip("/").removesuffix("/metrics")
        self.profiler = EngineProfiler(self.engine_url)
        self.window = MetricsWindow(config.window_s)
        self.budget = CaptureBudget(config.min_interval_s)
        self.reference_budget = CaptureBudget(config.reference_every_s)
        self.reference: Reference | None = None
        self.metrics = WatchMetrics()
        self.incidents: list[Incident] = []
        self.durations = StateDurations()
        self._engine_up: bool | None = None
        self._otlp = None
        self.metrics_port: int | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def run(self) -> int:
        """Watch until interrupted (SIGINT, SIGTERM) or `max_incidents` reports; exit status 0."""
        self.open()
        try:
            with _interrupt_on_sigterm():
                while not self._done():
                    self.poll_once()
                    time.sleep(self.config.interval_s)
        except KeyboardInterrupt:
            self.status("stopped")
        finally:
            self.close()
        return 0

    def open(self) -> None:
        """Prepare the output folder and start the exporters (teller's /metrics, OTLP)."""
        config = self.config
        config.out_dir.mkdir(parents=True, exist_ok=True)
        for stale in disk.remove_partials(config.out_dir):
            self.status(f"removed a capture a previous watcher left unfinished: {stale.name}")
        if config.otlp_url:
            from teller.watch.otlp import OtlpExporter

            self._otlp = OtlpExporter(config.otlp_url)
        if config.metrics_port is not None:
            self.metrics_port = self.metrics.serve(config.metrics_port, config.metrics_host)
            where = f"http://{config.metrics_host}:{self.metrics_port}/metrics"
            self.status(f"teller's metrics on {where}")
        shown = ", ".join(o.text for o in config.objectives)
        self.status(f"watching {self.engine_url} for {shown}; cases in {config.out_dir}")

    def close(self) -> None:
        self.metrics.shutdown()
        if self._otlp is not None:
            self._otlp.shutdown()
            self._otlp = None

    def _done(self) -> bool:
        limit = self.config.max_incidents
        return limit is not None and len(self.incidents) >= limit

    # -- one poll --------------------------------------------------------------------------------
    def poll_once(self) -> list[Check]:
        """Scrape, judge, and capture when an objective is broken (or a reference is due)."""
        try:
            scrape = parse_metrics(fetch_metrics(f"{self.engine_url}/metrics"))
        except (EngineUnreachable, MetricsFormatError) as error:
            self._engine_state(False, str(error))
            return []
        self._engine_state(True, "")
        if self.window.add(scrape):
            self.status("the engine's counters began again (a restart): new window and reference")
            self.reference = None
            self.reference_budget = CaptureBudget(self.config.reference_every_s)
        checks = check(self.config.objectives, self.window, self.config.min_samples)
        self.metrics.checks(checks)
        for changed in self.durations.update(checks):
            self.status(changed.describe())
        sustained = [c for c in checks if self.durations.lasted_s(c) >= self.config.sustain_s]
        broken = [c for c in sustained if c.state == BROKEN]
        if broken and self.budget.allows():
            self.capture_incident(broken)
        elif self._reference_due(checks, sustained):
            self.capture_reference()
        return checks

    def _reference_due(self, checks: list[Check], sustained: list[Check]) -> bool:
        """Every objective held over a whole window for `sustain_s`, and no reference lately."""
        if not self.config.reference or not checks or len(sustained) < len(checks):
            return False
        return all(c.state == HELD for c in checks) and self.reference_budget.allows()

    def _engine_state(self, up: bool, reason: str) -> None:
        self.metrics.engine_up.set(int(up))
        if up != self._engine_up:
            self.status(
                f"engine is {'up' if up else 'unreachable'}{': ' + reason if reason else ''}"
            )
        self._engine_up = up

    # -- captures --------------------------------------------------------------------------------
    def capture_reference(self) -> Reference | None:
        self.reference_budget.spend()
        partial = disk.partial_dir(self.config.out_dir, f"reference-{_stamp()}")
        try:
            captured = capture(
                self.profiler,
                self.config.profile_dir,
                self.config.log_files,
                self.config.reference_capture_s,
                partial,
            )
            self.reference = store_reference(partial, captured, self.config.out_dir)
        except CaptureError as error:
            self.metrics.captures.labels("failed").inc()
            self.status(f"reference capture failed: {error}")
            return None
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        self.metrics.captures.labels("reference").inc()
        self.status(f"reference capture taken ({len(self.reference.files())} files)")
        return self.reference

    def capture_incident(self, broken: list[Check]) -> Incident | None:
        """Capture, analyse and export one incident; None when the capture failed."""
        self.budget.spend()
        name = _stamp()
        partial = disk.partial_dir(self.config.out_dir, name)
        final = self.config.out_dir / name
        self.status(f"objective broken ({'; '.join(c.describe() for c in broken)}): capturing")
        try:
            captured = capture(
                self.profiler,
                self.config.profile_dir,
                self.config.log_files,
                self.config.capture_s,
                partial,
            )
            if self.reference is not None:
                add_reference(self.reference, partial)
            verdict = self._analyze(partial)
            latest = self.window.latest
            incident = make_incident(
                verdict,
                final,
                self.engine_url,
                broken,
                captured.start_wall_ns,
                captured.end_wall_ns,
                (self.reference.start_wall_ns, self.reference.end_wall_ns)
                if self.reference is not None
                else None,
                latest.labels if latest is not None else {},
                _engine_kind(latest.histograms if latest is not None else {}),
            )
            incident.write(partial / disk.INCIDENT_FILE)
            disk.finish(partial, final)
        except CaptureError as error:
            self.metrics.captures.labels("failed").inc()
            self.status(f"capture failed, nothing written: {error}")
            return None
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        for removed in disk.prune_cases(self.config.out_dir, self.config.keep):
            self.status(f"removed the oldest case {removed.name} (keeping {self.config.keep})")
        self.metrics.captures.labels("incident").inc()
        self._export(incident)
        self.incidents.append(incident)
        print(f"{final}: {incident.one_line()}", flush=True)
        return incident

    def _analyze(self, case_dir: Path) -> Verdict:
        """The verdict on the capture; an analysis that fails still leaves its one-line reason."""
        from teller.watch.analyze import analyze_case  # the pipeline loads on the first incident

        try:
            return analyze_case(case_dir, self.config.method, self.config.model_dir)
        except TellerError as error:
            reason = str(error)
        except Exception as error:  # a long-running watcher outlives one unreadable capture
            traceback.print_exc(file=sys.stderr)
            reason = f"{type(error).__name__}: {error}"
        self.status(f"analysis failed: {reason}")
        return Verdict(
            inputs=[str(case_dir)],
            ranks=[],
            method="none",
            summary=f"analysis failed: {reason}",
            findings=[],
            steps=[],
        )

    def _export(self, incident: Incident) -> None:
        self.metrics.incident(incident)
        if self._otlp is not None:
            try:
                self._otlp.export(incident)
            except Exception as error:  # the exporter's own errors must not stop the watcher
                self.status(f"OTLP export failed: {error}")
        if self.config.webhook_url:
            from teller.watch.webhook import post_incident

            try:
                post_incident(self.config.webhook_url, incident)
            except TellerError as error:
                self.status(str(error))


def watch(config: WatchConfig) -> int:
    return Watcher(config).run()


def _engine_kind(histograms: dict) -> str | None:
    for prefix in ("vllm", "sglang"):
        if any(name.startswith(f"{prefix}:") for name in histograms):
            return prefix
    return None


def _stamp() -> str:
    """A UTC capture time that sorts as text: case folder names."""
    now = datetime.now(UTC)
    return now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"


def _status(message: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"teller watch {stamp}: {message}", file=sys.stderr, flush=True)


@contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM (a service manager stopping us) ends the watch through the same clean-up as
    Ctrl-C: a capture in flight asks the engine to stop profiling and its partial folder goes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
