"""The lab server's side of the protocol, without its ranks: metrics in vLLM's names, and the
profiler requests handed to the engine loop and answered once every rank's trace is written."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest

from teller.lab.serve.control import ControlError, ProfileControl
from teller.lab.serve.endpoints import EngineEndpoints
from teller.lab.serve.metrics import EngineMetrics
from teller.lab.serve.profiler import trace_name
from teller.lab.serve.scheduler import StepPlan
from teller.watch.quantiles import histogram_quantile
from teller.watch.scrape import parse_metrics
from teller.watch.signals import SIGNALS
from teller.watch.slo import check, parse_slo
from teller.watch.window import MetricsWindow, served_name

MS = 1_000_000


def test_the_lab_engine_metrics_are_read_as_vllm_metrics():
    metrics = EngineMetrics("teller-lab/llama-tiny")
    window = MetricsWindow(0.0)
    window.add(parse_metrics(metrics.exposition().decode(), at_s=0.0, wall_ns=0))
    metrics.request_added("a", arrival_ns=0)
    metrics.request_added("b", arrival_ns=0)
    metrics.step_done(StepPlan(0, ["a", "b"], [[1] * 30, [1] * 10]), 5 * MS, 45 * MS, [])
    for step in range(1, 5):  # every decode step takes 30 ms
        start = (45 + 30 * (step - 1)) * MS
        plan = StepPlan(step, decode_ids=["a", "b"])
        metrics.step_done(plan, start, start + 30 * MS, ["a", "b"] if step == 4 else [])
    metrics.scheduler_state(running=0, waiting=3, kv_cache_usage=0.25)
    scrape = parse_metrics(metrics.exposition().decode(), at_s=1.0, wall_ns=0)
    window.add(scrape)
    for key in ("ttft", "itl", "tpot", "e2e", "queue", "waiting", "running", "kv_cache"):
        assert served_name(SIGNALS[key], scrape) == SIGNALS[key].names[0]
    itl = window.histogram(SIGNALS["itl"])
    assert itl.count == 8 and 0.025 < histogram_quantile(0.5, itl) <= 0.05
    assert window.histogram(SIGNALS["ttft"]).sum == pytest.approx(0.09)  # 45 ms, twice
    assert window.gauge(SIGNALS["waiting"]) == 3 and window.gauge(SIGNALS["kv_cache"]) == 0.25
    assert scrape.labels == {"engine": "0", "model_name": "teller-lab/llama-tiny"}
    states = [c.state for c in check(parse_slo("itl_p99<25ms,itl_p50<50ms"), window, 8)]
    assert states == ["broken", "held"]


def fake_engine_loop(control: ProfileControl, stop: threading.Event) -> None:
    """What the lab's engine loop does with a request: take it, toggle, let every rank export."""
    while not stop.is_set():
        request = control.take()
        if request is None:
            stop.wait(0.01)
            continue
        control.applied(request)
        if request.action == "stop":
            for rank in range(control.tp):
                (control.profile_dir / trace_name(rank, request.capture_id)).write_bytes(b"{}")


@pytest.fixture
def endpoints(tmp_path):
    control = ProfileControl(tmp_path / "profiles", tp=2)
    control.profile_dir.mkdir()
    stop = threading.Event()
    loop = threading.Thread(target=fake_engine_loop, args=(control, stop), daemon=True)
    loop.start()
    server = EngineEndpoints("127.0.0.1", 0, EngineMetrics("m"), control)
    server.start()
    yield f"http://127.0.0.1:{server.port}", control
    stop.set()
    server.stop()


def post(url: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_a_stop_answers_once_every_rank_trace_of_the_capture_is_written(endpoints):
    url, control = endpoints
    assert post(f"{url}/start_profile")[0] == 200 and control.profiling
    assert post(f"{url}/start_profile")[0] == 409  # already profiling
    status, body = post(f"{url}/stop_profile")
    assert status == 200 and not control.profiling
    written = sorted(p.name for p in control.profile_dir.iterdir())
    assert written == [trace_name(r, control.capture_id) for r in range(2)]
    assert all(name in body.decode() for name in written)
    assert post(f"{url}/stop_profile")[0] == 409  # not profiling
    assert post(f"{url}/nothing")[0] == 404
    with urllib.request.urlopen(f"{url}/metrics") as response:
        assert b"vllm:inter_token_latency_seconds_bucket" in response.read()


def test_without_a_profile_folder_the_profiler_endpoints_say_so():
    server = EngineEndpoints("127.0.0.1", 0, EngineMetrics("m"), None)
    server.start()
    try:
        status, body = post(f"http://127.0.0.1:{server.port}/start_profile")
        assert status == 404 and b"profiling is off" in body
    finally:
        server.stop()


def test_a_request_the_engine_loop_never_takes_times_out(tmp_path, monkeypatch):
    monkeypatch.setattr("teller.lab.serve.control.TAKE_TIMEOUT_S", 0.05)
    control = ProfileControl(tmp_path, tp=1)
    with pytest.raises(ControlError, match="did not take the request") as raised:
        control.request("start")
    assert raised.value.status == 503 and control.take() is None and not control.profiling
