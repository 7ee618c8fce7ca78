"""`teller diagnose` with the shipped default model on simulated cases it never saw."""

from __future__ import annotations

import pytest

from teller.cli import main
from teller.lab.labels import CaseLabels
from teller.rca.infer import DEFAULT_MODEL, diagnose_path

from .conftest import small_case

pytestmark = pytest.mark.skipif(
    not (DEFAULT_MODEL / "model.safetensors").is_file(), reason="no shipped default model"
)


@pytest.mark.parametrize("fault", ["straggler", "gpu_throttle"])
def test_default_model_names_the_labelled_rank_and_operator(fault):
    case = small_case(fault, rank=1, seed=11)
    labels = CaseLabels.read(case)
    diagnoses = diagnose_path(case)
    flagged = [d for d in diagnoses if d.anomalous]
    assert flagged and {d.iteration for d in flagged} & set(labels.steps)
    top = max(flagged, key=lambda d: d.probability)
    assert top.facts is not None
    assert (top.facts.operator, top.facts.rank) == (labels.guilty_operator, labels.guilty_rank)
    assert labels.guilty_operator in top.explanation  # the fault type may differ: see the README


def test_diagnose_command_prints_the_verdict(capsys):
    case = small_case("straggler", rank=1, seed=11)
    assert main(["-q", "diagnose", str(case)]) == 0
    out = capsys.readouterr().out
    assert "anomalous step" in out and "rank 1" in out


def test_diagnose_command_rejects_a_directory_without_traces(tmp_path, capsys):
    assert main(["-q", "diagnose", str(tmp_path)]) != 0
    assert str(tmp_path) in capsys.readouterr().err
