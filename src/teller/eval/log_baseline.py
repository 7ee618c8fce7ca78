"""Log-only baseline: what the service logs alone say about which steps went wrong.

It is the log-side row of the scoreboard (DESIGN.md §5): an operator who greps the engine's logs
instead of opening the profiler. It sees each case's log lines already placed on the steps they
describe (`teller.align`, shared by the harness as `CaseLogs`) and two kinds of evidence per step:

* **New templates.** A template never printed in the normal cases' logs: a preemption warning, an
  NCCL watchdog timeout, a traceback. Only lines that say something count (a WARNING or worse, or
  an event the readers recognise): templates mined from unparsed lines differ from run to run in
  how their numbers were cut, so a new one of those is noise, not news.
* **Count bursts.** A template printed far more often in the step than usual: the robust z of its
  count against its per-step counts in normal steps (median, MAD), with a Poisson floor on the
  scale (√mean, at least one line) so a rare template needs several extra lines, not one. The
  first step of a run is left out of both sides: it admits the whole queue that built up before
  tracing began, so every request line bursts there by construction.

A step without aligned lines is never anomalous, and a case without logs gets no flag. The suspect
is whatever a triggering line points at: an NCCL line aligned to a collective names that operator
and rank; a line tagged with a rank names the rank (its operator with the most self time in the
step); otherwise, like the other baselines, the operator with the most self time on the step's
slowest rank.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from teller.callchain.facts import Iterations, RunFacts
from teller.callchain.tree import CallTree
from teller.eval.baselines import top_self_time_candidates
from teller.eval.cases import CaseLogs
from teller.localize import Localization, OperatorCandidate, StepScore, median_mad

#: Levels at which a line never seen in normal logs is evidence by itself.
TELLING_LEVELS = frozenset({"WARNING", "ERROR", "CRITICAL"})
#: Robust-scale floor for counts: Poisson noise, and at least one line.
MIN_COUNT_SCALE = 1.0


@dataclass
class TemplateRate:
    """A template's usual per-step count in normal steps."""

    median: float
    scale: float  # max(robust spread (`median_mad`), √mean, MIN_COUNT_SCALE)


@dataclass
class _Lines:
    """The columns of one case's aligned log lines that the baseline reads, one entry per line."""

    template: np.ndarray  # template id (stable hash of the template text)
    step: np.ndarray  # iteration the line was aligned to, -1 unmatched
    telling: np.ndarray  # says something by itself (level or recognised event)
    line_rank: np.ndarray  # rank printed in the line or named by its file, -1 unknown
    collective_node: np.ndarray  # collective instance it was aligned to, -1 none
    collective_rank: np.ndarray  # that instance's rank, -1 none

    @classmethod
    def of(cls, logs: CaseLogs | None) -> _Lines:
        if logs is None or logs.aligned is None or len(logs.aligned.logs) == 0:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, np.zeros(0, dtype=bool), empty, empty, empty)
        table, alignment = logs.aligned.logs.table, logs.aligned.alignment
        levels = table.column("level").to_pylist()
        events = table.column("event").to_pylist()
        by_collective = np.array([m == "collective" for m in alignment.method], dtype=bool)
        return cls(
            template=np.array(
                [t if t is not None else 0 for t in table.column("template_id").to_pylist()],
                dtype=np.int64,
            ),
            step=np.asarray(alignment.step, dtype=np.int64),
            telling=np.array(
                [
                    lv in TELLING_LEVELS or ev not in (None, "other")
                    for lv, ev in zip(levels, events, strict=True)
                ],
                dtype=bool,
            ),
            line_rank=table.column("rank").to_numpy(zero_copy_only=False).astype(np.int64),
            collective_node=np.where(by_collective, alignment.node, -1).astype(np.int64),
            collective_rank=np.where(by_collective, alignment.rank, -1).astype(np.int64),
        )

    def by_step(self) -> dict[int, np.ndarray]:
        """Iteration → indices of the lines aligned to it."""
        placed = np.flatnonzero(self.step >= 0)
        out: dict[int, list[int]] = {}
        for i in placed.tolist():
            out.setdefault(int(self.step[i]), []).append(i)
        return {s: np.array(rows, dtype=np.int64) for s, rows in out.items()}


def _counted_iterations(tree: CallTree) -> list[int]:
    """The iterations whose template counts are compared: all but the run's first."""
    return sorted(set(tree.steps.index.tolist()))[1:]


def _count_matrix(
    trees: Sequence[CallTree], lines: Sequence[_Lines]
) -> tuple[int, dict[int, np.ndarray]]:
    """Per template, its count in every counted step of the given cases (zeros included)."""
    columns: list[Counter[int]] = []
    for tree, case_lines in zip(trees, lines, strict=True):
        members = case_lines.by_step()
        for iteration in _counted_iterations(tree):
            rows = members.get(iteration, np.zeros(0, dtype=np.int64))
            columns.append(Counter(case_lines.template[rows].tolist()))
    templates = {t for column in columns for t in column}
    return len(columns), {
        t: np.array([column[t] for column in columns], dtype=float) for t in templates
    }


def template_rates(trees: Sequence[CallTree], lines: Sequence[_Lines]) -> dict[int, TemplateRate]:
    """Each template's usual per-step count (median) and its robust spread."""
    _, counts = _count_matrix(trees, lines)
    rates = {}
    for template, values in counts.items():
        median, spread = median_mad(values)
        scale = max(float(spread), float(np.sqrt(values.mean())), MIN_COUNT_SCALE)
        rates[template] = TemplateRate(float(median), scale)
    return rates


class LogOnlyBaseline:
    """New-template and count-burst anomalies in each step's aligned log lines."""

    uses_logs = True

    def __init__(self, count_z: float = 5.0, min_excess: int = 3) -> None:
        self.count_z = count_z
        self.min_excess = min_excess

    def fit(
        self, normal_trees: list[CallTree], normal_logs: Sequence[CaseLogs] = ()
    ) -> LogOnlyBaseline:
        lines = [_Lines.of(logs) for logs in normal_logs]
        self.known_templates_ = {t for case in lines for t in case.template.tolist()}
        with_logs = [
            (tree, case) for tree, case in zip(normal_trees, lines, strict=True) if len(case.step)
        ]
        self.rates_ = template_rates([t for t, _ in with_logs], [c for _, c in with_logs])
        return self

    def score(
        self, tree: CallTree, logs: CaseLogs | None = None, facts: RunFacts | None = None
    ) -> Localization:
        facts = RunFacts.of(tree, facts)
        lines = _Lines.of(logs)
        iterations = facts.iterations
        rates = getattr(self, "rates_", {}) or template_rates([tree], [lines])
        known = getattr(self, "known_templates_", set())
        counted = set(_counted_iterations(tree))
        members = lines.by_step()
        steps, candidates = [], {}
        expected = _median_by_kind(iterations)
        for i in range(len(iterations)):
            kind, dur = iterations.kind[i], iterations.dur_ns[i]
            iteration, ranks = int(iterations.iteration[i]), list(iterations.ranks[i])
            rows_here = members.get(iteration, np.zeros(0, dtype=np.int64))
            z, evidence = self._step_evidence(lines, rows_here, rates, known, iteration in counted)
            flagged = len(evidence) > 0
            steps.append(
                StepScore(iteration, str(kind), int(dur), int(expected[kind]), z, flagged, ranks)
            )
            if flagged:
                candidates[iteration] = suspects(tree, iteration, lines, evidence, facts)
        return Localization(steps=steps, candidates=candidates)

    def _step_evidence(
        self,
        lines: _Lines,
        rows: np.ndarray,
        rates: dict[int, TemplateRate],
        known: set[int],
        counted: bool,
    ) -> tuple[float, np.ndarray]:
        """The step's score and the lines that triggered it (none: not anomalous).

        A new template scores `count_z` plus its number of lines, so it outranks a bare burst."""
        if len(rows) == 0:
            return 0.0, rows
        score, evidence = 0.0, []
        templates = lines.template[rows]
        for template, count in Counter(templates.tolist()).items():
            mine = rows[templates == template]
            if known and template not in known:
                if lines.telling[mine].any():
                    score = max(score, self.count_z + count)
                    evidence.append(mine)
                continue
            rate = rates.get(template)
            if not counted or rate is None:
                continue
            z = (count - rate.median) / rate.scale
            score = max(score, z)
            if z >= self.count_z and count - rate.median >= self.min_excess:
                evidence.append(mine)
        found = np.concatenate(evidence) if evidence else np.zeros(0, dtype=np.int64)
        return float(score), found


def _median_by_kind(iterations: Iterations) -> dict[str, float]:
    """Median step time per step kind: the 'expected' the scoreboard shows next to a step."""
    kinds = iterations.kind
    return {
        kind: float(np.median(iterations.dur_ns[kinds == kind]))
        for kind in dict.fromkeys(kinds.tolist())
    }


def suspects(
    tree: CallTree,
    iteration: int,
    lines: _Lines,
    evidence: np.ndarray,
    facts: RunFacts | None = None,
) -> list[OperatorCandidate]:
    """What the triggering lines point at, then the step's top self-time operators."""
    pointed: list[OperatorCandidate] = []
    nodes = lines.collective_node[evidence]
    for node in sorted(set(nodes[nodes >= 0].tolist())):
        rank = int(lines.collective_rank[evidence][nodes == node][0])
        pointed.append(_collective_candidate(tree, iteration, node, rank))
    ranked = lines.line_rank[evidence]
    ranked = ranked[ranked >= 0]
    if not pointed and len(ranked):
        rank = Counter(ranked.tolist()).most_common(1)[0][0]
        pointed.extend(top_self_time_candidates(tree, iteration, rank=int(rank), facts=facts))
    seen = {(c.operator, c.rank) for c in pointed}
    fallback = [
        c
        for c in top_self_time_candidates(tree, iteration, facts=facts)
        if (c.operator, c.rank) not in seen
    ]
    return pointed + fallback


def _collective_candidate(
    tree: CallTree, iteration: int, node: int, rank: int
) -> OperatorCandidate:
    return OperatorCandidate(
        iteration=iteration,
        rank=rank,
        operator=tree.names[int(tree.name[node])],
        score=float(tree.dur[node]),
        observed_ns=int(tree.dur[node]),
        normal_ns=0,
        z=0.0,
        node=node,
        reference="collective named by an NCCL log line",
        kind="arrival",
    )
