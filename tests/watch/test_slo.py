"""Objectives as users write them, and how a window is judged against them."""

from __future__ import annotations

from pathlib import Path

import pytest

from teller.errors import TellerError
from teller.watch.scrape import parse_metrics
from teller.watch.slo import BROKEN, HELD, UNKNOWN, check, parse_slo
from teller.watch.window import MetricsWindow

DATA = Path(__file__).parent / "data"


def test_objectives_parse_with_units_and_statistics():
    itl, ttft, e2e, waiting, kv, tpot = parse_slo(
        "itl_p99<50ms, ttft_p99.9<2s,e2e_p95<30s,waiting<32,kv_cache<90%,tpot_mean<800us"
    )
    assert (itl.signal, itl.quantile, itl.limit) == ("itl", 0.99, pytest.approx(0.05))
    assert (ttft.quantile, ttft.limit, ttft.stat) == (pytest.approx(0.999), 2.0, "p99.9")
    assert (e2e.signal, e2e.quantile) == ("e2e", 0.95)
    assert (waiting.quantile, waiting.limit, waiting.stat) == (None, 32.0, "value")
    assert kv.limit == pytest.approx(0.9)
    assert (tpot.quantile, tpot.limit, tpot.stat) == (None, pytest.approx(0.0008), "mean")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("itl_p99>50ms", "is not SIGNAL"),
        ("latency_p99<50ms", "unknown signal 'latency'"),
        ("itl<50ms", "say which statistic"),
        ("waiting_p99<3", "is a gauge"),
        ("kv_cache<3ms", "not a duration"),
        ("itl_p99<5%", "is a duration"),
        ("itl_p100<5ms", "between p0 and p100"),
        (" , ", "no objective"),
    ],
)
def test_bad_objectives_are_one_line_errors(text, message):
    with pytest.raises(TellerError, match=message):
        parse_slo(text)


def window_of(*names: str) -> MetricsWindow:
    window = MetricsWindow(60.0)
    for k, name in enumerate(names):
        window.add(parse_metrics((DATA / name).read_text(), at_s=60.0 * k, wall_ns=0))
    return window


def test_a_window_is_judged_once_it_has_enough_observations():
    window = window_of("vllm-v1-t0.metrics.txt", "vllm-v1-t1.metrics.txt")
    # the window's ITL: p50 37.5 ms, p99 87.5 ms over 1000 observations; 7 requests waiting
    objectives = parse_slo("itl_p50<40ms,itl_p99<50ms,waiting<8,ttft_p99<2s")
    states = [c.state for c in check(objectives, window, min_samples=20)]
    assert states == [HELD, BROKEN, HELD, BROKEN]
    broken = check(objectives, window, min_samples=20)[1]
    assert broken.describe() == "itl_p99<50ms: broken (87.5 ms, 1000 samples)"
    # 40 first tokens in the window: below 50 observations a p99 is not judged
    assert check(parse_slo("ttft_p99<2s"), window, min_samples=50)[0].state == UNKNOWN


def test_nothing_is_judged_from_one_scrape_or_from_metrics_the_engine_does_not_serve():
    window = window_of("vllm-v1-t1.metrics.txt")
    assert check(parse_slo("itl_p99<50ms"), window, 1)[0].state == UNKNOWN
    sglang = window_of("sglang.metrics.txt", "sglang.metrics.txt")
    assert check(parse_slo("tpot_p99<50ms"), sglang, 1)[0].state == UNKNOWN
    assert check(parse_slo("waiting<5"), sglang, 1)[0].state == BROKEN  # 7 queued
