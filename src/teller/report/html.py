"""One self-contained HTML file: the verdict first, then the evidence a person checks it against.

No script, font or style is fetched: everything is inline, so the file opens offline and can be
attached to a ticket. Every string that came from a trace or a log goes through `esc` (html.escape
with quotes), and the page needs no JavaScript (the tree folds with <details>).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import numpy as np

from teller.callchain.render import format_ns, short_name
from teller.callchain.tree import EDGE_LAUNCH
from teller.ingest.schema import LAYERS
from teller.rca.verdict import Finding, Verdict

if TYPE_CHECKING:
    from teller.callchain.tree import CallTree

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
th,td{border:1px solid #e3e7ee;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef1f6}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#c0392b;font-weight:600}
details{margin-left:14px} summary{cursor:pointer}
.suspect>summary,.suspect{background:#fde2df}
.path>summary{font-weight:600}
.layer{color:#5b6473;font-size:11px}
.missing{color:#8a5a00}
svg text{font:11px system-ui,sans-serif;fill:#5b6473}
code{font-size:12px}
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def render_html(verdict: Verdict, tree: CallTree) -> str:
    worst = verdict.findings[0] if verdict.findings else None
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>teller report — {esc(', '.join(verdict.inputs)[:120])}</title>",
        f"<style>{STYLE}</style></head><body><main>",
        "<h1>teller report</h1>",
        f"<div class='meta'>inputs: {esc(', '.join(verdict.inputs))} · ranks {esc(verdict.ranks)}"
        f" · method {esc(verdict.method)} · schema {esc(verdict.schema)}</div>",
        f"<section id='verdict' class='verdict{'' if verdict.findings else ' ok'}'>"
        f"<pre>{esc(verdict.summary)}</pre></section>",
    ]
    parts.extend(f"<p class='missing'>missing: {esc(item)}</p>" for item in verdict.missing)
    parts.append("<h2>Step durations per rank</h2>")
    parts.append(_timeline(verdict))
    parts.append("<h2>Anomalous steps</h2>")
    parts.append(_findings_table(verdict.findings))
    if worst is not None:
        parts.append(f"<h2>Call-chain tree of step {worst.step} (suspect path highlighted)</h2>")
        parts.append(_tree_section(tree, worst))
        parts.append(f"<h2>Collectives of step {worst.step}: arrival per rank</h2>")
        parts.append(_collectives(tree, worst))
        parts.append("<h2>Aligned log lines</h2>")
        parts.append(_log_lines(worst))
    if verdict.warnings:
        parts.append("<h2>Warnings</h2><ul>")
        parts.extend(f"<li>{esc(w)}</li>" for w in verdict.warnings)
        parts.append("</ul>")
    parts.append("</main></body></html>")
    return "\n".join(parts)


def _timeline(verdict: Verdict) -> str:
    """Inline SVG: one row of bars per rank, bar height = duration/expected, anomalies in red."""
    if not verdict.steps:
        return "<p>No steps found.</p>"
    ranks = sorted({row.rank for row in verdict.steps})
    steps = sorted({row.step for row in verdict.steps})
    width, row_height, left = 1100, 70, 60
    bar = max(1.0, (width - left) / max(len(steps), 1))
    position = {step: k for k, step in enumerate(steps)}
    peak = max(row.dur_ns for row in verdict.steps) or 1
    out = [
        f"<svg id='timeline' role='img' width='{width}' height='{row_height * len(ranks) + 20}' "
        "aria-label='step durations per rank'>"
    ]
    for r_index, rank in enumerate(ranks):
        base = row_height * (r_index + 1)
        out.append(f"<text x='4' y='{base - 4}'>rank {rank}</text>")
        for row in (row for row in verdict.steps if row.rank == rank):
            h = max(1.0, (row_height - 12) * row.dur_ns / peak)
            x = left + position[row.step] * bar
            colour = "#c0392b" if row.anomalous else "#7f8fa6"
            title = (
                f"step {row.step} ({row.kind}) {format_ns(row.dur_ns)}, expected "
                f"{format_ns(row.expected_ns)}, score {row.score:.1f}"
            )
            out.append(
                f"<rect class='{'anomalous' if row.anomalous else 'step'}' x='{x:.1f}' "
                f"y='{base - h:.1f}' width='{max(bar - 1, 1):.1f}' height='{h:.1f}' "
                f"fill='{colour}'><title>{esc(title)}</title></rect>"
            )
    out.append("</svg>")
    return "".join(out)


def _findings_table(findings: list[Finding]) -> str:
    if not findings:
        return "<p>None: every step took what its batch composition predicts.</p>"
    rows = [
        "<table id='findings'><tr><th>step</th><th>kind</th><th>duration</th><th>expected</th>"
        "<th>score</th><th>p(model)</th><th>rank</th><th>operator</th><th>fault type</th>"
        "<th>explanation</th></tr>"
    ]
    for f in findings:
        rows.append(
            f"<tr><td class='num'>{f.step}</td><td>{esc(f.step_kind)}</td>"
            f"<td class='num bad'>{esc(format_ns(f.step_dur_ns))}</td>"
            f"<td class='num'>{esc(format_ns(f.step_expected_ns))}</td>"
            f"<td class='num'>{f.score:.1f}</td>"
            f"<td class='num'>{'—' if f.probability is None else f'{f.probability:.2f}'}</td>"
            f"<td>{esc(f.rank if f.rank is not None else '—')}</td>"
            f"<td><code>{esc(short_name(f.operator or '—', 80))}</code></td>"
            f"<td>{esc(f.fault_type or '—')}</td><td>{esc(f.explanation)}</td></tr>"
        )
    rows.append("</table>")
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


def _collectives(tree: CallTree, finding: Finding) -> str:
    comm = tree.comm
    if not len(comm):
        return "<p>No collectives in this run.</p>"
    in_step = np.flatnonzero(tree.step[comm.node] >= 0)
    in_step = [
        k for k in in_step.tolist() if tree.steps.index[tree.step[comm.node[k]]] == finding.step
    ]
    if not in_step:
        return "<p>No collectives in this step.</p>"
    ranks = sorted(set(comm.rank[in_step].tolist()))
    rows = ["<table id='collectives'><tr><th>collective</th>"]
    rows.extend(f"<th>rank {r} arrival</th><th>rank {r} time</th>" for r in ranks)
    rows.append("<th>arrival skew</th></tr>")
    for instance in sorted(set(comm.instance[in_step].tolist()))[:60]:
        members = [k for k in in_step if comm.instance[k] == instance]
        first = min(int(comm.start_ns[k]) for k in members)
        last = max(int(comm.start_ns[k]) for k in members)
        by_rank = {int(comm.rank[k]): k for k in members}
        late_rank = max(members, key=lambda k: comm.start_ns[k])
        name = short_name(tree.node_name(int(comm.node[members[0]])), 50)
        cells = [f"<tr><td><code>{esc(name)}</code></td>"]
        for r in ranks:
            k = by_rank.get(r)
            if k is None:
                cells.append("<td>—</td><td>—</td>")
                continue
            cls = " bad" if k == late_rank and last - first > 0 else ""
            cells.append(
                f"<td class='num{cls}'>+{esc(format_ns(int(comm.start_ns[k]) - first))}</td>"
                f"<td class='num'>{esc(format_ns(int(comm.end_ns[k] - comm.start_ns[k])))}</td>"
            )
        cells.append(f"<td class='num'>{esc(format_ns(last - first))}</td></tr>")
        rows.append("".join(cells))
    rows.append("</table>")
    return "".join(rows)


def _log_lines(finding: Finding) -> str:
    if not finding.log_lines:
        return "<p>No log line is aligned to this step (no logs given, or none in its window).</p>"
    rows = ["<table id='logs'><tr><th>time</th><th>rank</th><th>level</th><th>line</th></tr>"]
    rows.extend(
        f"<tr><td class='num'>{line.ts_ns}</td><td>{esc(line.rank if line.rank is not None else '—')}</td>"
        f"<td>{esc(line.level)}</td><td><code>{esc(line.text)}</code></td></tr>"
        for line in finding.log_lines
    )
    rows.append("</table>")
    return "".join(rows)
