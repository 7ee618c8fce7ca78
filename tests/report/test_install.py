"""`pip install .` carries no torch: readers, localizer, reports and diff work without it, and the
default method falls back to the localizer saying why in one line."""

from __future__ import annotations

import sys
import tomllib

from conftest import REPO
from teller.analysis import Analysis

HEAVY = ("torch", "safetensors", "scikit-learn", "transformers", "accelerate")


def requirement_name(requirement: str) -> str:
    for separator in "<>=![; ":
        requirement = requirement.split(separator)[0]
    return requirement.strip().lower()


def test_base_install_has_no_torch_and_extras_add_it():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "teller-rca"  # `teller` on PyPI is another project
    base = {requirement_name(r) for r in project["dependencies"]}
    assert not base & set(HEAVY)
    extras = project["optional-dependencies"]
    assert {"torch", "safetensors"} <= {requirement_name(r) for r in extras["model"]}
    assert "scikit-learn" in {requirement_name(r) for r in extras["eval"]}
    assert "transformers" in {requirement_name(r) for r in extras["lab"]}


def test_without_torch_the_localizer_answers_in_one_line(contention_case, monkeypatch):
    for module in [m for m in sys.modules if m.split(".")[0] in ("torch", "safetensors")]:
        monkeypatch.delitem(sys.modules, module)
    for module in [m for m in sys.modules if m in ("teller.rca.infer", "teller.rca.model")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    monkeypatch.setitem(sys.modules, "safetensors", None)
    verdict = Analysis(contention_case).diagnose()
    assert verdict.method == "localizer"
    notes = [w for w in verdict.warnings if "cannot import torch" in w]
    assert len(notes) == 1 and "\n" not in notes[0]
    assert verdict.findings, "the localizer still names the slow steps"
