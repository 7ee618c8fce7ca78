"""The verdict as a few lines for a terminal: what was slow, who, why, and what was missing.

Anomalous steps that blame the same rank (or the same ranks, where a slow link's ends cannot be
told apart) are one incident (`teller.rca.diagnose.incidents`): a person wants one paragraph per
cause, not per step. Tables and wrapping come from `teller.report.console`: plain text at a fixed
width unless the `Look` says a terminal.
"""

from __future__ import annotations

from collections import Counter

from teller.callchain.breakdown import RunBreakdown, idle_summary, share
from teller.callchain.host_activity import IDLE_CAUSES
from teller.callchain.render import format_ns, short_name
from teller.errors import printable
from teller.faults import engine_wide
from teller.rca.diagnose import (
    MODEL_UNAVAILABLE,
    blamed_ranks,
    incidents,
    step_ranges,
    worst_of,
)
from teller.rca.plans import plural
from teller.rca.verdict import Finding, Verdict
from teller.report.console import PLAIN, Look, table_lines, wrapped

#: Incidents printed in full; the JSON and HTML reports hold every finding.
SHOWN_INCIDENTS = 5
#: Ranks in the "where the time went" table; the JSON holds every rank and step.
SHOWN_RANKS = 8
#: Lines a log line may wrap to before it is shortened (at a space).
LOG_LINES = 3
#: Characters the share, calls and time columns of the top-kernel tables take, with the indent.
TOP_COLUMNS_WIDTH = 34
_CAUSE_COLUMNS = {
    "sync": "sync",
    "launch": "launch",
    "scheduler": "sched",
    "host": "host",
    "unrecorded": "none",
}


def render_terminal(
    verdict: Verdict, breakdown: RunBreakdown | None = None, look: Look = PLAIN
) -> str:
    lines = wrapped("", verdict.summary.splitlines()[0], look) if verdict.summary else [""]
    lines.append("")
    groups = incidents(verdict.findings)
    for group in groups[:SHOWN_INCIDENTS]:
        worst = worst_of(group)
        # a capped scheduler's findings keep a measured operator as evidence, not as a suspect
        whole = engine_wide(f.fault_type for f in group if f.fault_type)
        where = (not whole and blamed_ranks(group)) or "all ranks"
        counts = Counter(f.operator for f in group if f.operator and not whole)
        operator = (
            ", ".join(
                short_name(op, 60) + (f" ({plural(n, 'step')})" if len(counts) > 1 else "")
                for op, n in counts.most_common(2)
            )
            if counts
            else "no single operator"
        )
        noun = "step" if len(group) == 1 else "steps"
        lines.extend(
            wrapped(
                "",
                f"{noun} {step_ranges([f.step for f in group])}  ({len(group)} {noun}, worst: "
                f"step {worst.step} [{worst.step_kind}] {_took(verdict, worst, say_rank=True)})",
                look,
            )
        )
        kinds = Counter(f.fault_type for f in group if f.fault_type)
        fault = (
            " — "
            + ", ".join(
                k + (f" ({plural(n, 'step')})" if len(kinds) > 1 else "")
                for k, n in kinds.most_common(3)
            )
            if kinds
            else ""
        )
        lines.extend(wrapped("  suspect: ", f"{operator} on {where}{fault}", look))
        lines.extend(wrapped("  why: ", worst.explanation, look))
        for evidence in worst.evidence[:2]:
            normal = format_ns(evidence.normal_ns) if evidence.normal_ns else "—"
            lines.extend(
                wrapped(
                    "  evidence: ",
                    f"{_evidence_name(evidence.what)}: {format_ns(evidence.observed_ns)} "
                    f"(normal {normal}; {evidence.reference})",
                    look,
                )
            )
        shown_logs = [
            line
            for f in group
            for line in f.log_lines
            if line.level in ("WARNING", "ERROR", "CRITICAL")
        ]
        for line in (shown_logs or worst.log_lines)[:3]:
            lines.extend(wrapped("  log: ", line.text, look, max_lines=LOG_LINES))
        if worst.requests:
            lines.extend(
                wrapped(
                    f"  requests in step {worst.step}: ",
                    f"{len(worst.requests)} ({', '.join(worst.requests[:3])}…)",
                    look,
                )
            )
        lines.append("")
    hidden = len(groups) - SHOWN_INCIDENTS
    if hidden > 0:
        lines.append(f"… and {hidden} more incidents (see --format json or html)")
    if breakdown is not None and breakdown.runs:
        lines.extend(render_breakdown(breakdown, look))
        lines.append("")
    elif breakdown is not None and breakdown.ranks_without_gpu:
        ranks = ", ".join(map(str, breakdown.ranks_without_gpu))
        lines.extend([f"where the time went: no GPU activity recorded (rank {ranks})", ""])
    for item in verdict.missing:
        lines.extend(wrapped("missing: ", item, look))
    for warning in _method_warnings(verdict):
        lines.extend(wrapped("warning: ", warning, look))
    return "\n".join(lines).rstrip() + "\n"  # every line from `wrapped` or `table_lines`


def render_breakdown(breakdown: RunBreakdown, look: Look = PLAIN) -> list[str]:
    """Where the time went: one row per rank over its whole run (shares of its span: busy and
    idle add up to 100%, the idle causes to idle), the most idle step's sentence, and the kernels
    and operators that took the most GPU time on the busiest rank."""
    causes = [_CAUSE_COLUMNS[c] for c in IDLE_CAUSES]
    header = ["rank", "span", "busy", "compute", "comm", "exposed", "memcpy", "idle", *causes]
    rows = []
    for run in breakdown.runs[:SHOWN_RANKS]:
        busy, span = run.busy, run.span_ns
        rows.append(
            [
                str(run.rank),
                format_ns(span),
                *(
                    share(ns, span)
                    for ns in (
                        busy.busy_ns,
                        busy.compute_ns,
                        busy.communication_ns,
                        busy.exposed_communication_ns,
                        busy.memory_ns,
                        run.idle_ns,
                    )
                ),
                *(share(run.idle.of(cause), span) for cause in IDLE_CAUSES),
            ]
        )
    title = "where the time went (GPU, whole run per rank; every step in --format json):"
    lines = wrapped("", title, look)
    lines.extend(table_lines(header, rows, look, right=range(1, len(header))))
    hidden = len(breakdown.runs) - SHOWN_RANKS
    if hidden > 0:
        lines.append(f"  … and {hidden} more ranks")
    most_idle_run = max(breakdown.runs, key=lambda b: b.idle_share)
    lines.extend(wrapped("  ", idle_summary(most_idle_run), look))
    steps = len(breakdown.rows) if breakdown.rows is not None else len(breakdown.steps)
    if steps > 1:  # a run analysed in parts keeps a few step rows, and every one in `rows`
        most_idle = idle_summary(max(breakdown.steps, key=lambda b: b.idle_share))
        lines.extend(wrapped("  most idle step: ", most_idle, look))
    busiest = max(breakdown.runs, key=lambda run: run.busy.busy_ns)
    where = f" on rank {busiest.rank}" if len(breakdown.runs) > 1 else ""
    busy_ns = busiest.busy.busy_ns
    name_width = max(30, look.width - TOP_COLUMNS_WIDTH)
    for title, noun, items in (
        (f"top kernels{where}", "kernel", busiest.top_kernels[:3]),
        (
            f"top operators{where}, by the GPU time they launched",
            "operator",
            busiest.top_operators[:3],
        ),
    ):
        if not items:
            continue
        lines.extend(wrapped("  ", f"{title} (share of GPU busy, calls × time per call):", look))
        top = [
            [
                share(item.gpu_ns, busy_ns),
                f"{item.calls}×",
                format_ns(item.per_call_ns),
                short_name(item.name, name_width),
            ]
            for item in items
        ]
        header = ["share", "calls", "per call", noun]
        lines.extend(table_lines(header, top, look, indent=4, right=(0, 1, 2)))
    return lines


def _method_warnings(verdict: Verdict) -> list[str]:
    """A verdict that fell back from the model to the localizer must say so where it is read."""
    return [w for w in verdict.warnings if w.startswith(MODEL_UNAVAILABLE)]


def _took(verdict: Verdict, finding: Finding, say_rank: bool = False) -> str:
    """A step's time on the finding's rank (the one its explanation states), against what its
    batch predicts where it was slower than that (a step flagged by one operator among its
    layers can take what its batch predicts). `say_rank` names the rank where the line does
    not already."""
    dur_ns, expected_ns = verdict.on_its_rank(finding)
    took = format_ns(dur_ns)
    if say_rank and finding.rank is not None:
        took += f" on rank {finding.rank}"
    if dur_ns > expected_ns:
        took += f" vs {format_ns(expected_ns)} expected"
    return took


def render_findings(verdict: Verdict, top: int = 10) -> str:
    """`teller diagnose`: one entry per anomalous step, most certain first (the model's
    probability, else the localizer's z-score), with its operator, rank, fault and evidence."""
    iterations = len({row.step for row in verdict.steps})
    lines = [
        f"{len(verdict.findings)} anomalous step(s) of {iterations} (method {verdict.method})"
        if verdict.findings
        else f"no anomalous step among {iterations} (method {verdict.method})"
    ]
    for f in verdict.findings[:top]:
        certainty = f"p={f.probability:.2f}" if f.probability is not None else f"z={f.score:.1f}"
        where = (
            f"{short_name(f.operator, 60)} on rank {f.rank}" if f.operator else "no single operator"
        )
        lines.append(
            f"step {f.step}  {certainty}  {_took(verdict, f)}  {f.fault_type or 'unknown'}: {where}"
        )
        lines.append(f"  {f.explanation}")
        for evidence in f.evidence[:1]:
            lines.append(
                f"  evidence: {_evidence_name(evidence.what)}: {format_ns(evidence.observed_ns)}"
                f" observed vs {format_ns(evidence.normal_ns)} normal ({evidence.reference})"
            )
    if len(verdict.findings) > top:
        lines.append(f"… {len(verdict.findings) - top} more")
    lines.extend(f"warning: {w}" for w in _method_warnings(verdict))
    return printable("\n".join(lines))


def _evidence_name(what: str) -> str:
    """An evidence line's subject with a long operator or kernel name shortened and its
    " on rank N (kind)" tail kept whole: the tail says where and what was measured."""
    name, on, where = what.rpartition(" on rank ")
    if not on:
        return short_name(what, 70)
    return f"{short_name(name, 60)}{on}{where}"
