"""Simulated cases the report tests share, each built once per session by `teller lab sim`.

Three runs of the same workload (same seed): a healthy baseline, a GEMM kernel swapped for a slower
one on rank 1, and host CPU contention on rank 1 (steps really slow down, and the localizer flags
them). They are removed at the end of the session.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from teller.analysis import Analysis
from teller.cli import main

SIM = ["--nodes", "1", "--gpus-per-node", "2", "--tp", "2", "--steps", "30", "--seed", "1"]
FAULTS = {
    "baseline": [],
    "kernel_regression": ["--fault", "kernel_regression", "--rank", "1", "--intensity", "2"],
    "host_cpu_contention": ["--fault", "host_cpu_contention", "--rank", "1", "--intensity", "2"],
}
WINDOW = ["--window", "5:25"]


@pytest.fixture(scope="session")
def sim_root(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("report-sim")
    yield root
    shutil.rmtree(root, ignore_errors=True)


_CASES: dict[str, Path] = {}


def _case(root: Path, name: str) -> Path:
    if name not in _CASES:
        out = root / name
        extra = FAULTS[name] + (WINDOW if FAULTS[name] else [])
        assert main(["-q", "lab", "sim", "--out", str(out), *SIM, *extra]) == 0
        _CASES[name] = out
    return _CASES[name]


@pytest.fixture(scope="session")
def baseline_case(sim_root: Path) -> Path:
    return _case(sim_root, "baseline")


@pytest.fixture(scope="session")
def kernel_regression_case(sim_root: Path) -> Path:
    return _case(sim_root, "kernel_regression")


@pytest.fixture(scope="session")
def contention_case(sim_root: Path) -> Path:
    return _case(sim_root, "host_cpu_contention")


@pytest.fixture(scope="session")
def baseline_analysis(baseline_case: Path) -> Analysis:
    return Analysis(baseline_case)


@pytest.fixture(scope="session")
def contention_analysis(contention_case: Path) -> Analysis:
    """Diagnosed once: the HTML, JSON and Perfetto tests all render this one verdict."""
    analysis = Analysis(contention_case)
    assert analysis.diagnose().findings, "the contention case must have anomalous steps"
    return analysis
