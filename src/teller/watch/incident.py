"""An incident: the objective that broke, the capture it triggered, and teller's answer.

The headline is read from the verdict's findings inside the incident's own capture (a case also
holds the reference capture's normal steps, which are there to be compared against): the
(rank, fault type) most of those findings name, its most named operator, and its worst step.
This one record is what every exporter sends and what `incident.json` holds.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from teller.atomic import write_text_atomic
from teller.rca.verdict import Finding, Verdict
from teller.watch.slo import Check

#: A finding belongs to the incident capture when its step starts after the capture began (less
#: this, for the clock alignment between ranks).
CLOCK_SLACK_NS = 1_000_000_000


@dataclass
class Incident:
    case_dir: str
    engine_url: str
    objectives_broken: list[str]  # e.g. ["itl_p99<50ms: broken (212.0 ms, 1340 samples)"]
    observed: dict[str, float]  # objective text -> the window's value (base unit)
    capture_start_ns: int
    capture_end_ns: int
    reference_start_ns: int | None
    reference_end_ns: int | None
    method: str
    summary: str
    fault_type: str | None = None
    rank: int | None = None
    operator: str | None = None
    step: int | None = None
    view: str | None = None
    explanation: str = ""
    anomalous_steps: int = 0
    model_name: str | None = None
    engine: str | None = None  # "vllm", "sglang"
    labels: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    def write(self, path: Path) -> Path:
        return write_text_atomic(path, json.dumps(self.to_json(), indent=2) + "\n")

    def one_line(self) -> str:
        if self.fault_type is None and self.rank is None:
            return f"{self.summary.splitlines()[0] if self.summary else 'no verdict'}"
        where = f"rank {self.rank}" if self.rank is not None else "no single rank"
        operator = f", {self.operator}" if self.operator else ""
        return f"{self.fault_type or 'unknown fault'} on {where}{operator} (step {self.step})"


def incident_findings(verdict: Verdict, capture_start_ns: int) -> list[Finding]:
    """The findings whose step lies in the incident capture (not in the reference)."""
    step_start_ns: dict[int, int] = {}
    for row in verdict.steps:  # a step ordinal is the same iteration on every rank
        step_start_ns[row.step] = min(row.start_ns, step_start_ns.get(row.step, row.start_ns))
    cutoff = capture_start_ns - CLOCK_SLACK_NS
    return [f for f in verdict.findings if step_start_ns.get(f.step, cutoff) >= cutoff]


def headline(findings: list[Finding]) -> Finding | None:
    """The worst step of the (rank, fault type) most findings agree on."""
    if not findings:
        return None
    votes = Counter((f.rank, f.fault_type) for f in findings)
    weight = {key: sum(f.score for f in findings if (f.rank, f.fault_type) == key) for key in votes}
    rank, fault_type = max(votes, key=lambda key: (votes[key], weight[key]))
    group = [f for f in findings if (f.rank, f.fault_type) == (rank, fault_type)]
    return max(group, key=lambda f: f.score)


def most_named_operator(findings: list[Finding], chosen: Finding) -> str | None:
    group = [f for f in findings if (f.rank, f.fault_type) == (chosen.rank, chosen.fault_type)]
    operators = Counter(f.operator for f in group if f.operator)
    return operators.most_common(1)[0][0] if operators else chosen.operator


def make_incident(
    verdict: Verdict,
    case_dir: Path,
    engine_url: str,
    broken: list[Check],
    capture_start_ns: int,
    capture_end_ns: int,
    reference: tuple[int, int] | None,
    labels: dict[str, str],
    engine: str | None,
) -> Incident:
    findings = incident_findings(verdict, capture_start_ns)
    chosen = headline(findings)
    incident = Incident(
        case_dir=str(case_dir),
        engine_url=engine_url,
        objectives_broken=[c.describe() for c in broken],
        observed={c.objective.text: c.observed for c in broken if c.observed is not None},
        capture_start_ns=capture_start_ns,
        capture_end_ns=capture_end_ns,
        reference_start_ns=reference[0] if reference else None,
        reference_end_ns=reference[1] if reference else None,
        method=verdict.method,
        summary=verdict.summary,
        anomalous_steps=len(findings),
        model_name=labels.get("model_name"),
        engine=engine,
        labels=labels,
    )
    if chosen is not None:
        incident.fault_type = chosen.fault_type
        incident.rank = chosen.rank
        incident.operator = most_named_operator(findings, chosen)
        incident.step = chosen.step
        incident.view = chosen.view
        incident.explanation = chosen.explanation
    return incident
