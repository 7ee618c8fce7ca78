"""The HTML report's charts: Vega-Lite specifications rendered to inline SVG, offline.

A chart with axes, titles and a legend reads at a glance where a hand-drawn strip does not, and
Vega-Lite is a maintained grammar for exactly that. `vl-convert-python` ships the Vega renderer in
its wheel, so the SVG is drawn here, with no script in the page and nothing fetched; Vega escapes
every label and data value it writes into the SVG. Without the package each chart becomes a
one-line note, so a report is still written.
"""

from __future__ import annotations

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
    x = {
        "field": "step",
        "type": "quantitative",
        "title": "step",
        "axis": {"tickMinStep": 1, "format": "d"}
        | ({"values": list(range(first, last + 1))} if last - first < AXIS_EVERY_STEP else {}),
        "scale": {"domain": [first - 0.5, last + 0.5], "nice": False, "zero": False},
    }
    return {
        "$schema": VEGA_LITE_SCHEMA,
        "data": {"values": values},
        "facet": {"row": {"field": "rank", "type": "nominal", "title": None}},
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
        "resolve": {"scale": {"y": "independent"}},
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


def render_svg(spec: dict) -> str | None:
    """The chart as an SVG document string; None when vl-convert-python is not installed."""
    try:
        import vl_convert
    except ImportError:
        return None
    return vl_convert.vegalite_to_svg(json.dumps(spec))
