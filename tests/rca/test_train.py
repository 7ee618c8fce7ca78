"""Training: a tiny model fits two small cases in seconds, deterministically, and round-trips."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from teller.errors import TraceError
from teller.rca.dataset import read_case_records
from teller.rca.infer import LoadedModel
from teller.rca.model import ModelConfig
from teller.rca.train import TrainConfig, train


def tiny(cases: list[Path], out: Path, cache: Path, seed: int = 0) -> TrainConfig:
    return TrainConfig(
        data=[str(c) for c in cases],
        out=str(out),
        model=ModelConfig(d_model=32, n_layers=1, n_heads=2),
        tpe_vocab=128,
        epochs=12,
        batch_size=16,
        seed=seed,
        cache_dir=str(cache),
        progress=False,
    )


@pytest.fixture(scope="module")
def trained(two_cases, tmp_path_factory):
    root = tmp_path_factory.mktemp("rca-train")
    first = train(tiny(two_cases, root / "a", root / "cache"))
    second = train(tiny(two_cases, root / "b", root / "cache"))
    return first, second, root


def test_loss_goes_down(trained):
    first, _, _ = trained
    assert first.examples == 60 and first.anomalous == 20
    assert first.losses[-1] < 0.5 * first.losses[0]


def test_same_seed_same_weights_other_seed_other_weights(trained, two_cases):
    _, _, root = trained
    a = load_file(root / "a" / "model.safetensors")
    b = load_file(root / "b" / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = train(tiny(two_cases, root / "c", root / "cache", seed=1))
    c = load_file(other.out / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_checkpoint_round_trip_gives_the_same_diagnosis(trained, two_cases):
    _, _, root = trained
    loaded = LoadedModel.load(root / "a")
    again = LoadedModel.load(root / "a")
    assert not loaded.model.training
    weights = load_file(root / "a" / "model.safetensors")
    state = loaded.model.state_dict()
    assert all(torch.equal(state[k], weights[k]) for k in weights)
    records = read_case_records(two_cases[0])
    one = loaded.diagnose_records(records)
    two = again.diagnose_records(records)
    assert [d.probability for d in one] == [d.probability for d in two]
    assert [d.explanation for d in one] == [d.explanation for d in two]


def test_a_directory_without_a_model_is_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="not a model directory"):
        LoadedModel.load(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(TraceError, match="not valid JSON"):
        LoadedModel.load(tmp_path)


def test_explanations_name_only_the_pointed_operator_and_rank(trained, two_cases):
    _, _, root = trained
    model = LoadedModel.load(root / "a")
    checked = 0
    for case in two_cases:
        for d in model.diagnose_records(read_case_records(case)):
            if d.facts is None:
                assert "rank" not in d.explanation.lower()
                continue
            others = {c.operator for c, _ in d.candidates} - {d.facts.operator}
            assert not any(op in d.explanation for op in others)
            assert set(re.findall(r"(?:rank|GPU) (\d+)", d.explanation)) <= {str(d.facts.rank)}
            checked += 1
    assert checked > 0
