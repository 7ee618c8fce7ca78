"""Engine /metrics as vLLM and SGLang serve them: parsed, windowed, quantiles as Prometheus has them.

The fixtures under data/ are the exposition prometheus-client (which both engines use) writes for
vLLM V1's metric families (names, `model_name`/`engine` labels, buckets from
vllm/v1/metrics/loggers.py), for vLLM releases before the renames (`time_per_output_token_seconds`,
`gpu_cache_usage_perc`), and for SGLang (`sglang:` names, its own buckets). Two vLLM scrapes a
minute apart differ by a known set of observations, so every windowed number below is worked out
by hand.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from teller.watch.quantiles import difference, histogram_mean, histogram_quantile
from teller.watch.scrape import HistogramCounts, MetricsFormatError, parse_metrics
from teller.watch.signals import SIGNALS
from teller.watch.window import MetricsWindow

DATA = Path(__file__).parent / "data"


def scrape(name: str, at_s: float):
    return parse_metrics((DATA / name).read_text(), at_s=at_s, wall_ns=int(at_s * 1e9))


def test_vllm_histograms_are_summed_over_engines_with_their_buckets():
    t1 = scrape("vllm-v1-t1.metrics.txt", 60.0)
    itl = t1.histograms["vllm:inter_token_latency_seconds"]
    assert itl.bounds[:4] == (0.01, 0.025, 0.05, 0.075) and math.isinf(itl.bounds[-1])
    # 4600 observations in all, split over engine "0" and "1"
    assert itl.count == 4600 and itl.cumulative[-1] == 4600
    assert itl.cumulative[1] == 500  # <= 25 ms: 400 before the window, 100 inside it
    assert t1.labels == {"engine": "0", "model_name": "meta-llama/Llama-3.1-8B-Instruct"}
    assert t1.gauges["vllm:num_requests_waiting"] == [4.0, 3.0]


def test_windowed_quantiles_match_prometheus_histogram_quantile():
    window = MetricsWindow(seconds=60.0)
    window.add(scrape("vllm-v1-t0.metrics.txt", 0.0))
    window.add(scrape("vllm-v1-t1.metrics.txt", 60.0))
    itl = window.histogram(SIGNALS["itl"])
    assert itl is not None and itl.count == 1000
    # the window holds 100 in (10, 25] ms, 800 in (25, 50], 80 in (50, 75], 20 in (75, 100]
    assert histogram_quantile(0.5, itl) == pytest.approx(0.025 + 0.025 * 400 / 800)
    assert histogram_quantile(0.99, itl) == pytest.approx(0.075 + 0.025 * 10 / 20)
    assert histogram_mean(itl) == pytest.approx(
        (100 * 0.02 + 800 * 0.04 + 80 * 0.06 + 20 * 0.09) / 1000
    )
    ttft = window.histogram(SIGNALS["ttft"])
    # 20 at 150 ms, 10 at 300 ms, 10 at 3 s: the p90 rank (36) falls in (2.5, 5] s
    assert histogram_quantile(0.9, ttft) == pytest.approx(2.5 + 2.5 * (36 - 30) / 10)
    assert window.gauge(SIGNALS["waiting"]) == 7.0  # summed over both engines
    assert window.gauge(SIGNALS["kv_cache"]) == 0.71  # the fuller engine


def test_older_vllm_and_sglang_names_are_read_as_the_same_signals():
    old = MetricsWindow(60.0)
    old.add(scrape("vllm-v0.8-old-names.metrics.txt", 0.0))
    assert old.gauge(SIGNALS["kv_cache"]) == 0.5  # vllm:gpu_cache_usage_perc
    assert old.latest.histograms["vllm:time_per_output_token_seconds"].count == 3600
    sglang = scrape("sglang.metrics.txt", 0.0)
    window = MetricsWindow(60.0)
    window.add(sglang)
    assert window.gauge(SIGNALS["waiting"]) == 7.0  # sglang:num_queue_reqs
    assert window.gauge(SIGNALS["kv_cache"]) == 0.28  # sglang:token_usage
    itl = sglang.histograms["sglang:inter_token_latency_seconds"]
    # 500 at 9 ms, 400 at 18 ms, 100 at 50 ms: the median lies in SGLang's (8, 10] ms bucket
    assert histogram_quantile(0.5, itl) == pytest.approx(0.008 + 0.002 * 500 / 500)


def test_a_restart_starts_a_new_window_instead_of_negative_counts():
    window = MetricsWindow(60.0)
    assert not window.add(scrape("vllm-v1-t1.metrics.txt", 0.0))
    assert window.add(scrape("vllm-v1-t0.metrics.txt", 5.0))  # counts went down: restarted
    assert len(window.scrapes) == 1 and window.histogram(SIGNALS["itl"]) is None


def test_the_window_keeps_one_scrape_at_its_start_and_drops_older_ones():
    window = MetricsWindow(10.0)
    text = (DATA / "vllm-v1-t0.metrics.txt").read_text()
    for at_s in range(0, 30, 2):
        window.add(parse_metrics(text, at_s=float(at_s), wall_ns=0))
    assert window.scrapes[0].at_s == 18.0 and window.covered_s == 10.0


def test_quantile_edge_cases_follow_prometheus():
    bounds = (0.1, 0.2, math.inf)
    assert histogram_quantile(0.5, HistogramCounts(bounds, (0, 0, 0), 0, 0)) is None
    # everything above the last finite bound: the answer is that bound
    assert histogram_quantile(0.99, HistogramCounts(bounds, (0, 0, 10), 10, 50.0)) == 0.2
    # the first bucket starts at zero
    assert histogram_quantile(0.5, HistogramCounts(bounds, (10, 10, 10), 10, 0.5)) == 0.05
    older = HistogramCounts(bounds, (5, 9, 10), 10, 1.0)
    assert difference(older, HistogramCounts(bounds, (6, 9, 12), 12, 1.2)) is None  # reset


def test_text_that_is_not_prometheus_format_is_a_clear_error():
    with pytest.raises(MetricsFormatError, match="not Prometheus text format"):
        parse_metrics('vllm:num_requests_waiting{engine="0" 3\n')
