"""Shared test settings: where the real traces live (one setting, TELLER_TRACES), and no
event-table cache (tests must not write under the user's home, and a test that changes a
reader must see its change; tests/ingest/test_cache.py turns it on in a temporary directory)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ["TELLER_CACHE_DIR"] = "off"  # inherited by the CLI subprocesses tests start


def traces_root() -> Path:
    """TELLER_TRACES, else ../shared/traces beside the checkout, else .traces from `make traces`."""
    configured = os.environ.get("TELLER_TRACES")
    if configured:
        return Path(configured)
    shared = REPO.parent / "shared" / "traces"
    return shared if shared.is_dir() else REPO / ".traces"


def real_trace(relative: str) -> Path:
    """Path of a real trace file, or skip the test naming `make traces` when it is absent."""
    path = traces_root() / relative
    if not path.exists():
        pytest.skip(f"real trace {relative} not found under {traces_root()}: run `make traces`")
    return path


@pytest.fixture
def traces() -> Path:
    root = traces_root()
    if not root.is_dir():
        pytest.skip(f"real traces not found at {root}: run `make traces`")
    return root


#: Fixtures whose building is what makes a test slow, and the marker (pyproject.toml) each gives
#: every test that uses it, directly or through another fixture, so `-m "not train"` leaves it out.
FIXTURE_MARKERS = {
    "trained": "train",  # tests/rca/test_train.py: two tiny models fitted
    "gloo_run": "slow",  # tests/align/test_clock.py, tests/callchain/test_tree.py: a real 2-rank run
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in item.fixturenames:
                item.add_marker(marker)


def planted_analysis(relative: str, variant: str, out_dir: Path):
    """The planting suite's `variant` (e.g. "kernel:gemm:0.05", seed 19) of a real trace, written
    under `out_dir`, and the localizer's analysis of it: (analysis, truth)."""
    from teller.analysis import Analysis
    from teller.eval.planting_suite import SUITE, Planter, load

    spec = next(s for s in SUITE if s.path == relative)
    planted = Planter(spec, load(real_trace(relative)), seed=19).plant(variant)
    analysis = Analysis(planted.write(out_dir), method="localizer", progress=False)
    return analysis, planted.truth
