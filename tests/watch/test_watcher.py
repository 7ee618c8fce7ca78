"""The watch loop against a fake engine: when it captures, what a case holds, where verdicts go.

The engine here is an HTTP server with vLLM's metric families and profiler endpoints, whose traces
are built in code (tests/builders.py); tests/watch/test_watch_e2e.py runs the same loop against
the lab's real served model under a real fault.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from builders import write_run
from teller.cli import main
from teller.watch import WatchConfig, Watcher, parse_slo
from teller.watch import capture as capture_module
from teller.watch.disk import INCIDENT_FILE, case_dirs
from teller.watch.reference import REFERENCE_DIR
from watch.servers import FakeEngine, OtlpReceiver, attributes


def write_traces(profile_dir: Path, number: int, late_rank: int | None) -> None:
    """Two ranks' traces of one capture, on the wall clock as an engine's are (the steps just
    before the stop); `late_rank` reaches every all-reduce 3 ms late."""
    scratch = profile_dir.parent / f"scratch-{number}"
    scratch.mkdir(parents=True, exist_ok=True)
    late = {(late_rank, step): 3_000 for step in range(12)} if late_rank is not None else None
    now_us = time.time_ns() / 1e3
    for path in write_run(scratch, late=late):
        document = json.loads(path.read_text())
        for event in document["traceEvents"]:
            event["ts"] += now_us
        target = profile_dir / f"fake-{path.stem.split('.')[0]}.{number}.pt.trace.json"
        target.write_text(json.dumps(document))


@pytest.fixture
def receiver():
    server = OtlpReceiver()
    yield server
    server.close()


@pytest.fixture
def engine(tmp_path, monkeypatch):
    monkeypatch.setattr(capture_module, "SETTLE_S", 0.05)
    profile_dir = tmp_path / "profiles"
    profile_dir.mkdir()
    fake = FakeEngine(profile_dir, lambda folder, n: write_traces(folder, n, fake.late_rank))
    fake.late_rank = None
    yield fake
    fake.close()


def watcher_for(engine: FakeEngine, out: Path, receiver: OtlpReceiver | None = None, **changes):
    settings = dict(
        engine_url=engine.url,
        objectives=parse_slo("itl_p90<100ms,waiting<50"),
        out_dir=out,
        profile_dir=engine.profile_dir,
        interval_s=0.0,
        window_s=0.0,  # each scrape against the one before
        min_samples=20,
        sustain_s=0.0,
        capture_s=0.05,
        min_interval_s=600.0,
        method="localizer",
        otlp_url=receiver.url if receiver else None,
        webhook_url=f"{receiver.url}/hook" if receiver else None,
        metrics_port=0,
    )
    settings.update(changes)
    watcher = Watcher(WatchConfig(**settings), status=lambda message: None)
    watcher.open()
    return watcher


def own_metrics(watcher: Watcher) -> str:
    url = f"http://127.0.0.1:{watcher.metrics_port}/metrics"
    with urllib.request.urlopen(url) as response:
        return response.read().decode()


def test_no_capture_while_the_objectives_hold(engine, tmp_path):
    watcher = watcher_for(engine, tmp_path / "out", reference=False)
    for _ in range(5):
        checks = watcher.poll_once()
    assert [c.state for c in checks] == ["held", "held"]
    assert engine.starts == 0 and case_dirs(tmp_path / "out") == []
    watcher.close()


def test_a_broken_objective_gives_one_case_one_span_one_log_record_and_one_webhook(
    engine, receiver, tmp_path
):
    out = tmp_path / "out"
    watcher = watcher_for(engine, out, receiver)
    watcher.poll_once()
    watcher.poll_once()  # two scrapes: a window, every objective held, so a reference is taken
    assert engine.starts == 1 and (out / REFERENCE_DIR / "traces").is_dir()
    assert case_dirs(out) == []
    engine.itl_s, engine.late_rank = 0.4, 1  # rank 1 now reaches every all-reduce late
    for _ in range(4):
        watcher.poll_once()
    (case,) = case_dirs(out)
    assert engine.starts == 2  # one incident capture: the budget allows one per 10 minutes
    traces = sorted(p.name for p in (case / "traces").iterdir())
    assert traces == [
        "fake-rank0.2.pt.trace.json",
        "fake-rank1.2.pt.trace.json",
        "reference-fake-rank0.1.pt.trace.json",
        "reference-fake-rank1.1.pt.trace.json",
    ]
    assert list(engine.profile_dir.iterdir()) == []  # moved out of the engine's folder
    incident = json.loads((case / INCIDENT_FILE).read_text())
    report = json.loads((case / "report.json").read_text())
    assert (case / "report.txt").read_text().strip()
    assert incident["rank"] == 1 and incident["fault_type"] is not None
    assert incident["objectives_broken"][0].startswith("itl_p90<100ms: broken (")
    assert incident["model_name"] == "fake/llama" and incident["engine"] == "vllm"
    assert report["schema"] == "teller.verdict/1"

    (span,) = receiver.spans
    span_attributes = attributes(span)
    assert span.name == "teller.incident"
    assert span_attributes["teller.rank"] == 1
    assert span_attributes["teller.fault_type"] == incident["fault_type"]
    assert span_attributes["teller.operator"] == incident["operator"]
    assert span_attributes["teller.step"] == incident["step"]
    assert span_attributes["gen_ai.request.model"] == "fake/llama"
    assert span.start_time_unix_nano == incident["capture_start_ns"]
    (record,) = receiver.logs
    assert record.span_id == span.span_id and attributes(record)["teller.rank"] == 1
    (hook,) = receiver.hooks
    assert hook["teller"] == "incident" and hook["case_dir"] == str(case)

    exposed = own_metrics(watcher)
    fault_type = incident["fault_type"]
    assert f'teller_incidents_total{{fault_type="{fault_type}",rank="1"}} 1.0' in exposed
    assert 'teller_watch_objective_broken{objective="itl_p90<100ms"} 1.0' in exposed
    assert 'teller_watch_captures_total{outcome="reference"} 1.0' in exposed
    watcher.close()


def test_an_engine_that_dies_mid_capture_leaves_no_case_and_is_watched_on(engine, tmp_path):
    out = tmp_path / "out"
    watcher = watcher_for(engine, out, reference=False, min_interval_s=0.0)
    engine.itl_s, engine.fail_stop = 0.4, True
    watcher.poll_once()
    watcher.poll_once()
    assert engine.stops == 1
    assert list(out.iterdir()) == []  # neither a case nor a partial folder
    assert 'teller_watch_captures_total{outcome="failed"} 1.0' in own_metrics(watcher)
    engine.fail_stop = False
    watcher.poll_once()
    assert len(case_dirs(out)) == 1
    watcher.close()


def test_a_restarted_engine_gets_a_new_window_and_a_new_reference(engine, tmp_path):
    out = tmp_path / "out"
    watcher = watcher_for(engine, out)
    watcher.poll_once()
    watcher.poll_once()
    assert watcher.reference is not None and engine.starts == 1
    engine.restart()
    checks = watcher.poll_once()
    assert watcher.reference is None and next(c.state for c in checks) == "unknown"
    watcher.poll_once()  # a second scrape of the new process: judged again, reference again
    assert watcher.reference is not None and engine.starts == 2
    watcher.close()


def test_an_unreachable_engine_is_polled_on_without_a_capture(tmp_path):
    config = WatchConfig(
        engine_url="http://127.0.0.1:9",  # discard port: nothing listens
        objectives=parse_slo("itl_p99<50ms"),
        out_dir=tmp_path / "out",
        profile_dir=tmp_path / "profiles",
    )
    watcher = Watcher(config, status=lambda message: None)
    assert watcher.poll_once() == [] and watcher.poll_once() == []
    assert watcher.metrics.engine_up._value.get() == 0


def test_only_the_last_cases_are_kept(engine, tmp_path):
    out = tmp_path / "out"
    watcher = watcher_for(engine, out, reference=False, min_interval_s=0.0, keep=1)
    engine.itl_s = 0.4
    for _ in range(4):
        watcher.poll_once()
    assert engine.starts == 3 and len(case_dirs(out)) == 1
    watcher.close()


def test_watch_command_line_errors_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    arguments = ["watch", "--engine", "http://127.0.0.1:9", "--out", str(tmp_path / "o")]
    assert main([*arguments, "--slo", "itl_p99<50ms"]) == 2
    assert "--profile-dir" in capsys.readouterr().err
    assert main([*arguments, "--profile-dir", str(tmp_path), "--slo", "itl<5ms"]) == 2
    assert "say which statistic" in capsys.readouterr().err


def test_a_watcher_stopped_mid_capture_stops_the_profiler_and_leaves_nothing(
    engine, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    watcher = watcher_for(engine, out, reference=False)
    engine.itl_s = 0.4

    def interrupted(seconds: float) -> None:  # SIGTERM arrives while the profiler runs
        raise KeyboardInterrupt

    monkeypatch.setattr(capture_module, "wait_while_profiling", interrupted)
    watcher.poll_once()
    with pytest.raises(KeyboardInterrupt):
        watcher.poll_once()
    assert (engine.starts, engine.stops) == (1, 1) and list(out.iterdir()) == []
    watcher.close()


def test_a_capture_a_killed_watcher_left_is_removed_when_the_next_one_starts(engine, tmp_path):
    out = tmp_path / "out"
    (out / ".capture-20260101T000000000Z.partial" / "traces").mkdir(parents=True)
    watcher = watcher_for(engine, out)
    assert list(out.iterdir()) == []
    watcher.close()
