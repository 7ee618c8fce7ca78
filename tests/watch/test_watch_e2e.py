"""`teller watch` against the lab's real served model, with a real straggler switched on part-way.

`teller lab serve` serves the lab's Llama on two tensor-parallel ranks with vLLM's `/metrics` and
profiler endpoints; 20 s after serving starts, rank 1 is throttled to 15 % of a CPU (the lab's
straggler). The watcher, started beside it as a user would start it, must take no incident
capture while the objective holds, then report the straggler's rank and fault type from the
capture it triggers, and send one span to the OTLP receiver in this test; the engine killed in the
middle of the next capture must leave no half-written case behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from teller.watch.disk import INCIDENT_FILE, PARTIAL_PREFIX, case_dirs
from watch.servers import OtlpReceiver, attributes

TELLER = [sys.executable, "-c", "import sys; from teller.cli import main; sys.exit(main())"]
FAULT_AT_S = 20.0
#: rank 1 gets 15 % of a CPU (the lab dataset's stragglers: 0.5-0.85): its steps take 5-10x their
#: usual time, far past an objective that normal steps hold even on a loaded machine
INTENSITY = 0.85
OBJECTIVE = "itl_p50<150ms"
STARTUP_TIMEOUT_S = 240.0
REPORT_TIMEOUT_S = 240.0


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def profiler_starts(serve_log: Path) -> int:
    return serve_log.read_text(errors="replace").count("Starting profiler")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.lab
def test_watch_reports_a_straggler_switched_on_part_way(tmp_path):
    receiver = OtlpReceiver()
    serve_dir, out = tmp_path / "serve", tmp_path / "out"
    serve_log, watch_err = tmp_path / "serve.log", tmp_path / "watch.err"
    port = free_port()
    serve = [*TELLER, "lab", "serve", "--out", str(serve_dir), "--duration", "300"]
    serve += ["--rate", "4", "--port", str(port), "--fault", "straggler", "--rank", "1"]
    serve += ["--intensity", f"{INTENSITY:g}", "--window", f"{FAULT_AT_S:g}:100000"]
    server = subprocess.Popen(serve, stdout=serve_log.open("wb"), stderr=subprocess.STDOUT)
    # started beside the engine, before it answers: the watcher waits for it
    watch = [*TELLER, "watch", "--engine", f"http://127.0.0.1:{port}", "--out", str(out)]
    watch += ["--slo", OBJECTIVE, "--profile-dir", str(serve_dir / "profiles")]
    watch += ["--logs", str(serve_log), "--interval", "1s", "--window", "4s", "--for", "6s"]
    watch += ["--capture", "8s", "--reference-capture", "3s", "--min-interval", "0"]
    watch += ["--otlp", receiver.url, "--metrics-port", "0"]
    watcher = subprocess.Popen(
        watch, stdout=(tmp_path / "watch.out").open("wb"), stderr=watch_err.open("wb")
    )
    try:
        run = serve_dir / "run"
        wait_for(lambda: (run / "t0_ns").exists(), STARTUP_TIMEOUT_S, "the lab server to serve")
        t0_s = int((run / "t0_ns").read_text()) / 1e9
        # before the fault: the objective holds, so only the reference capture is taken
        time.sleep(max(0.0, t0_s + FAULT_AT_S - 0.5 - time.time()))
        assert watcher.poll() is None, watch_err.read_text()
        assert case_dirs(out) == [] and "objective broken" not in watch_err.read_text()
        assert profiler_starts(serve_log) == 1, watch_err.read_text()  # the reference's

        (case,) = wait_for(lambda: case_dirs(out), REPORT_TIMEOUT_S, "the first report")
        incident = json.loads((case / INCIDENT_FILE).read_text())
        assert (incident["fault_type"], incident["rank"]) == ("straggler", 1), incident
        assert incident["capture_start_ns"] / 1e9 > t0_s + FAULT_AT_S
        assert incident["reference_end_ns"] / 1e9 < t0_s + FAULT_AT_S  # its steps were normal
        assert any(p.name.startswith("reference-") for p in (case / "traces").iterdir())
        report = json.loads((case / "report.json").read_text())
        assert report["findings"] and (case / "report.txt").is_file()
        (span,) = receiver.spans
        span_attributes = attributes(span)
        assert span_attributes["teller.fault_type"] == "straggler"
        assert span_attributes["teller.rank"] == 1
        assert span_attributes["teller.operator"] == incident["operator"]

        # the objective is still broken: the next capture starts; the engine dies inside it
        wait_for(lambda: profiler_starts(serve_log) >= 3, 120.0, "the next capture")
        os.kill(int((run / "rank0.pid").read_text()), signal.SIGKILL)
        wait_for(lambda: "capture failed" in watch_err.read_text(), 120.0, "the failed capture")
        assert case_dirs(out) == [case]
        assert not [p for p in out.iterdir() if p.name.startswith(PARTIAL_PREFIX)]
        assert len(receiver.spans) == 1
        watcher.send_signal(signal.SIGTERM)
        assert watcher.wait(timeout=60) == 0
    finally:
        stop(watcher)
        stop(server)
        receiver.close()
