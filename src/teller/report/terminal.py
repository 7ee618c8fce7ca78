"""The verdict as a few lines for a terminal: what was slow, who, why, and what was missing.

Anomalous steps that blame the same rank are one incident (`teller.rca.diagnose.incidents`): a
person wants one paragraph per cause, not per step.
"""

from __future__ import annotations

import textwrap
from collections import Counter

from teller.callchain.breakdown import RunBreakdown, StepBreakdown, idle_summary, share
from teller.callchain.host_activity import IDLE_CAUSES
from teller.callchain.render import format_ns, short_name
from teller.errors import printable
from teller.rca.diagnose import MODEL_UNAVAILABLE, incidents, step_ranges, worst_of
from teller.rca.verdict import Finding, Verdict

#: Incidents printed in full; the JSON and HTML reports hold every finding.
SHOWN_INCIDENTS = 5
#: Ranks in the "where the time went" table; the JSON holds every rank and step.
SHOWN_RANKS = 8
_CAUSE_COLUMNS = {
    "sync": "sync",
    "launch": "launch",
    "scheduler": "sched",
    "host": "host",
    "unrecorded": "none",
}


def render_terminal(verdict: Verdict, breakdown: RunBreakdown | None = None) -> str:
    lines = [verdict.summary.splitlines()[0] if verdict.summary else "", ""]
    groups = incidents(verdict.findings)
    for group in groups[:SHOWN_INCIDENTS]:
        worst = worst_of(group)
        where = f"rank {worst.rank}" if worst.rank is not None else "all ranks"
        counts = Counter(f.operator for f in group if f.operator)
        operator = (
            ", ".join(
                short_name(op, 60) + (f" ({n} steps)" if len(counts) > 1 else "")
                for op, n in counts.most_common(2)
            )
            if counts
            else "no single operator"
        )
        noun = "step" if len(group) == 1 else "steps"
        lines.append(
            f"{noun} {step_ranges([f.step for f in group])}  ({len(group)} {noun}, worst: step "
            f"{worst.step} [{worst.step_kind}] {_took(worst)})"
        )
        kinds = Counter(f.fault_type for f in group if f.fault_type)
        fault = (
            " — "
            + ", ".join(
                k + (f" ({n} steps)" if len(kinds) > 1 else "") for k, n in kinds.most_common(3)
            )
            if kinds
            else ""
        )
        lines.append(f"  suspect: {operator} on {where}{fault}")
        lines.extend(_wrapped("  why: ", worst.explanation))
        for evidence in worst.evidence[:2]:
            normal = format_ns(evidence.normal_ns) if evidence.normal_ns else "—"
            lines.append(
                f"  evidence: {short_name(evidence.what, 70)}: {format_ns(evidence.observed_ns)} "
                f"(normal {normal}; {evidence.reference})"
            )
        shown_logs = [
            line
            for f in group
            for line in f.log_lines
            if line.level in ("WARNING", "ERROR", "CRITICAL")
        ]
        for line in (shown_logs or worst.log_lines)[:3]:
            lines.append(f"  log: {line.text[:160]}")
        if worst.requests:
            lines.append(
                f"  requests in step {worst.step}: {len(worst.requests)} ({', '.join(worst.requests[:3])}…)"
            )
        lines.append("")
    hidden = len(groups) - SHOWN_INCIDENTS
    if hidden > 0:
        lines.append(f"… and {hidden} more incidents (see --format json or html)")
    if breakdown is not None and breakdown.runs:
        lines.extend(render_breakdown(breakdown))
        lines.append("")
    elif breakdown is not None and breakdown.ranks_without_gpu:
        ranks = ", ".join(map(str, breakdown.ranks_without_gpu))
        lines.extend([f"where the time went: no GPU activity recorded (rank {ranks})", ""])
    for item in verdict.missing:
        lines.append(f"missing: {item}")
    lines.extend(f"warning: {w}" for w in _method_warnings(verdict))
    return printable("\n".join(lines).rstrip() + "\n")


def render_breakdown(breakdown: RunBreakdown) -> list[str]:
    """Where the time went: one row per rank over its whole run (shares of its span: busy and
    idle add up to 100%, the idle causes to idle), the most idle step's sentence, and the kernels
    and operators that took the most GPU time on the busiest rank."""
    causes = [_CAUSE_COLUMNS[c] for c in IDLE_CAUSES]
    header = ["rank", "span", "busy", "compute", "comm", "exposed", "memcpy", "idle", *causes]
    rows = [header]
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
    widths = [max(len(row[k]) for row in rows) for k in range(len(header))]
    lines = ["where the time went (GPU, whole run per rank; every step in --format json):"]
    for row in rows:
        lines.append(
            "  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
        )
    hidden = len(breakdown.runs) - SHOWN_RANKS
    if hidden > 0:
        lines.append(f"  … and {hidden} more ranks")
    most_idle_run = max(breakdown.runs, key=_idle_share)
    lines.append(f"  {idle_summary(most_idle_run)}")
    if len(breakdown.steps) > 1:
        lines.append(f"  most idle step: {idle_summary(max(breakdown.steps, key=_idle_share))}")
    busiest = max(breakdown.runs, key=lambda run: run.busy.busy_ns)
    where = f" on rank {busiest.rank}" if len(breakdown.runs) > 1 else ""
    busy_ns = busiest.busy.busy_ns
    for title, items in (
        (f"top kernels{where}", busiest.top_kernels[:3]),
        (f"top operators{where}, by the GPU time they launched", busiest.top_operators[:3]),
    ):
        if items:
            lines.append(f"  {title} (share of GPU busy, calls × time per call):")
        lines.extend(
            f"    {share(item.gpu_ns, busy_ns):>5}  {item.calls}× {format_ns(item.per_call_ns)}  "
            f"{short_name(item.name, 80)}"
            for item in items
        )
    return lines


#: Width the explanation is wrapped to: it runs to several sentences.
WHY_WIDTH = 100


def _wrapped(lead: str, text: str) -> list[str]:
    """`text` wrapped after `lead`, continued under its first word; words are never broken (a
    kernel name stays whole)."""
    return textwrap.wrap(
        text,
        WHY_WIDTH,
        initial_indent=lead,
        subsequent_indent=" " * len(lead),
        break_long_words=False,
        break_on_hyphens=False,
    )


def _idle_share(breakdown: StepBreakdown) -> float:
    return breakdown.idle_ns / breakdown.span_ns if breakdown.span_ns else 0.0


def _method_warnings(verdict: Verdict) -> list[str]:
    """A verdict that fell back from the model to the localizer must say so where it is read."""
    return [w for w in verdict.warnings if w.startswith(MODEL_UNAVAILABLE)]


def _took(finding: Finding) -> str:
    """A step's time, against what its batch predicts where it was slower than that (a step
    flagged by one operator among its layers can take what its batch predicts)."""
    took = format_ns(finding.step_dur_ns)
    if finding.step_dur_ns > finding.step_expected_ns:
        took += f" vs {format_ns(finding.step_expected_ns)} expected"
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
            f"step {f.step}  {certainty}  {_took(f)}  {f.fault_type or 'unknown'}: {where}"
        )
        lines.append(f"  {f.explanation}")
        for evidence in f.evidence[:1]:
            lines.append(
                f"  evidence: {short_name(evidence.what, 70)}: {format_ns(evidence.observed_ns)}"
                f" observed vs {format_ns(evidence.normal_ns)} normal ({evidence.reference})"
            )
    if len(verdict.findings) > top:
        lines.append(f"… {len(verdict.findings) - top} more")
    lines.extend(f"warning: {w}" for w in _method_warnings(verdict))
    return printable("\n".join(lines))
