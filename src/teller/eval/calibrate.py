"""Choose a trained model's step threshold on labelled cases it never trained on.

The step head is trained with anomalous steps weighed up, and an ensemble averages its members'
outputs, so the even-chance rule (`teller.rca.infer.threshold`) is a guess, not a calibrated
cut: it can miss many labelled steps while raising no false alarm, or the reverse. Here
every threshold of a grid is scored with the scoreboard's own harness (joint F1 per view, false
alarms on fault-free cases), and the threshold with the best mean of the two views' joint F1 is
kept among those whose false-alarm rate stays under `FALSE_ALARM_CAP`; ties go to the higher
threshold (fewer flags). The choice is written into the checkpoint's config.json under
`calibration`, with the cases and figures it came from, so `LoadedModel.load` uses it and a
reader can see where it came from. The model's forward pass runs once per case for the whole
grid (`SharedForward`).

The calibration cases must be neither trained on nor scored: a threshold chosen on the board's
own cases would flatter the board.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from teller.atomic import write_text_atomic
from teller.errors import TellerError
from teller.eval.cases import Case, Split
from teller.eval.harness import EvalResult, Row, evaluate
from teller.eval.model_method import RootCauseMethod, SharedForward
from teller.rca.infer import DEFAULT_MODEL

#: Thresholds tried, from permissive to strict.
GRID = tuple(round(0.05 * k, 2) for k in range(4, 18))
#: Highest false-alarm rate (flagged steps of fault-free cases) a chosen threshold may have.
FALSE_ALARM_CAP = 0.02
VIEWS = ("horizontal", "vertical")


@dataclass(frozen=True)
class ThresholdScore:
    """The scoreboard's figures for one threshold over the calibration cases."""

    threshold: float
    joint_f1: dict[str, float]  # view → joint F1 (views with labelled steps only)
    step_recall: dict[str, float]
    false_alarm_rate: float

    @property
    def mean_joint_f1(self) -> float:
        return sum(self.joint_f1.values()) / len(self.joint_f1) if self.joint_f1 else 0.0


@dataclass(frozen=True)
class Calibration:
    step_threshold: float
    cases: list[str]  # the calibration cases' ids
    scores: list[ThresholdScore]  # every threshold tried, in grid order

    def to_json(self) -> dict:
        return {
            "step_threshold": self.step_threshold,
            "rule": f"best mean joint F1 over the views, false alarms <= {FALSE_ALARM_CAP}",
            "cases": self.cases,
            "scores": [asdict(s) for s in self.scores],
        }


def _label(threshold: float) -> str:
    return f"T={threshold:.2f}"


def score_thresholds(
    cases: list[Case],
    model_dir: str | Path | None = None,
    grid: Sequence[float] = GRID,
    progress: bool = True,
) -> list[ThresholdScore]:
    """Every threshold of `grid` scored on `cases` (each case read, and the model run on it,
    once for all of them)."""
    shared = SharedForward()
    methods = {
        _label(t): (lambda t=t: RootCauseMethod(model_dir, threshold=t, shared=shared))
        for t in grid
    }
    result: EvalResult = evaluate(
        methods, cases, Split(train=[], test=[c.case_id for c in cases]), progress=progress
    )
    rows: dict[tuple[str, str], Row] = {(r.method, r.group): r for r in result.rows}
    scores = []
    for t in grid:
        joint, recall = {}, {}
        for view in VIEWS:
            row = rows.get((_label(t), view))
            if row is not None and row.joint_f1 is not None and row.step_recall is not None:
                joint[view], recall[view] = row.joint_f1, row.step_recall
        overall = rows[(_label(t), "overall")]
        scores.append(ThresholdScore(t, joint, recall, overall.false_alarm_rate or 0.0))
    return scores


def choose(scores: Sequence[ThresholdScore]) -> ThresholdScore:
    """The best mean joint F1 among thresholds under the false-alarm cap (the strictest
    threshold when none is under it); ties go to the higher threshold."""
    allowed = [s for s in scores if s.false_alarm_rate <= FALSE_ALARM_CAP]
    if not allowed:
        return max(scores, key=lambda s: s.threshold)
    return max(allowed, key=lambda s: (round(s.mean_joint_f1, 4), s.threshold))


def calibrate(
    cases: list[Case],
    model_dir: str | Path | None = None,
    grid: Sequence[float] = GRID,
    progress: bool = True,
) -> Calibration:
    if not any(c.labels.is_fault for c in cases):
        raise TellerError("calibration needs labelled fault cases; these hold none")
    scores = score_thresholds(cases, model_dir, grid, progress)
    return Calibration(choose(scores).threshold, [c.case_id for c in cases], scores)


def write_calibration(model_dir: str | Path | None, calibration: Calibration) -> Path:
    """Store the calibration in the checkpoint's config.json (atomically)."""
    path = Path(model_dir if model_dir is not None else DEFAULT_MODEL) / "config.json"
    meta = json.loads(path.read_text())
    meta["calibration"] = calibration.to_json()
    return write_text_atomic(path, json.dumps(meta, indent=2) + "\n")
