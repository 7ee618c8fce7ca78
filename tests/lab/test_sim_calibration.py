"""The committed calibration table is exactly what scripts/calibrate_sim.py derives from the real
traces: rerunning the script changes no byte, so the table can be trusted and regenerated."""

from __future__ import annotations

import importlib.util
import stat
from pathlib import Path

from conftest import REPO, real_trace, traces_root
from teller.lab.sim.calibration import CALIBRATION_PATH


def calibrate_sim():
    """scripts/calibrate_sim.py as a module (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(
        "calibrate_sim", REPO / "scripts" / "calibrate_sim.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_rederives_the_committed_table_byte_for_byte(tmp_path: Path):
    script = calibrate_sim()
    for relative in script.INPUTS:
        real_trace(relative)  # skips, naming `make traces`, when one is absent
    out = tmp_path / "calibration.json"
    assert script.main(["--traces", str(traces_root()), "--out", str(out)]) == 0
    assert out.read_bytes() == CALIBRATION_PATH.read_bytes()
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["calibration.json"]  # no temporary left
