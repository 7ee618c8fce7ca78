"""Small simulated cases for the root-cause model tests: built once per session, then removed."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest

from teller.lab.sim import FaultSpec, SimConfig, Topology, simulate

_ROOT = Path(tempfile.mkdtemp(prefix="teller-rca-tests-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)
_BUILT: dict[str, Path] = {}


def small_case(
    fault: str, rank: int = 1, seed: int = 3, gpus: int = 2, python_frames: bool = False
) -> Path:
    """A one-node, one-layer, 30-step case on `gpus` GPUs (tensor-parallel across all) with
    `fault` on `rank` in steps 10..19 (a few seconds); `python_frames` records module scopes."""
    name = f"{fault}-r{rank}-s{seed}-g{gpus}{'-py' if python_frames else ''}"
    if name not in _BUILT:
        config = SimConfig(
            topology=Topology(1, gpus, gpus, 1),
            steps=30,
            layers=1,
            python_frames=python_frames,
            fault=FaultSpec(fault, rank=rank, intensity=1.0, window=(10, 20)),
            seed=seed,
        )
        simulate(config, _ROOT / name)
        _BUILT[name] = _ROOT / name
    return _BUILT[name]


@pytest.fixture(scope="session")
def two_cases() -> list[Path]:
    return [small_case("straggler"), small_case("gpu_throttle")]
