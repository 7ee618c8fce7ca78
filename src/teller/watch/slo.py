"""Latency objectives: `--slo 'itl_p99<50ms,ttft_p99<2s'` parsed, and judged on a window.

An objective is `SIGNAL[_STAT]<LIMIT[UNIT]`: a signal from `teller.watch.signals`, for a
histogram a statistic (`p50`, `p99`, `p99.9`, `mean`), then a limit (`ms`, `s`, `us` for
durations, a plain number or `%` for gauges). It is broken when the window's value reaches the
limit, and judged only once the scrapes span the whole window and it holds `min_samples`
observations: the first seconds after a (re)start are not the window, and a quiet minute says
nothing about a p99.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from teller.errors import TellerError
from teller.watch.quantiles import histogram_mean, histogram_quantile, observations
from teller.watch.signals import SIGNALS
from teller.watch.window import MetricsWindow

_OBJECTIVE = re.compile(
    r"^(?P<signal>[a-z][a-z0-9_]*?)(?:_(?P<stat>p\d+(?:\.\d+)?|mean))?\s*<\s*"
    r"(?P<value>\d+(?:\.\d+)?(?:e-?\d+)?)\s*(?P<unit>ms|us|µs|s|%)?$"
)
_SECONDS_PER_UNIT = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, None: 1.0}
HELD, BROKEN, UNKNOWN = "held", "broken", "unknown"


@dataclass(frozen=True)
class Objective:
    text: str  # as written, e.g. "itl_p99<50ms"
    signal: str  # a key of SIGNALS
    quantile: float | None  # 0.99 for p99; None for `mean` and gauges
    limit: float  # in seconds for durations, else the gauge's own unit

    @property
    def stat(self) -> str:
        if self.quantile is not None:
            return f"p{self.quantile * 100:g}"
        return "mean" if SIGNALS[self.signal].kind == "histogram" else "value"


@dataclass
class Check:
    """One objective judged on the current window."""

    objective: Objective
    state: (
        str  # HELD, BROKEN or UNKNOWN (too few observations, or the engine serves no such metric)
    )
    observed: float | None  # the window's value, in the objective's base unit
    samples: int  # observations in the window (gauges: 1 once read)

    def describe(self) -> str:
        shown = "n/a" if self.observed is None else format_value(self.objective, self.observed)
        return f"{self.objective.text}: {self.state} ({shown}, {self.samples} samples)"


def format_value(objective: Objective, value: float) -> str:
    if SIGNALS[objective.signal].seconds:
        return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:g}"


def parse_slo(text: str) -> list[Objective]:
    """Every objective of a comma-separated list; a TellerError names the one that is wrong."""
    objectives = [_parse_one(part.strip()) for part in text.split(",") if part.strip()]
    if not objectives:
        raise TellerError(f"--slo {text!r}: no objective (e.g. 'itl_p99<50ms,ttft_p99<2s')")
    return objectives


def _parse_one(text: str) -> Objective:
    match = _OBJECTIVE.match(text)
    if match is None:
        raise TellerError(
            f"--slo: {text!r} is not SIGNAL[_pNN|_mean]<LIMIT[ms|s|us|%] (e.g. itl_p99<50ms)"
        )
    name, stat, unit = match["signal"], match["stat"], match["unit"]
    signal = SIGNALS.get(name)
    if signal is None:
        raise TellerError(
            f"--slo: unknown signal {name!r} in {text!r}; known: {', '.join(SIGNALS)}"
        )
    value = float(match["value"])
    if signal.kind == "gauge":
        if stat is not None:
            raise TellerError(f"--slo: {name} is a gauge; write {name}<LIMIT, not {name}_{stat}")
        if unit not in (None, "%"):
            raise TellerError(f"--slo: {text!r}: {name} is a count or share, not a duration")
        return Objective(text, name, None, value / 100 if unit == "%" else value)
    if unit == "%":
        raise TellerError(f"--slo: {text!r}: {name} is a duration; give ms, s or us")
    if stat is None:
        raise TellerError(f"--slo: {text!r}: say which statistic, e.g. {name}_p99 or {name}_mean")
    quantile = None
    if stat != "mean":
        quantile = float(stat[1:]) / 100
        if not 0 < quantile < 1:
            raise TellerError(f"--slo: {text!r}: a quantile lies between p0 and p100")
    return Objective(text, name, quantile, value * _SECONDS_PER_UNIT[unit])


def check(objectives: list[Objective], window: MetricsWindow, min_samples: int) -> list[Check]:
    return [_check_one(objective, window, min_samples) for objective in objectives]


def _check_one(objective: Objective, window: MetricsWindow, min_samples: int) -> Check:
    signal = SIGNALS[objective.signal]
    if signal.kind == "gauge":
        value = window.gauge(signal)
        if value is None:
            return Check(objective, UNKNOWN, None, 0)
        return Check(objective, BROKEN if value >= objective.limit else HELD, value, 1)
    histogram = window.histogram(signal)
    if histogram is None:
        return Check(objective, UNKNOWN, None, 0)
    if window.covered_s < window.seconds:  # the first seconds after a start are not the window
        return Check(objective, UNKNOWN, None, int(observations(histogram)))
    samples = int(observations(histogram))
    if objective.quantile is None:
        value = histogram_mean(histogram)
    else:
        value = histogram_quantile(objective.quantile, histogram)
    if value is None or samples < min_samples:
        return Check(objective, UNKNOWN, value, samples)
    return Check(objective, BROKEN if value >= objective.limit else HELD, value, samples)
