"""The verdict as a few lines for a terminal: what was slow, who, why, and what was missing.

Anomalous steps that blame the same rank are one incident (`teller.rca.diagnose.incidents`): a
person wants one paragraph per cause, not per step.
"""

from __future__ import annotations

from collections import Counter

from teller.callchain.render import format_ns, short_name
from teller.rca.diagnose import MODEL_UNAVAILABLE, incidents, step_ranges
from teller.rca.verdict import Verdict

#: Incidents printed in full; the JSON and HTML reports hold every finding.
SHOWN_INCIDENTS = 5


def render_terminal(verdict: Verdict) -> str:
    lines = [verdict.summary.splitlines()[0] if verdict.summary else "", ""]
    groups = incidents(verdict.findings)
    for group in groups[:SHOWN_INCIDENTS]:
        worst = group[0]
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
            f"{worst.step} [{worst.step_kind}] {format_ns(worst.step_dur_ns)} vs "
            f"{format_ns(worst.step_expected_ns)} expected)"
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
        lines.append(f"  why: {worst.explanation}")
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
    for item in verdict.missing:
        lines.append(f"missing: {item}")
    lines.extend(f"warning: {w}" for w in _method_warnings(verdict))
    return "\n".join(lines).rstrip() + "\n"


def _method_warnings(verdict: Verdict) -> list[str]:
    """A verdict that fell back from the model to the localizer must say so where it is read."""
    return [w for w in verdict.warnings if w.startswith(MODEL_UNAVAILABLE)]


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
            f"step {f.step}  {certainty}  {format_ns(f.step_dur_ns)} vs "
            f"{format_ns(f.step_expected_ns)} expected  {f.fault_type or 'unknown'}: {where}"
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
    return "\n".join(lines)
