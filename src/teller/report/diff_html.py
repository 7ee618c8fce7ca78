"""`teller diff --format html`: the comparison as one self-contained page, styled as the report.

A diff is attached to a ticket or a CI run as often as it is read in a terminal; a page carries the
verdict the gate gave, the step kinds side by side and the operators that changed, drawn as a
chart. As in the report, nothing is fetched, no script runs, and every string that came from a
trace goes through `esc`.
"""

from __future__ import annotations

import numpy as np

from teller.callchain.render import format_ns
from teller.report.charts import kinds_spec, operator_change_spec
from teller.report.diff import (
    RunDiff,
    calls_text,
    changed_operators,
    diff_verdict,
    distinct_short_names,
    per_call_text,
    signed_ns,
)
from teller.report.html import STYLE, chart, esc

#: Operators in the table and the chart.
SHOWN_OPERATORS = 15


def render_diff_html(
    diff: RunDiff, gate_pct: float | None = None, top: int = SHOWN_OPERATORS
) -> str:
    state, detail = diff_verdict(diff, gate_pct)
    good = state == "no regression"
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>teller diff — {esc(state)}</title>",
        f"<style>{STYLE}</style></head><body><main>",
        "<h1>teller diff</h1>",
        f"<div class='meta'>A (reference): {esc(', '.join(diff.a_inputs))}<br>"
        f"B: {esc(', '.join(diff.b_inputs))} · operators per {esc(diff.unit)}"
        f" · schema {esc(diff.schema)}</div>",
        f"<section id='verdict' class='verdict{' ok' if good else ''}'>"
        f"<p><strong>{esc(state)}</strong>{esc((': ' if diff.not_comparable else ' ') + detail) if detail else ''}</p>"
        f"<pre>{esc(diff.summary)}</pre></section>",
    ]
    parts.extend(f"<p class='missing'>note: {esc(note)}</p>" for note in diff.notes)
    parts.append("<h2>Step kinds</h2>")
    parts.append(_kinds(diff))
    rows = changed_operators(diff, top)
    parts.append(f"<h2>Operators that changed most (self time per {esc(diff.unit)})</h2>")
    parts.append(_operators(diff, rows))
    parts.append("</main></body></html>")
    return "\n".join(parts)


def _kinds(diff: RunDiff) -> str:
    if not diff.kinds:
        return "<p>Neither run has steps.</p>"
    values = [
        {
            "kind": k.kind,
            "run": run,
            "median (ms)": round(median / 1e6, 4),
            "p90 (ms)": round(p90 / 1e6, 4),
            "steps": steps,
        }
        for k in diff.kinds
        for run, steps, median, p90 in (
            ("A", k.a_steps, k.a_median_ns, k.a_p90_ns),
            ("B", k.b_steps, k.b_median_ns, k.b_p90_ns),
        )
        if steps
    ]
    table = [
        "<div class='scroll'><table id='kinds'><tr><th>step kind</th><th>steps A</th>"
        "<th>steps B</th><th>median A</th><th>median B</th><th>p90 A</th><th>p90 B</th>"
        "<th>change</th></tr>"
    ]
    for k in diff.kinds:
        change = f"{k.change_pct:+.1f}% ({k.metric})" if np.isfinite(k.change_pct) else "—"
        cells = [
            format_ns(v) if n else "—"
            for v, n in (
                (k.a_median_ns, k.a_steps),
                (k.b_median_ns, k.b_steps),
                (k.a_p90_ns, k.a_steps),
                (k.b_p90_ns, k.b_steps),
            )
        ]
        worse = np.isfinite(k.change_pct) and k.change_pct > 0
        table.append(
            f"<tr><td>{esc(k.kind)}</td><td class='num'>{k.a_steps}</td>"
            f"<td class='num'>{k.b_steps}</td>"
            + "".join(f"<td class='num'>{esc(c)}</td>" for c in cells)
            + f"<td class='num{' bad' if worse else ''}'>{esc(change)}</td></tr>"
        )
    table.append("</table></div>")
    drawn = (
        chart("chart-kinds", kinds_spec(values), "median step time per kind, A and B")
        if values
        else ""
    )
    return drawn + "".join(table)


def _operators(diff: RunDiff, rows: list[dict]) -> str:
    if not rows:
        return f"<p>No operator's self time per {esc(diff.unit)} changed.</p>"
    labels = distinct_short_names([row["name"] for row in rows])
    values = [
        {
            "operator": label,
            "layer": row["layer"],
            "change (ms)": round(row["delta_self_ns_per_unit"] / 1e6, 6),
            "A (ms)": round(row["a_self_ns_per_unit"] / 1e6, 6),
            "B (ms)": round(row["b_self_ns_per_unit"] / 1e6, 6),
            "A calls": round(row["a_calls_per_unit"], 3),
            "B calls": round(row["b_calls_per_unit"], 3),
        }
        for row, label in zip(rows, labels, strict=True)
    ]
    unit = diff.unit
    table = [
        "<div class='scroll'><table id='operators'>"
        f"<tr><th>Δ self per {esc(unit)}</th><th>A calls per {esc(unit)}</th>"
        f"<th>B calls per {esc(unit)}</th><th>A per call</th><th>B per call</th><th>layer</th>"
        "<th>operator</th></tr>"
    ]
    for row, label in zip(rows, labels, strict=True):
        delta = row["delta_self_ns_per_unit"]
        table.append(
            f"<tr><td class='num{' bad' if delta > 0 else ''}'>{esc(signed_ns(delta))}</td>"
            f"<td class='num'>{esc(calls_text(row['a_calls_per_unit']))}</td>"
            f"<td class='num'>{esc(calls_text(row['b_calls_per_unit']))}</td>"
            f"<td class='num'>{esc(per_call_text(row['a_self_ns_per_call']))}</td>"
            f"<td class='num'>{esc(per_call_text(row['b_self_ns_per_call']))}</td>"
            f"<td>{esc(row['layer'])}</td>"
            f"<td><code title='{esc(row['name'])}'>{esc(label)}</code></td></tr>"
        )
    table.append("</table></div>")
    drawn = chart(
        "chart-operators", operator_change_spec(values, unit), "operators' change in self time"
    )
    return drawn + "".join(table)
