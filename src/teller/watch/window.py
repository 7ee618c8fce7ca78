"""The last W seconds of the engine's metrics: what an objective is judged on.

Scrapes are kept while they are inside the window; a signal's histogram over the window is the
newest scrape minus the oldest one kept. A counter that goes down means the engine restarted: the
history before it describes another process and is dropped, so a restart never reads as a burst
of negative (or huge) latencies.
"""

from __future__ import annotations

from collections import deque

from teller.watch.quantiles import difference
from teller.watch.scrape import HistogramCounts, Scrape
from teller.watch.signals import SIGNALS, Signal


class MetricsWindow:
    """Scrapes of the last `seconds`; `add` says whether the engine restarted since the last."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.scrapes: deque[Scrape] = deque()

    def add(self, scrape: Scrape) -> bool:
        restarted = bool(self.scrapes) and _went_down(self.scrapes[-1], scrape)
        if restarted:
            self.scrapes.clear()
        self.scrapes.append(scrape)
        # keep one scrape at or before the window's start, so the window is always covered
        while len(self.scrapes) > 2 and self.scrapes[1].at_s <= scrape.at_s - self.seconds:
            self.scrapes.popleft()
        return restarted

    def clear(self) -> None:
        self.scrapes.clear()

    @property
    def latest(self) -> Scrape | None:
        return self.scrapes[-1] if self.scrapes else None

    @property
    def covered_s(self) -> float:
        """How many seconds the kept scrapes span (less than `seconds` after a start)."""
        return self.scrapes[-1].at_s - self.scrapes[0].at_s if len(self.scrapes) > 1 else 0.0

    def histogram(self, signal: Signal) -> HistogramCounts | None:
        """The signal's observations inside the window; None before two scrapes have it."""
        if len(self.scrapes) < 2:
            return None
        name = served_name(signal, self.scrapes[-1])
        if name is None:
            return None
        newest, oldest = self.scrapes[-1].histograms[name], self.scrapes[0].histograms.get(name)
        return difference(newest, oldest) if oldest is not None else None

    def gauge(self, signal: Signal) -> float | None:
        latest = self.latest
        name = served_name(signal, latest) if latest is not None else None
        if name is None:
            return None
        values = latest.gauges[name]
        return max(values) if signal.combine == "max" else sum(values)


def served_name(signal: Signal, scrape: Scrape) -> str | None:
    """The first of the signal's names this engine serves."""
    table = scrape.histograms if signal.kind == "histogram" else scrape.gauges
    return next((name for name in signal.names if name in table), None)


def _went_down(older: Scrape, newer: Scrape) -> bool:
    for signal in SIGNALS.values():
        if signal.kind != "histogram":
            continue
        name = served_name(signal, newer)
        before = older.histograms.get(name) if name is not None else None
        if before is not None and newer.histograms[name].count < before.count:
            return True
    return False
