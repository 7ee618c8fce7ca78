"""One read of the engine's `/metrics`: histograms and gauges, parsed by prometheus-client.

The text goes through `prometheus_client.parser`, the reference implementation of the format, so
escaping, exponents, `+Inf` and label order are read as Prometheus reads them. A family served
once per engine or model (vLLM labels every series `model_name` and `engine`) is summed across
them, as `sum by (le)` does for a dashboard's quantile.
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from teller.errors import TellerError

#: How long one scrape may take before the engine counts as unreachable for this poll.
SCRAPE_TIMEOUT_S = 5.0
#: Labels that name where a series came from, kept for the exported verdict.
IDENTITY_LABELS = ("model_name", "engine")


class EngineUnreachable(TellerError):
    """The engine did not answer `/metrics` (stopped, restarting, or not there)."""


class MetricsFormatError(TellerError):
    """The engine's `/metrics` answer is not Prometheus text."""


@dataclass(frozen=True)
class HistogramCounts:
    """One histogram's cumulative buckets: `cumulative[i]` observations were <= `bounds[i]`."""

    bounds: tuple[float, ...]  # ascending upper bounds, the last one +Inf
    cumulative: tuple[float, ...]
    count: float
    sum: float


@dataclass
class Scrape:
    """The engine's metrics at one moment (`at_s`: monotonic seconds, `wall_ns`: unix ns)."""

    at_s: float
    wall_ns: int
    histograms: dict[str, HistogramCounts] = field(default_factory=dict)
    gauges: dict[str, list[float]] = field(default_factory=dict)  # one value per series
    labels: dict[str, str] = field(default_factory=dict)  # model_name, engine of the first series


def fetch_metrics(url: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> str:
    """The text the engine serves at `url` (its `/metrics`)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as error:
        raise EngineUnreachable(f"{url}: HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise EngineUnreachable(f"{url}: {reason}") from None


def parse_metrics(text: str, at_s: float | None = None, wall_ns: int | None = None) -> Scrape:
    """Histograms (buckets summed over series) and gauges of one `/metrics` answer."""
    scrape = Scrape(
        at_s=time.monotonic() if at_s is None else at_s,
        wall_ns=time.time_ns() if wall_ns is None else wall_ns,
    )
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as error:
        raise MetricsFormatError(f"not Prometheus text format: {error}") from None
    for family in families:
        if family.type == "histogram":
            histogram = _histogram(family.samples, family.name)
            if histogram is not None:
                scrape.histograms[family.name] = histogram
        elif family.type in ("gauge", "untyped", "counter"):
            values = [s.value for s in family.samples if not s.name.endswith("_created")]
            if values:
                scrape.gauges[family.name] = values
        if not scrape.labels:
            for sample in family.samples:
                found = {k: v for k, v in sample.labels.items() if k in IDENTITY_LABELS}
                if found:
                    scrape.labels = found
                    break
    return scrape


def _histogram(samples: list, name: str) -> HistogramCounts | None:
    by_bound: dict[float, float] = defaultdict(float)
    count = total = 0.0
    for sample in samples:
        if sample.name == f"{name}_bucket":
            by_bound[float(sample.labels["le"])] += sample.value
        elif sample.name == f"{name}_count":
            count += sample.value
        elif sample.name == f"{name}_sum":
            total += sample.value
    if not by_bound or math.inf not in by_bound:
        return None  # a histogram without its +Inf bucket says nothing about its tail
    bounds = tuple(sorted(by_bound))
    return HistogramCounts(bounds, tuple(by_bound[b] for b in bounds), count, total)
