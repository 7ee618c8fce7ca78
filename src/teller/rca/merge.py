"""One verdict from the verdicts of a run's engines, each analysed on its own
(`teller.callchain.split`).

An engine's steps are compared only with its own ranks' in the whole run's analysis too, so the
findings of the engines together are the run's findings: they are ordered into incidents again
over the whole run, and the summary is written over all of them. What each engine's analysis
said about its own inputs is kept, named by engine where it is that engine's alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from teller.callchain.breakdown import IdleGaps, RunBreakdown
from teller.rca.diagnose import (
    MODEL_UNAVAILABLE,
    RunInputs,
    by_incident,
    missing_inputs,
    nothing_found,
    summary_of,
)
from teller.rca.verdict import Verdict


@dataclass
class EngineOutcome:
    """What one engine's analysis leaves behind once its tree is let go."""

    verdict: Verdict  # its findings' nodes already numbered as the run's tree would number them
    breakdown: RunBreakdown
    steps_scored: int  # iterations the localizer scored (the summary's "of N steps")
    engine: int  # its position among the run's engines


def merged_verdict(outcomes: list[EngineOutcome], inputs: RunInputs, notes: list[str]) -> Verdict:
    """The run's verdict from its engines': `notes` (the split's own, first) and then each
    engine's warnings (`_engine_warnings`)."""
    findings = by_incident([f for o in outcomes for f in o.verdict.findings])
    steps = sorted(
        (row for o in outcomes for row in o.verdict.steps), key=lambda row: (row.rank, row.start_ns)
    )
    total = sum(o.steps_scored for o in outcomes)
    warnings = list(dict.fromkeys([*notes, *_engine_warnings(outcomes)]))
    return Verdict(
        inputs=[str(p) for p in inputs.trace_files],
        ranks=inputs.ranks,
        method=outcomes[0].verdict.method,
        summary=summary_of(
            findings,
            total,
            lambda: nothing_found((r.rank for r in steps), {r.kind for r in steps}, total),
        ),
        findings=findings,
        steps=steps,
        missing=missing_inputs(inputs),
        warnings=warnings,
    )


def _engine_warnings(outcomes: list[EngineOutcome]) -> list[str]:
    """Each engine's warnings, named by engine ("engine 1: 8 requests were never admitted…"),
    or once as "each engine: …" where every engine gave the same one: a count in it is then each
    engine's, not the run's. The model that could not load is said once, as it was."""
    everyone = set.intersection(*(set(o.verdict.warnings) for o in outcomes))
    out = []
    for outcome in outcomes:
        for warning in outcome.verdict.warnings:
            if warning.startswith(MODEL_UNAVAILABLE):
                out.append(warning)
            elif warning in everyone:
                out.append(f"each engine: {warning}")
            else:
                out.append(f"engine {outcome.engine}: {warning}")
    return out


def merged_breakdown(breakdowns: list[RunBreakdown]) -> RunBreakdown:
    """Where the time went on every rank of the run, from each engine's."""
    gaps = [b.gaps for b in breakdowns]
    by_rank = np.argsort(np.concatenate([g.rank for g in gaps]), kind="stable")

    def joined(column: str) -> np.ndarray:
        return np.concatenate([getattr(g, column) for g in gaps])[by_rank]

    def listed(column: str) -> list:
        values = [v for g in gaps for v in getattr(g, column)]
        return [values[i] for i in by_rank.tolist()]

    return RunBreakdown(
        runs=sorted((r for b in breakdowns for r in b.runs), key=lambda r: r.rank),
        steps=sorted((s for b in breakdowns for s in b.steps), key=lambda s: (s.rank, s.step)),
        gaps=IdleGaps(
            rank=joined("rank"),
            step=joined("step"),
            start_ns=joined("start_ns"),
            dur_ns=joined("dur_ns"),
            cause=listed("cause"),
            host_call=listed("host_call"),
            cpu_operator=listed("cpu_operator"),
        ),
        ranks_without_gpu=sorted({r for b in breakdowns for r in b.ranks_without_gpu}),
    )
