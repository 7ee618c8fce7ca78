"""What a localization method returns: scored steps and, per flagged step, ranked candidates.

Every method the scoreboard compares (the numeric localizer, the baselines, the root-cause model)
returns a `Localization`, so they are scored alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OperatorCandidate:
    iteration: int
    rank: int
    operator: str
    score: float  # excess ns attributed to this (rank, operator) in the step
    observed_ns: int
    normal_ns: int
    z: float
    node: int  # the largest contributing node
    reference: str
    kind: str  # "compute", "idle", "shift", "arrival", "transfer" or "wait" ("forward": teller.rca.dataset)


@dataclass
class StepScore:
    iteration: int
    kind: str
    dur_ns: int  # slowest rank's duration
    expected_ns: int
    z: float
    anomalous: bool
    ranks: list[int] = field(default_factory=list)


@dataclass
class StepExplanation:
    """A method's words about one flagged step, with the node they are grounded on, so the
    scoreboard can check the words against the pick (faithfulness) and the pick against the labels.
    """

    fault: str  # predicted fault type
    text: str
    operator: str | None  # the operator the method picked (None: no single node)
    rank: int | None


@dataclass
class Localization:
    steps: list[StepScore]
    candidates: dict[int, list[OperatorCandidate]]  # iteration → ranked candidates
    # iteration → explanation, for methods that explain their flagged steps (the root-cause model)
    explanations: dict[int, StepExplanation] = field(default_factory=dict)
    # iteration → excess ns of its largest persistent operator shift (`teller.localize.shifts`)
    shifted: dict[int, float] = field(default_factory=dict)

    def anomalous_steps(self) -> list[StepScore]:
        return [s for s in self.steps if s.anomalous]
