"""The verdict as a few lines for a terminal: what was slow, who, why, and what was missing."""

from __future__ import annotations

from teller.callchain.render import format_ns, short_name
from teller.rca.verdict import Verdict

#: Findings printed in full; the JSON and HTML reports hold them all.
SHOWN_FINDINGS = 5


def render_terminal(verdict: Verdict) -> str:
    lines = [verdict.summary.splitlines()[0] if verdict.summary else "", ""]
    for finding in verdict.findings[:SHOWN_FINDINGS]:
        where = f"rank {finding.rank}" if finding.rank is not None else "all ranks"
        operator = short_name(finding.operator, 70) if finding.operator else "no single operator"
        lines.append(
            f"step {finding.step} [{finding.step_kind}]  {format_ns(finding.step_dur_ns)} "
            f"vs {format_ns(finding.step_expected_ns)} expected  (score {finding.score:.1f})"
        )
        lines.append(
            f"  suspect: {operator} on {where}"
            + (f" — {finding.fault_type}" if finding.fault_type else "")
        )
        lines.append(f"  why: {finding.explanation}")
        for evidence in finding.evidence[:2]:
            normal = format_ns(evidence.normal_ns) if evidence.normal_ns else "—"
            lines.append(
                f"  evidence: {short_name(evidence.what, 70)}: {format_ns(evidence.observed_ns)} "
                f"(normal {normal}; {evidence.reference})"
            )
        for line in finding.log_lines[:3]:
            lines.append(f"  log: {line.text[:160]}")
        lines.append("")
    hidden = len(verdict.findings) - SHOWN_FINDINGS
    if hidden > 0:
        lines.append(f"… and {hidden} more anomalous steps (see --format json or html)")
    for item in verdict.missing:
        lines.append(f"missing: {item}")
    return "\n".join(lines).rstrip() + "\n"
