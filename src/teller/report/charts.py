"""The HTML report's charts: Vega-Lite specifications rendered to inline SVG, offline.

A chart with axes, titles and a legend reads at a glance where a hand-drawn strip does not, and
Vega-Lite is a maintained grammar for exactly that. `vl-convert-python` ships the Vega renderer in
its wheel, so the SVG is drawn here, with no script in the page and nothing fetched; Vega escapes
every label and data value it writes into the SVG. Without the package each chart becomes a
one-line note, so a report is still written.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

#: Colours of the step chart: anomalous steps against the rest, and the expected-time marks.
ANOMALOUS_COLOUR = "#c0392b"
NORMAL_COLOUR = "#7f8fa6"
EXPECTED_COLOUR = "#1d2430"
#: Below this many steps the step axis labels every step.
AXIS_EVERY_STEP = 40
#: Width of a chart's plotting area in px; the page scales the SVG down on narrow screens.
CHART_WIDTH = 860
VEGA_LITE_SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"


@dataclass
class StepPoint:
    rank: int
    step: int
    kind: str
    observed_ms: float
    expected_ms: float
    anomalous: bool


def steps_spec(points: list[StepPoint]) -> dict:
    """Observed step time per rank as bars (anomalous in red), expected time as a tick on each."""
    values = [
        {
            "rank": f"rank {p.rank}",
            "rank_number": p.rank,
            "step": p.step,
            "kind": p.kind,
            "observed (ms)": round(p.observed_ms, 4),
            "expected (ms)": round(p.expected_ms, 4),
            "state": "anomalous" if p.anomalous else "normal",
        }
        for p in points
    ]
    ranks = len({p.rank for p in points})
    first, last = min(p.step for p in points), max(p.step for p in points)
    spans: dict[int, tuple[int, int]] = {}
    for p in points:
        low, high = spans.get(p.rank, (p.step, p.step))
        spans[p.rank] = (min(low, p.step), max(high, p.step))
    # several engines (`callchain.engines`) number their steps apart, in ranges no other engine's
    # rank shares: each rank gets its own axis
    ordered = sorted(spans.values())
    reach = itertools.accumulate((high for _, high in ordered), max)  # furthest step so far
    apart = any(low > high for (low, _), high in zip(ordered[1:], reach, strict=False))
    x = {
        "field": "step",
        "type": "quantitative",
        "title": "step",
        "axis": {"tickMinStep": 1, "format": "d"}
        | (
            {"values": list(range(first, last + 1))}
            if last - first < AXIS_EVERY_STEP and not apart
            else {}
        ),
        "scale": ({} if apart else {"domain": [first - 0.5, last + 0.5]})
        | {"nice": False, "zero": False},
    }
    return {
        "$schema": VEGA_LITE_SCHEMA,
        "data": {"values": values},
        "facet": {
            "row": {
                "field": "rank",
                "type": "nominal",
                "title": None,
                "sort": {"field": "rank_number", "op": "min"},  # rank 2 before rank 10
            }
        },
        "spec": {
            "width": CHART_WIDTH,
            "height": max(60, min(140, 420 // max(ranks, 1))),
            "layer": [
                {
                    "mark": {"type": "bar", "width": {"band": 0.8}},
                    "encoding": {
                        "x": x,
                        "y": {"field": "observed (ms)", "type": "quantitative"},
                        "color": {
                            "field": "state",
                            "type": "nominal",
                            "title": "step",
                            "scale": {
                                "domain": ["normal", "anomalous"],
                                "range": [NORMAL_COLOUR, ANOMALOUS_COLOUR],
                            },
                        },
                        "tooltip": [
                            {"field": "rank"},
                            {"field": "step"},
                            {"field": "kind"},
                            {"field": "observed (ms)"},
                            {"field": "expected (ms)"},
                            {"field": "state"},
                        ],
                    },
                },
                {
                    "mark": {"type": "tick", "color": EXPECTED_COLOUR, "thickness": 2},
                    "encoding": {
                        "x": x,
                        "y": {
                            "field": "expected (ms)",
                            "type": "quantitative",
                            "title": "time (ms): bar observed, tick expected",
                        },
                    },
                },
            ],
        },
        "resolve": {"scale": {"y": "independent"} | ({"x": "independent"} if apart else {})},
    }


def breakdown_spec(rows: list[dict]) -> dict:
    """Stacked bars, one per step compared: GPU time by kind and idle time by its cause (ms).

    `rows` hold `step` (a label), `part` and `ms`; parts keep their order in the legend.
    """
    order = list(dict.fromkeys(row["part"] for row in rows))
    return {
        "$schema": VEGA_LITE_SCHEMA,
        "width": CHART_WIDTH,
        "height": 40 * max(len({row["step"] for row in rows}), 1),
        "data": {"values": [dict(row, order=order.index(row["part"])) for row in rows]},
        "mark": "bar",
        "encoding": {
            "y": {
                "field": "step",
                "type": "nominal",
                "title": None,
                "sort": None,
                "axis": {"labelLimit": 200},
            },
            "x": {"field": "ms", "type": "quantitative", "title": "time in the step (ms)"},
            "color": {
                "field": "part",
                "type": "nominal",
                "title": "where the time went",
                "sort": order,
                "legend": {"orient": "bottom", "columns": 3, "labelLimit": 260},
            },
            "order": {"field": "order"},
            "tooltip": [{"field": "step"}, {"field": "part"}, {"field": "ms"}],
        },
    }


def excess_spec(rows: list[dict]) -> dict:
    """Horizontal bars: each operator's self time in the worst step beyond a normal step (ms)."""
    return {
        "$schema": VEGA_LITE_SCHEMA,
        "width": CHART_WIDTH - 300,
        "height": 22 * max(len(rows), 1),
        "data": {"values": rows},
        "mark": {"type": "bar", "color": ANOMALOUS_COLOUR},
        "encoding": {
            "y": {
                "field": "operator",
                "type": "nominal",
                "sort": "-x",
                "title": None,
                "axis": {"labelLimit": 280},
            },
            "x": {
                "field": "excess (ms)",
                "type": "quantitative",
                "title": "self time beyond the normal step (ms)",
            },
            "tooltip": [
                {"field": "operator"},
                {"field": "layer"},
                {"field": "excess (ms)"},
                {"field": "worst (ms)"},
                {"field": "normal (ms)"},
            ],
        },
    }


#: Colour of operators that got faster in the diff's chart (slower ones are `ANOMALOUS_COLOUR`).
FASTER_COLOUR = "#27ae60"


def operator_change_spec(rows: list[dict], unit: str) -> dict:
    """Horizontal bars: each operator's change in self time per `unit` from A to B (ms), slower
    in red, faster in green. `rows` hold `operator` (distinct labels), `layer`, `change (ms)`,
    `A (ms)`, `B (ms)`, `A calls`, `B calls`, in the order shown."""
    values = [dict(row, direction="slower" if row["change (ms)"] > 0 else "faster") for row in rows]
    return {
        "$schema": VEGA_LITE_SCHEMA,
        "width": CHART_WIDTH - 300,
        "height": 22 * max(len(rows), 1),
        "data": {"values": values},
        "mark": "bar",
        "encoding": {
            "y": {
                "field": "operator",
                "type": "nominal",
                "sort": None,
                "title": None,
                "axis": {"labelLimit": 280},
            },
            "x": {
                "field": "change (ms)",
                "type": "quantitative",
                "title": f"self time per {unit}, B minus A (ms)",
            },
            "color": {
                "field": "direction",
                "type": "nominal",
                "title": "in B",
                "scale": {
                    "domain": ["slower", "faster"],
                    "range": [ANOMALOUS_COLOUR, FASTER_COLOUR],
                },
            },
            "tooltip": [
                {"field": field}
                for field in (
                    "operator",
                    "layer",
                    "change (ms)",
                    "A (ms)",
                    "B (ms)",
                    "A calls",
                    "B calls",
                )
            ],
        },
    }


def kinds_spec(rows: list[dict]) -> dict:
    """Grouped bars: median step time of each step kind in run A and run B (ms)."""
    return {
        "$schema": VEGA_LITE_SCHEMA,
        "width": CHART_WIDTH - 300,
        "height": {"step": 16},
        "data": {"values": rows},
        "mark": "bar",
        "encoding": {
            "y": {"field": "kind", "type": "nominal", "title": None, "sort": None},
            "yOffset": {"field": "run", "sort": ["A", "B"]},
            "x": {"field": "median (ms)", "type": "quantitative", "title": "median step time (ms)"},
            "color": {
                "field": "run",
                "type": "nominal",
                "title": "run",
                "scale": {"domain": ["A", "B"], "range": [NORMAL_COLOUR, "#2e6fba"]},
            },
            "tooltip": [{"field": f} for f in ("kind", "run", "median (ms)", "p90 (ms)", "steps")],
        },
    }


#: Colours of the Gantt chart's parts: work between collectives, waiting, the rest of a collective.
GANTT_COLOURS = {
    "compute and other work": "#c9d1dd",
    "collective: waiting for the last rank": ANOMALOUS_COLOUR,
    "collective: after the last rank arrived": "#2e6fba",
    "collective (no peer recorded)": "#6c5ce7",
}
#: Height of one rank's row in the Gantt chart, px, up to `GANTT_TALL_RANKS` ranks (then thinner).
GANTT_ROW_PX = 30
GANTT_TALL_RANKS = 24


def gantt_spec(rows: list[dict], step: int) -> dict:
    """One row per rank across one step: bars for the work between collectives and for each
    collective, its wait for the last rank in red, so the straggler is the row with no red.

    `rows` hold `rank` (its label, in the order shown), `part` (a `GANTT_COLOURS` key),
    `start (ms)`, `end (ms)` into the step, and for collectives `collective`, `arrival (ms)`,
    `wait (ms)` and `own time (ms)`."""
    ranks = list(dict.fromkeys(row["rank"] for row in rows))
    parts = [part for part in GANTT_COLOURS if any(row["part"] == part for row in rows)]
    row_px = GANTT_ROW_PX if len(ranks) <= GANTT_TALL_RANKS else 12
    tooltip = ["rank", "part", "collective", "arrival (ms)", "wait (ms)", "own time (ms)"]
    return {
        "$schema": VEGA_LITE_SCHEMA,
        "width": CHART_WIDTH,
        "height": row_px * len(ranks),
        "data": {"values": rows},
        "mark": "bar",
        "encoding": {
            "y": {
                "field": "rank",
                "type": "nominal",
                "title": None,
                "sort": ranks,
                "axis": {"labelLimit": 220},
            },
            "x": {
                "field": "start (ms)",
                "type": "quantitative",
                "title": f"ms into step {step} (all ranks on one clock)",
                "scale": {"nice": False},
            },
            "x2": {"field": "end (ms)"},
            "color": {
                "field": "part",
                "type": "nominal",
                "title": "time spent on",
                "scale": {"domain": parts, "range": [GANTT_COLOURS[p] for p in parts]},
                "legend": {"orient": "bottom", "columns": 2, "labelLimit": 320},
            },
            "tooltip": [{"field": field} for field in tooltip],
        },
    }


def render_svg(spec: dict) -> str | None:
    """The chart as an SVG document string; None when vl-convert-python is not installed."""
    try:
        import vl_convert
    except ImportError:
        return None
    return vl_convert.vegalite_to_svg(json.dumps(spec))
