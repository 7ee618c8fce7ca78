"""One verdict from the verdicts of a run's engines, each analysed on its own
(`teller.callchain.split`).

An engine's steps are compared only with its own ranks' in the whole run's analysis too, so the
findings of the engines together are the run's findings: they are ordered into incidents again
over the whole run, and the summary is written over all of them. What each engine's analysis
said about its own inputs is kept, named by engine where it is that engine's alone.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields, replace

import numpy as np

from teller.callchain.breakdown import (
    GAPS_IN_RUN,
    TOP_IN_RUN,
    GpuBusy,
    IdleGaps,
    IdleTime,
    RunBreakdown,
    StepBreakdown,
)
from teller.rca.diagnose import (
    MODEL_UNAVAILABLE,
    RunInputs,
    by_incident,
    missing_inputs,
    nothing_found,
    summary_of,
)
from teller.rca.verdict import Verdict


class SpilledRows:
    """Rows kept in a temporary file as JSON lines and read back one at a time when iterated.

    Why: the breakdown of a long run has a row per rank and step, a few kB each (about 0.5 GB
    at 64 ranks × 2,000 steps). Each engine's rows are written here as its analysis ends, and
    the JSON verdict reads them back as it writes them (`teller.report.render_pieces`)."""

    def __init__(self) -> None:
        # open as long as the rows are: closing it deletes it
        self._file = tempfile.NamedTemporaryFile(prefix="teller-rows-", suffix=".jsonl")  # noqa: SIM115
        self._count = 0

    def add(self, rows: Iterable[dict]) -> None:
        for row in rows:
            self._file.write(json.dumps(row).encode() + b"\n")
            self._count += 1
        self._file.flush()

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[dict]:
        with open(self._file.name, "rb") as lines:
            for line in lines:
                yield json.loads(line)


def kept_rows(breakdown: RunBreakdown, steps: set[int], rows: SpilledRows) -> RunBreakdown:
    """An engine's breakdown with every step row written to `rows` and only those the
    renderers read kept: the rows of `steps` (its findings') and its most idle step's."""
    rows.add(b.to_json() for b in breakdown.steps)
    kept = [b for b in breakdown.steps if b.step in steps]
    if breakdown.steps:
        idlest = max(breakdown.steps, key=lambda b: b.idle_share)
        kept = sorted({id(b): b for b in [*kept, idlest]}.values(), key=lambda b: (b.rank, b.step))
    return replace(breakdown, steps=kept)


@dataclass
class EngineOutcome:
    """What one engine's analysis leaves behind once its tree is let go."""

    verdict: Verdict  # its findings' nodes already numbered as the run's tree would number them
    breakdown: RunBreakdown
    steps_scored: int  # iterations the localizer scored (the summary's "of N steps")
    engine: int  # its position among the run's engines


def merged_verdict(
    outcomes: list[EngineOutcome], inputs: RunInputs, notes: list[str], part: str = "engine"
) -> Verdict:
    """The run's verdict from its engines' (or its time windows', `part` "window"): `notes`
    (the split's own, first) and then each part's warnings (`_engine_warnings`)."""
    findings = by_incident([f for o in outcomes for f in o.verdict.findings])
    steps = sorted(
        (row for o in outcomes for row in o.verdict.steps), key=lambda row: (row.rank, row.start_ns)
    )
    total = sum(o.steps_scored for o in outcomes)
    warnings = list(dict.fromkeys([*notes, *_engine_warnings(outcomes, part)]))
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


def _engine_warnings(outcomes: list[EngineOutcome], part: str = "engine") -> list[str]:
    """Each engine's warnings, named by engine ("engine 1: 8 requests were never admitted…"),
    or once as "each engine: …" where every engine gave the same one: a count in it is then each
    engine's, not the run's. The model that could not load is said once, as it was. Time
    windows (`part` "window") read the same files and logs, so one that every window gave is
    the run's, said once as it was."""
    everyone = set.intersection(*(set(o.verdict.warnings) for o in outcomes))
    if part == "window":
        return _window_warnings(outcomes, everyone)
    out = []
    for outcome in outcomes:
        for warning in outcome.verdict.warnings:
            if warning.startswith(MODEL_UNAVAILABLE):
                out.append(warning)
            elif warning in everyone:
                out.append(warning if part == "window" else f"each {part}: {warning}")
            else:
                out.append(f"{part} {outcome.engine}: {warning}")
    return out


#: A warning that starts with a count ("196 GPU activities have no launching runtime call …").
_COUNTED = re.compile(r"(\d+) (.*)", re.DOTALL)


def _window_warnings(outcomes: list[EngineOutcome], everyone: set[str]) -> list[str]:
    """Time windows' warnings: one every window gave, as it was; one that some windows gave
    with their own count ("window 2: 196 GPU activities …" from the activities at a window's
    edge) said once, summed, naming the windows ("windows 2, 6 and 13: 357 GPU activities …")."""
    out: list[str] = []
    counted: dict[str, tuple[int, list[int]]] = {}
    for outcome in outcomes:
        for warning in outcome.verdict.warnings:
            found = _COUNTED.fullmatch(warning)
            if warning.startswith(MODEL_UNAVAILABLE) or warning in everyone:
                out.append(warning)
            elif found is None:
                out.append(f"window {outcome.engine}: {warning}")
            else:
                total, windows = counted.get(found[2], (0, []))
                counted[found[2]] = (total + int(found[1]), [*windows, outcome.engine])
    for rest, (total, windows) in counted.items():
        named = [str(w) for w in windows]
        which = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
        out.append(f"window{'s' if len(named) > 1 else ''} {which}: {total} {rest}")
    return out


def merged_breakdown(breakdowns: list[RunBreakdown], rows: SpilledRows) -> RunBreakdown:
    """Where the time went on every rank of the run, from each engine's (`kept_rows`), with
    every step row in `rows`."""
    return RunBreakdown(
        runs=sorted((r for b in breakdowns for r in b.runs), key=lambda r: r.rank),
        steps=sorted((s for b in breakdowns for s in b.steps), key=lambda s: (s.rank, s.step)),
        gaps=joined_gaps([b.gaps for b in breakdowns]),
        ranks_without_gpu=sorted({r for b in breakdowns for r in b.ranks_without_gpu}),
        rows=rows,
    )


def joined_gaps(gaps: list[IdleGaps]) -> IdleGaps:
    """Several parts' idle gaps as one table, by rank (each part's order kept within a rank)."""
    by_rank = np.argsort(np.concatenate([g.rank for g in gaps]), kind="stable")

    def joined(column: str) -> np.ndarray:
        return np.concatenate([getattr(g, column) for g in gaps])[by_rank]

    def listed(column: str) -> list:
        values = [v for g in gaps for v in getattr(g, column)]
        return [values[i] for i in by_rank.tolist()]

    return IdleGaps(
        rank=joined("rank"),
        step=joined("step"),
        start_ns=joined("start_ns"),
        dur_ns=joined("dur_ns"),
        cause=listed("cause"),
        host_call=listed("host_call"),
        cpu_operator=listed("cpu_operator"),
    )


class WindowBreakdowns:
    """What a windowed run keeps of each window's breakdown as the windows go: every owned
    step row goes to disk (`SpilledRows`, by the caller); the rows of finding steps and the most
    idle one stay, with each rank's run summed so far and the owned idle gaps."""

    def __init__(self) -> None:
        self.runs: list[StepBreakdown] = []
        self.kept: list[StepBreakdown] = []
        self.idlest: StepBreakdown | None = None
        self.gaps: list[IdleGaps] = []
        self.without_gpu: set[int] = set()

    def add(
        self, owned: list[StepBreakdown], steps: set[int], gaps: IdleGaps, without_gpu: list[int]
    ) -> None:
        self.runs = summed_runs([*self.runs, *owned])
        self.kept.extend(b for b in owned if b.step in steps)
        for b in owned:
            if self.idlest is None or b.idle_share > self.idlest.idle_share:
                self.idlest = b
        self.gaps.append(gaps)
        self.without_gpu.update(without_gpu)

    def merged(self, rows: SpilledRows) -> RunBreakdown:
        kept = [*self.kept, *([self.idlest] if self.idlest is not None else [])]
        return RunBreakdown(
            runs=self.runs,
            steps=sorted({id(b): b for b in kept}.values(), key=lambda b: (b.rank, b.step)),
            gaps=joined_gaps(self.gaps),
            ranks_without_gpu=sorted(self.without_gpu),
            rows=rows,
        )


def summed_runs(rows: Iterable[StepBreakdown]) -> list[StepBreakdown]:
    """Each rank's whole-run breakdown as the sum of its step rows `rows`: a run analysed in time
    windows has no whole tree to measure, and its windows overlap, so only the steps each owns
    add up to the run without counting a margin twice. Time outside every step is not in it, and
    the top kernels, operators and idle contributors are summed from each step's own top lists."""
    by_rank: dict[int, list[StepBreakdown]] = {}
    for row in rows:
        by_rank.setdefault(row.rank, []).append(row)
    return [_summed(rank, by_rank[rank]) for rank in sorted(by_rank)]


def _summed(rank: int, rows: list[StepBreakdown]) -> StepBreakdown:
    def total(parts: list, kind: type) -> object:
        return kind(**{f.name: sum(getattr(p, f.name) for p in parts) for f in fields(kind)})

    def top(items: Iterable, key: Callable, size_of: str, limit: int) -> list:
        merged: dict = {}
        for item in items:
            k = key(item)
            if k in merged:
                before = merged[k]
                merged[k] = replace(
                    before,
                    **{
                        f.name: getattr(before, f.name) + getattr(item, f.name)
                        for f in fields(before)
                        if f.type in ("int", int)
                    },
                )
            else:
                merged[k] = item
        return sorted(merged.values(), key=lambda i: -getattr(i, size_of))[:limit]

    return StepBreakdown(
        rank=rank,
        step=None,
        start_ns=min(r.start_ns for r in rows),
        span_ns=sum(r.span_ns for r in rows),
        busy=total([r.busy for r in rows], GpuBusy),  # type: ignore[arg-type]
        idle=total([r.idle for r in rows], IdleTime),  # type: ignore[arg-type]
        idle_contributors=top(
            (c for r in rows for c in r.idle_contributors),
            lambda c: (c.cause, c.host_call, c.cpu_operator),
            "idle_ns",
            TOP_IN_RUN,
        ),
        longest_gaps=sorted((g for r in rows for g in r.longest_gaps), key=lambda g: -g.dur_ns)[
            :GAPS_IN_RUN
        ],
        top_kernels=top(
            (k for r in rows for k in r.top_kernels),
            lambda k: (k.name, k.kind),
            "gpu_ns",
            TOP_IN_RUN,
        ),
        top_operators=top(
            (o for r in rows for o in r.top_operators),
            lambda o: (o.name, o.layer),
            "gpu_ns",
            TOP_IN_RUN,
        ),
    )
