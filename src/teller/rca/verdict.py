"""The verdict: what teller concludes about a run, in one versioned structure.

Every front end (terminal, JSON, HTML, annotated Perfetto trace, `teller diff`) renders this one
object, and the JSON schema (docs/json-schema.md) documents it field by field. Whatever produced it
(the root-cause model with the localizer's numbers as evidence, or the numeric localizer alone) fills
the same fields and says which in `method`; the model's probabilities are null under the localizer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property

SCHEMA_VERSION = "teller.verdict/1"


@dataclass
class Evidence:
    """One number that supports a finding: the observed value against what was normal."""

    what: str  # e.g. "self time of aten::mm on rank 1"
    observed_ns: int
    normal_ns: int
    z: float  # robust z-score (median/MAD) of the observation against its reference group
    reference: str  # what "normal" was computed from, e.g. "same op on peer ranks, same step"


@dataclass
class LogLine:
    ts_ns: int
    rank: int | None
    level: str
    text: str  # the raw line, as the engine wrote it (escaped by every renderer)


@dataclass
class Finding:
    """One slow step and its explanation: which operator on which rank, and why."""

    step: int  # rank-local step ordinal (the same iteration on every TP rank)
    step_name: str
    step_kind: str
    step_dur_ns: int
    step_expected_ns: int
    score: float  # how anomalous the step is (higher = more)
    rank: int | None  # guilty rank (None when the cause is not rank-specific)
    operator: str | None  # guilty call-chain node name
    operator_node: int | None  # node index in the run's CallTree
    fault_type: str | None  # best guess from the taxonomy (DESIGN.md §4), None if unknown
    view: str  # "V" (one rank's stack) or "H" (across ranks)
    explanation: str
    # the model's probability that the step is anomalous; None when the localizer decided
    probability: float | None = None
    #: the other ranks the trace cannot tell from `rank` as the guilty one: a slow link's other
    #: end, or the peers whose collectives took as long (every member of a collective waits for
    #: its slowest link). Empty where `rank` stands out.
    alike_ranks: list[int] = field(default_factory=list)
    # ranked: operator, rank, score, node, kind, probability (the model pointer's; None without)
    candidates: list[dict] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    log_lines: list[LogLine] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # request ids batched in this step


@dataclass
class StepRow:
    """Every step of every rank, for timelines: duration against its expected duration."""

    rank: int
    step: int
    name: str
    kind: str
    start_ns: int
    dur_ns: int
    expected_ns: int
    score: float
    anomalous: bool


@dataclass
class Verdict:
    """The whole answer for one run."""

    inputs: list[str]
    ranks: list[int]
    method: str  # "model:<name>" (the default) or "localizer"
    summary: str  # the few lines a person reads first
    findings: list[Finding]
    steps: list[StepRow]
    missing: list[str] = field(default_factory=list)  # inputs absent and what that costs
    warnings: list[str] = field(default_factory=list)
    schema: str = SCHEMA_VERSION

    def to_json(self) -> dict:
        return asdict(self)

    def on_its_rank(self, finding: Finding) -> tuple[int, int]:
        """The finding's step duration and expected duration on the rank it names. Why: a
        finding's own `step_dur_ns` is the step's slowest rank's, and where a peer waited for
        the guilty rank that is the peer's, not the duration the explanation states. A finding
        that names no rank keeps the slowest rank's."""
        row = (
            self._step_rows.get((finding.rank, finding.step)) if finding.rank is not None else None
        )
        if row is None:
            return finding.step_dur_ns, finding.step_expected_ns
        return row.dur_ns, row.expected_ns

    @cached_property
    def _step_rows(self) -> dict[tuple[int, int], StepRow]:
        return {(row.rank, row.step): row for row in self.steps}
