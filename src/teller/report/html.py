"""One self-contained HTML file: the verdict first, then the evidence a person checks it against.

No script, font or style is fetched: everything is inline, so the file opens offline and can be
attached to a ticket. The charts are Vega-Lite drawn to inline SVG (`teller.report.charts`): each
rank's step times against what their batches predict, where the worst step's time went against a
normal step's, the operators that took longer, and a Gantt chart of the worst step's collectives
rank by rank (`teller.report.step_collectives`: arrival, wait for the last rank, the rest). Every
string that came from a trace or a log goes through `esc` (html.escape with quotes), and the page
needs no JavaScript (findings and the tree fold with <details>). Nothing is wider than the page: wide tables scroll inside their box.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np

from teller.callchain.render import format_ns, short_name
from teller.callchain.tree import EDGE_LAUNCH
from teller.ingest.schema import LAYERS
from teller.rca.diagnose import headline_finding
from teller.rca.verdict import Finding, LogLine, Verdict
from teller.report.charts import (
    StepPoint,
    breakdown_spec,
    excess_spec,
    gantt_spec,
    render_svg,
    steps_spec,
)
from teller.report.step_collectives import StepCollectives, step_collectives

if TYPE_CHECKING:
    from teller.callchain.breakdown import RunBreakdown, StepBreakdown
    from teller.callchain.facts import RunFacts
    from teller.callchain.tree import CallTree

#: Operators shown in the excess chart.
EXCESS_OPERATORS = 10
#: Timestamps past this are unix ns (2001 on), shown as wall-clock time; others as ms into the run.
UNIX_NS_FLOOR = 10**18
#: A collective's name in the Gantt chart's tooltips: long enough that distinct names stay apart.
TOOLTIP_NAME_CHARS = 200
#: Collective instances listed in the arrivals table (the Gantt chart draws every one).
TABLE_INSTANCES = 60
#: Children shown per tree node, and levels below the step, before the rest is summarised.
TREE_CHILDREN = 30
TREE_DEPTH = 6

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#1d2430;background:#f7f8fa}
main{max-width:1180px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde2ea;padding-bottom:4px}
.verdict{background:#fff;border:1px solid #dde2ea;border-left:6px solid #c0392b;padding:14px 18px;border-radius:6px}
.verdict.ok{border-left-color:#27ae60}
.verdict pre{white-space:pre-wrap;font:inherit;margin:0}
.meta{color:#5b6473;font-size:12px}
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px}
.scroll{max-width:100%;overflow-x:auto}
.chart{max-width:100%;overflow-x:auto;background:#fff;border:1px solid #dde2ea;border-radius:6px;padding:6px}
.chart svg{max-width:100%;height:auto;display:block}
td,th,summary,li{overflow-wrap:break-word} code,p,pre,h1,h2,.meta{overflow-wrap:anywhere}
.scroll>table{min-width:640px}
details.finding{margin:6px 0;background:#fff;border:1px solid #dde2ea;border-radius:6px;padding:6px 10px}
details.finding>summary{font-weight:600}
th,td{border:1px solid #e3e7ee;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef1f6}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#c0392b;font-weight:600}
details{margin-left:14px} summary{cursor:pointer}
.suspect>summary,.suspect{background:#fde2df}
.path>summary{font-weight:600}
.layer{color:#5b6473;font-size:11px}
.missing{color:#8a5a00}
code{font-size:12px}
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def render_html(
    verdict: Verdict,
    tree: CallTree,
    breakdown: RunBreakdown | None = None,
    facts: RunFacts | None = None,
) -> str:
    """The report; `breakdown` (where the time went, `Analysis.breakdown()`) and `facts` (the
    run's collective arrivals, `Analysis.facts`) are computed from `tree` when not given."""
    from teller.callchain.facts import RunFacts

    if breakdown is None:
        from teller.callchain.breakdown import run_breakdown

        breakdown = run_breakdown(tree)
    facts = RunFacts.of(tree, facts)
    # the step the summary and the terminal call worst: the first incident's step that lost most
    worst = headline_finding(verdict.findings)
    origin_ns = _run_origin(verdict, tree)
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>teller report — {esc(', '.join(verdict.inputs)[:120])}</title>",
        f"<style>{STYLE}</style></head><body><main>",
        "<h1>teller report</h1>",
        f"<div class='meta'>inputs: {esc(', '.join(verdict.inputs))} · ranks {esc(verdict.ranks)}"
        f" · method {esc(verdict.method)} · schema {esc(verdict.schema)}"
        f" · run starts {esc(_wall_clock(origin_ns))}</div>",
        f"<section id='verdict' class='verdict{'' if verdict.findings else ' ok'}'>"
        f"<pre>{esc(verdict.summary)}</pre></section>",
    ]
    parts.extend(f"<p class='missing'>missing: {esc(item)}</p>" for item in verdict.missing)
    parts.append("<h2>Step time per rank: observed against expected</h2>")
    parts.append(_steps_chart(verdict))
    if worst is not None:
        normal = _normal_step(verdict, worst)
        rank = _finding_rank(verdict, worst)
        parts.append(
            f"<h2>Where the time went: step {worst.step} against a normal step, rank {rank}</h2>"
        )
        parts.append(_breakdown_chart(breakdown, rank, worst.step, normal))
        parts.append(f"<h2>Operators that took longer in step {worst.step} (rank {rank})</h2>")
        parts.append(_excess_chart(tree, rank, worst.step, normal))
    elif verdict.steps:
        longest = max(verdict.steps, key=lambda row: row.dur_ns)
        parts.append(
            f"<h2>Where the time went: step {longest.step} (the longest), rank {longest.rank}</h2>"
        )
        parts.append(_breakdown_chart(breakdown, longest.rank, longest.step, None))
    focus = worst.step if worst is not None else _longest_step(verdict)
    collectives = step_collectives(tree, facts.arrivals, focus) if focus is not None else None
    if collectives is not None and collectives.visits:
        which = "" if worst is not None else " (the longest)"
        parts.append(f"<h2>Collectives of step {focus}{which}: arrival and wait per rank</h2>")
        parts.append(_gantt_chart(collectives))
        parts.append(f"<div class='scroll'>{_collectives_table(collectives)}</div>")
    parts.append("<h2>Anomalous steps</h2>")
    parts.append(_findings_table(verdict))
    parts.extend(_finding_details(verdict, f, origin_ns) for f in verdict.findings)
    if worst is not None:
        parts.append(f"<h2>Call-chain tree of step {worst.step} (suspect path highlighted)</h2>")
        parts.append(_tree_section(tree, worst))
    if verdict.warnings:
        parts.append("<h2>Warnings</h2><ul>")
        parts.extend(f"<li>{esc(w)}</li>" for w in verdict.warnings)
        parts.append("</ul>")
    parts.append("</main></body></html>")
    return "\n".join(parts)


def chart(chart_id: str, spec: dict, what: str) -> str:
    """A chart as inline SVG in a figure, or a one-line note without vl-convert-python."""
    svg = render_svg(spec)
    if svg is None:
        return f"<p class='missing'>{esc(what)}: install vl-convert-python to draw this chart.</p>"
    return f"<figure id='{chart_id}' class='chart' aria-label='{esc(what)}'>{svg}</figure>"


def _steps_chart(verdict: Verdict) -> str:
    if not verdict.steps:
        return "<p>No steps found.</p>"
    points = [
        StepPoint(
            row.rank, row.step, row.kind, row.dur_ns / 1e6, row.expected_ns / 1e6, row.anomalous
        )
        for row in verdict.steps
    ]
    return chart("chart-steps", steps_spec(points), "step time per rank, observed and expected")


def _finding_rank(verdict: Verdict, finding: Finding) -> int:
    if finding.rank is not None:
        return finding.rank
    rows = [r for r in verdict.steps if r.step == finding.step]
    return max(rows, key=lambda r: r.dur_ns).rank if rows else verdict.ranks[0]


def _normal_step(verdict: Verdict, finding: Finding) -> int | None:
    """A step of the same rank and kind that nothing flagged, of median duration among those."""
    rank = _finding_rank(verdict, finding)
    normal = [r for r in verdict.steps if r.rank == rank and not r.anomalous]
    same_kind = [r for r in normal if r.kind == finding.step_kind] or normal
    if not same_kind:
        return None
    ordered = sorted(same_kind, key=lambda r: r.dur_ns)
    return ordered[len(ordered) // 2].step


def _breakdown_chart(breakdown: RunBreakdown, rank: int, worst: int, normal: int | None) -> str:
    by_step = {(s.rank, s.step): s for s in breakdown.steps}
    rows = []
    worst_label = f"step {worst} (worst)" if normal is not None else f"step {worst}"
    for label, step in ((worst_label, worst), (f"step {normal} (normal)", normal)):
        part = by_step.get((rank, step)) if step is not None else None
        if part is not None:
            rows.extend(_breakdown_rows(label, part))
    if not rows:
        return "<p>No GPU activity recorded for these steps.</p>"
    return chart("chart-breakdown", breakdown_spec(rows), "where the step's time went")


def _breakdown_rows(label: str, part: StepBreakdown) -> list[dict]:
    """The step's span split into GPU work by kind and GPU idle by cause, in ms."""
    busy, idle = part.busy, part.idle
    communication = busy.exposed_communication_ns
    memory = max(0, busy.busy_ns - busy.compute_ns - communication)
    pieces = [
        ("compute", busy.compute_ns),
        ("communication (not overlapped)", communication),
        ("memcpy / memset", min(memory, busy.memory_ns)),
        ("idle: blocking sync", idle.sync_ns),
        ("idle: kernel launches", idle.launch_ns),
        ("idle: scheduler", idle.scheduler_ns),
        ("idle: host (Python, CPU ops)", idle.host_ns),
        ("idle: nothing recorded", idle.unrecorded_ns),
    ]
    return [{"step": label, "part": name, "ms": round(ns / 1e6, 4)} for name, ns in pieces]


def _excess_chart(tree: CallTree, rank: int, worst: int, normal: int | None) -> str:
    if normal is None:
        return "<p>No normal step on this rank to compare with.</p>"
    worst_time, normal_time = _self_time(tree, rank, worst), _self_time(tree, rank, normal)
    rows = []
    for (name, layer), ns in worst_time.items():
        excess = ns - normal_time.get((name, layer), 0)
        if excess > 0:
            rows.append(
                {
                    "operator": short_name(name, 60),
                    "layer": layer,
                    "excess (ms)": round(excess / 1e6, 4),
                    "worst (ms)": round(ns / 1e6, 4),
                    "normal (ms)": round(normal_time.get((name, layer), 0) / 1e6, 4),
                }
            )
    rows.sort(key=lambda r: -r["excess (ms)"])
    if not rows:
        return "<p>No operator took longer than in the normal step.</p>"
    return chart(
        "chart-excess", excess_spec(rows[:EXCESS_OPERATORS]), "operators' excess self time"
    )


def _self_time(tree: CallTree, rank: int, step: int) -> dict[tuple[str, str], int]:
    """Self time per (operator name, layer) inside one step of one rank, step annotations aside."""
    steps = tree.steps
    rows = [k for k in range(len(steps)) if steps.rank[k] == rank and steps.index[k] == step]
    if not rows:
        return {}
    nodes = np.flatnonzero(tree.step == rows[0])
    nodes = nodes[nodes != steps.node[rows[0]]]
    totals: dict[tuple[str, str], int] = {}
    for node in nodes.tolist():
        key = (tree.node_name(node), LAYERS[tree.layer[node]])
        totals[key] = totals.get(key, 0) + int(tree.self_ns[node])
    return totals


def _run_origin(verdict: Verdict, tree: CallTree) -> int:
    if verdict.steps:
        return min(row.start_ns for row in verdict.steps)
    return int(tree.start.min()) if len(tree) else 0


def _wall_clock(ts_ns: int) -> str:
    if ts_ns < UNIX_NS_FLOOR:
        return "(no wall-clock time in the traces)"
    moment = datetime.fromtimestamp(ts_ns / 1e9, tz=UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _time_cell(ts_ns: int, origin_ns: int) -> str:
    """A log line's time as ms into the run, with the wall-clock time when the clock is unix."""
    into = f"+{(ts_ns - origin_ns) / 1e6:,.3f} ms"
    if ts_ns < UNIX_NS_FLOOR:
        return into
    clock = datetime.fromtimestamp(ts_ns / 1e9, tz=UTC).strftime("%H:%M:%S.%f")[:-3]
    return f"{into}<br><span class='meta'>{clock} UTC</span>"


def _rank_text(finding: Finding) -> str:
    """The finding's rank, with the peers the trace cannot tell from it (a slow link's ends)."""
    if not finding.alike_ranks:
        return str(finding.rank)
    return f"{finding.rank} (or {', '.join(map(str, finding.alike_ranks))}: alike link times)"


def _finding_details(verdict: Verdict, finding: Finding, origin_ns: int) -> str:
    """One finding folded: per-rank times of its step, evidence, candidates, its log lines."""
    rank_rows = sorted((r for r in verdict.steps if r.step == finding.step), key=lambda r: r.rank)
    parts = [
        f"<details class='finding' id='finding-{finding.step}'><summary>step {finding.step} "
        f"({esc(finding.step_kind)}): {esc(finding.fault_type or 'cause unknown')} — "
        f"<code>{esc(short_name(finding.operator or '—', 80))}</code>"
        f"{'' if finding.rank is None else ' on rank ' + esc(_rank_text(finding))}</summary>",
        f"<p>{esc(finding.explanation)}</p>",
    ]
    if rank_rows:
        parts.append(
            "<div class='scroll'><table class='ranks'><tr><th>rank</th><th>duration</th>"
            "<th>expected</th><th>score</th></tr>"
        )
        parts.extend(
            f"<tr><td>{r.rank}</td><td class='num{' bad' if r.anomalous else ''}'>"
            f"{esc(format_ns(r.dur_ns))}</td><td class='num'>{esc(format_ns(r.expected_ns))}</td>"
            f"<td class='num'>{r.score:.1f}</td></tr>"
            for r in rank_rows
        )
        parts.append("</table></div>")
    if finding.evidence:
        parts.append(
            "<h3>Evidence</h3><div class='scroll'><table class='evidence'><tr><th>what</th>"
            "<th>observed</th><th>normal</th><th>z</th><th>normal is</th></tr>"
        )
        parts.extend(
            f"<tr><td><code>{esc(e.what)}</code></td>"
            f"<td class='num'>{esc(format_ns(e.observed_ns))}</td>"
            f"<td class='num'>{esc(format_ns(e.normal_ns) if e.normal_ns > 0 else '—')}</td>"
            f"<td class='num'>{e.z:.1f}</td><td>{esc(e.reference)}</td></tr>"
            for e in finding.evidence
        )
        parts.append("</table></div>")
    if finding.candidates:
        parts.append("<h3>Candidates</h3><ol>")
        parts.extend(
            f"<li><code>{esc(short_name(str(c.get('operator', '—')), 80))}</code>"
            f" on rank {esc(c.get('rank', '—'))}, score {esc(_number(c.get('score')))}</li>"
            for c in finding.candidates[:5]
        )
        parts.append("</ol>")
    parts.append("<h3>Log lines in this step</h3>")
    parts.append(_log_lines(finding.log_lines, origin_ns))
    parts.append("</details>")
    return "".join(parts)


def _number(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _findings_table(verdict: Verdict) -> str:
    findings = verdict.findings
    if not findings:
        return "<p>None: every step took what its batch composition predicts.</p>"
    rows = [
        "<div class='scroll'><table id='findings'><tr><th>step</th><th>kind</th>"
        "<th>duration on the rank</th><th>expected</th><th>score</th><th>p(model)</th>"
        "<th>rank</th><th>operator</th><th>fault type</th><th>explanation</th></tr>"
    ]
    for f in findings:
        dur_ns, expected_ns = verdict.on_its_rank(f)
        rows.append(
            f"<tr><td class='num'><a href='#finding-{f.step}'>{f.step}</a></td>"
            f"<td>{esc(f.step_kind)}</td>"
            f"<td class='num bad'>{esc(format_ns(dur_ns))}</td>"
            f"<td class='num'>{esc(format_ns(expected_ns))}</td>"
            f"<td class='num'>{f.score:.1f}</td>"
            f"<td class='num'>{'—' if f.probability is None else f'{f.probability:.2f}'}</td>"
            f"<td>{esc(_rank_text(f) if f.rank is not None else '—')}</td>"
            f"<td><code>{esc(short_name(f.operator or '—', 80))}</code></td>"
            f"<td>{esc(f.fault_type or '—')}</td><td>{esc(f.explanation)}</td></tr>"
        )
    rows.append("</table></div>")
    return "".join(rows)


def _tree_section(tree: CallTree, finding: Finding) -> str:
    steps = tree.steps
    rank = finding.rank if finding.rank is not None else int(steps.rank[0])
    match = [
        k for k in range(len(steps)) if steps.rank[k] == rank and steps.index[k] == finding.step
    ]
    if not match:
        return "<p>The step's tree is not available for that rank.</p>"
    root = int(steps.node[match[0]])
    suspect = finding.operator_node
    path: set[int] = set()
    node = suspect
    while node is not None and node >= 0:
        path.add(int(node))
        node = int(tree.parent[node]) if tree.parent[node] >= 0 else None
    return "<div id='tree'>" + _tree_html(tree, root, path, suspect, finding) + "</div>"


def _visible_children(tree, node: int, path: set[int]) -> list[int]:
    """Children with Python frames folded away: a hidden frame's own children take its place, so
    an operator called through Python (and the suspect under it) stays reachable. A frame on the
    suspect's path stays: the model's pointer may pick a Python frame itself. Iterative: a stack
    of hidden frames may be deeper than Python's recursion limit."""
    visible: list[int] = []
    python = LAYERS.index("python")
    pending = tree.children(node).tolist()[::-1]
    while pending:
        child = pending.pop()
        if tree.layer[child] == python and child not in path:
            pending.extend(tree.children(child).tolist()[::-1])
        else:
            visible.append(child)
    return visible


def _tree_html(tree, root: int, path: set[int], suspect, finding: Finding) -> str:
    """The nested <details> of the subtree under `root`, built without recursion (the tree may be
    any depth): a first pass chooses each node's shown children, a second joins the HTML from
    the leaves up."""
    plan: dict[int, tuple[list[int], int | None]] = {}  # node -> (shown children, "more" count)
    order: list[int] = []
    pending = [(root, 0)]
    while pending:
        node, level = pending.pop()
        children = _visible_children(tree, node, path)
        if level >= TREE_DEPTH:  # deep down, only the way to the suspect is worth the space
            children = [c for c in children if c in path]
        shown, more = children[:TREE_CHILDREN], None
        if len(children) > TREE_CHILDREN:
            hidden = children[TREE_CHILDREN:]
            on_path = [c for c in hidden if c in path]
            shown, more = shown + on_path, len(hidden) - len(on_path)
        plan[node] = (shown, more)
        order.append(node)
        pending.extend((c, level + 1) for c in reversed(shown))
    html: dict[int, str] = {}
    for node in reversed(order):  # pre-order reversed: every child is built before its parent
        shown, more = plan[node]
        inner = [html.pop(c) for c in shown]
        html[node] = _node_html(tree, node, path, suspect, finding, inner, more, node == root)
    return html[root]


def _node_html(
    tree,
    node: int,
    path: set[int],
    suspect,
    finding: Finding,
    inner: list[str],
    more: int | None,
    is_root: bool,
) -> str:
    label = (
        f"<code>{esc(short_name(tree.node_name(node), 100))}</code> "
        f"{esc(format_ns(tree.dur[node]))} (self {esc(format_ns(tree.self_ns[node]))}) "
        f"<span class='layer'>{esc(LAYERS[tree.layer[node]])}"
        f"{' · launched' if tree.edge[node] == EDGE_LAUNCH else ''}</span>"
    )
    if node == suspect and finding.evidence:
        e = finding.evidence[0]
        label += (
            f" <span class='bad'>suspect: {esc(format_ns(e.observed_ns))} vs normal "
            f"{esc(format_ns(e.normal_ns))}</span>"
        )
    classes = " ".join(
        c for c in ("suspect" if node == suspect else "", "path" if node in path else "") if c
    )
    if not inner:
        return f"<div class='{classes}' style='margin-left:14px'>{label}</div>"
    opened = " open" if node in path or is_root else ""
    if more is not None:
        inner = [*inner, f"<div style='margin-left:14px'>… {more} more</div>"]
    return (
        f"<details class='{classes}'{opened}><summary>{label}</summary>{''.join(inner)}</details>"
    )


def _longest_step(verdict: Verdict) -> int | None:
    return max(verdict.steps, key=lambda row: row.dur_ns).step if verdict.steps else None


def _rank_labels(collectives: StepCollectives) -> dict[int, str]:
    """'rank 1 · last in at 15 of 16': how often each rank was the one the others waited for."""
    if not collectives.shared:
        return {rank: f"rank {rank}" for rank in collectives.ranks}
    shared = sum(1 for group in collectives.instances() if len(group) > 1)
    last = collectives.last_arrivals()
    return {
        rank: f"rank {rank} · last in at {last[rank]} of {shared}" for rank in collectives.ranks
    }


def _gantt_chart(collectives: StepCollectives) -> str:
    origin = collectives.origin_ns
    labels = _rank_labels(collectives)
    rows = []
    for segment in collectives.segments():
        row = {
            "rank": labels[segment.rank],
            "part": segment.part,
            "start (ms)": round((segment.start_ns - origin) / 1e6, 6),
            "end (ms)": round((segment.end_ns - origin) / 1e6, 6),
        }
        visit = segment.visit
        if visit is not None:
            row |= {
                "collective": short_name(visit.name, TOOLTIP_NAME_CHARS),
                "arrival (ms)": round((visit.start_ns - origin) / 1e6, 6),
                "wait (ms)": round(visit.wait_ns / 1e6, 6),
                "own time (ms)": round((visit.end_ns - visit.start_ns) / 1e6, 6),
            }
        rows.append(row)
    note = (
        ""
        if collectives.shared
        else "<p class='meta'>Only one rank ran these collectives in the traces given: its"
        " waiting cannot be told apart from transfer.</p>"
    )
    drawn = chart(
        "chart-gantt",
        gantt_spec(rows, collectives.step),
        f"collectives of step {collectives.step} per rank: arrival and wait",
    )
    return drawn + note


def _collectives_table(collectives: StepCollectives) -> str:
    """Arrival (after the first rank) and own time of each collective on every rank."""
    ranks = collectives.ranks
    rows = ["<table id='collectives'><tr><th>collective</th>"]
    rows.extend(f"<th>rank {r} arrival</th><th>rank {r} time</th>" for r in ranks)
    rows.append("<th>arrival skew</th></tr>")
    for group in collectives.instances()[:TABLE_INSTANCES]:
        first = min(v.start_ns for v in group)
        last = max(v.start_ns for v in group)
        by_rank = {v.rank: v for v in group}
        name = group[0].name
        cells = [f"<tr><td><code title='{esc(name)}'>{esc(short_name(name, 50))}</code></td>"]
        for r in ranks:
            visit = by_rank.get(r)
            if visit is None:
                cells.append("<td>—</td><td>—</td>")
                continue
            cls = " bad" if visit.is_last and last > first else ""
            cells.append(
                f"<td class='num{cls}'>+{esc(format_ns(visit.start_ns - first))}</td>"
                f"<td class='num'>{esc(format_ns(visit.end_ns - visit.start_ns))}</td>"
            )
        cells.append(f"<td class='num'>{esc(format_ns(last - first))}</td></tr>")
        rows.append("".join(cells))
    hidden = len(collectives.instances()) - TABLE_INSTANCES
    if hidden > 0:
        rows.append(f"<tr><td colspan='{2 * len(ranks) + 2}'>… {hidden} more</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _log_lines(lines: list[LogLine], origin_ns: int) -> str:
    if not lines:
        return "<p>No log line is aligned to this step (no logs given, or none in its window).</p>"
    rows = [
        "<div class='scroll'><table class='logs'><tr><th>time</th><th>rank</th><th>level</th>"
        "<th>line</th></tr>"
    ]
    rows.extend(
        f"<tr><td class='num'>{_time_cell(line.ts_ns, origin_ns)}</td>"
        f"<td>{esc(line.rank if line.rank is not None else '—')}</td>"
        f"<td>{esc(line.level)}</td><td><code>{esc(line.text)}</code></td></tr>"
        for line in lines
    )
    rows.append("</table></div>")
    return "".join(rows)
