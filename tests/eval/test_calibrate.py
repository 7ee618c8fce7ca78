"""Choosing the model's step threshold on held-aside cases: the rule, the harness figures it
reads, and the checkpoint that carries the choice."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from teller.cli import main
from teller.errors import TraceError
from teller.eval.calibrate import (
    FALSE_ALARM_CAP,
    ThresholdScore,
    calibrate,
    choose,
    score_thresholds,
)
from teller.eval.cases import Split, find_cases
from teller.eval.harness import evaluate
from teller.eval.model_method import RootCauseMethod
from teller.lab.sim import FaultSpec, SimConfig, Topology, simulate
from teller.rca.infer import DEFAULT_MODEL, LoadedModel, threshold


def _score(t: float, h: float, v: float, alarms: float = 0.0) -> ThresholdScore:
    return ThresholdScore(t, {"horizontal": h, "vertical": v}, {}, alarms)


def test_the_best_mean_joint_f1_under_the_false_alarm_cap_is_chosen() -> None:
    scores = [
        _score(0.2, 0.99, 0.99, alarms=FALSE_ALARM_CAP * 3),  # finds all, alarms too often
        _score(0.4, 0.90, 0.94),
        _score(0.6, 0.95, 0.89),  # the same mean as 0.4: the stricter one wins the tie
        _score(0.8, 0.85, 0.80),
    ]
    assert choose(scores).threshold == 0.6
    noisy = [_score(t, 0.9, 0.9, alarms=0.5) for t in (0.3, 0.5)]
    assert choose(noisy).threshold == 0.5  # none under the cap: the strictest


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("calibration")
    for name, fault in (("straggler", "straggler"), ("quiet", "none")):
        simulate(
            SimConfig(
                topology=Topology(1, 2, 2, 1),
                steps=30,
                layers=1,
                fault=FaultSpec(fault, rank=1, intensity=1.0, window=(10, 20)),
                seed=5,
            ),
            root / name,
        )
    return root


def _shipped_copy(tmp_path: Path, calibration: object) -> Path:
    """The shipped checkpoint copied under `tmp_path` with `calibration` in its config.json
    (None: none)."""
    model = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL, model)
    meta = json.loads((model / "config.json").read_text())
    meta.pop("calibration", None)
    if calibration is not None:
        meta["calibration"] = calibration
    (model / "config.json").write_text(json.dumps(meta))
    return model


def test_calibration_scores_the_grid_and_the_checkpoint_carries_the_choice(
    cases: Path, tmp_path: Path
) -> None:
    model = _shipped_copy(tmp_path, None)
    plain = LoadedModel.load(model)
    assert plain.threshold == threshold(plain.model.config)

    grid = (0.3, 0.6, 0.9)
    calibration = calibrate(find_cases([cases]), model, grid=grid, progress=False)
    assert [s.threshold for s in calibration.scores] == list(grid)
    assert calibration.step_threshold in grid
    assert sorted(calibration.cases) == ["quiet", "straggler"]
    recall = [s.step_recall["horizontal"] for s in calibration.scores]
    assert recall == sorted(recall, reverse=True)  # a lower threshold flags at least as much

    assert main(["-q", "calibrate", "--cases", str(cases), "--model", str(model)]) == 0
    written = json.loads((model / "config.json").read_text())["calibration"]
    assert 0 < written["step_threshold"] < 1 and written["cases"] == ["quiet", "straggler"]
    assert LoadedModel.load(model).threshold == written["step_threshold"]


@pytest.mark.parametrize("bad", [0, 1.5, "0.5", True, None])
def test_a_checkpoint_with_an_unusable_threshold_is_refused_naming_its_config(
    tmp_path: Path, bad: object
) -> None:
    model = _shipped_copy(tmp_path, {"step_threshold": bad})
    with pytest.raises(TraceError, match=r"config\.json.*step_threshold"):
        LoadedModel.load(model)


def test_one_forward_pass_for_the_grid_scores_each_threshold_as_a_run_of_its_own(
    cases: Path, tmp_path: Path
) -> None:
    """The grid shares each case's forward pass (`SharedForward`); a threshold scored that way
    has the figures it has when scored alone."""
    found = find_cases([cases])
    shared = score_thresholds(found, grid=(0.3, 0.6), progress=False)
    for score in shared:
        alone = evaluate(
            {"alone": lambda t=score.threshold: RootCauseMethod(threshold=t)},
            found,
            Split(train=[], test=[c.case_id for c in found]),
            progress=False,
        )
        rows = {r.group: r for r in alone.rows}
        assert score.joint_f1["horizontal"] == rows["horizontal"].joint_f1
        assert score.step_recall["horizontal"] == rows["horizontal"].step_recall
        assert score.false_alarm_rate == (rows["overall"].false_alarm_rate or 0.0)
