"""`teller watch`: root-cause reports from a live service, where its monitoring already looks.

The watcher polls the engine's Prometheus `/metrics` (vLLM's or SGLang's names), judges latency
objectives on windowed histogram quantiles, and when one breaks triggers a short capture through
the engine's own profiler endpoints, analyses it with `teller.analysis.Analysis`, writes the case
and its report, and exports the verdict as an OpenTelemetry span and log record, as Prometheus
metrics on its own `/metrics`, and as an optional webhook. One module per job:

    scrape      one GET of /metrics, parsed by prometheus-client
    signals     what an objective may name, under each engine's metric names
    quantiles   Prometheus' histogram_quantile over the difference of two scrapes
    window      the last W seconds of scrapes; engine restarts start a new window
    slo         `itl_p99<50ms,ttft_p99<2s` parsed and judged
    persistence how long each objective has held or been broken (an alert's `for:`)
    profiler    POST /start_profile, /stop_profile
    capture     one capture's traces and log lines, gathered into a case folder
    reference   a normal capture kept to compare each incident against
    ratelimit   at most one capture per interval
    disk        complete cases only, the last K of them
    analyze     the library's Analysis on a case; report.json, report.txt
    incident    the objective, the capture and the verdict's headline, as one record
    otlp, own_metrics, webhook
                where the incident is sent
    watcher     the loop that ties them together
"""

from teller.watch.slo import Objective, parse_slo
from teller.watch.watcher import WatchConfig, Watcher, watch

__all__ = ["Objective", "WatchConfig", "Watcher", "parse_slo", "watch"]
