"""The README's Python example runs as written, on a real simulated case standing in for the demo."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from teller.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = tmp_path / "demo-out" / "case"
    argv = ["-q", "lab", "sim", "--out", str(case), "--nodes", "1", "--gpus-per-node", "2"]
    argv += ["--tp", "2", "--steps", "40", "--fault", "straggler", "--rank", "1"]
    argv += ["--intensity", "2", "--window", "28:36", "--seed", "3"]
    assert main(argv) == 0
    api = README.read_text().split("## Python API", 1)[1]  # capture recipes come earlier
    example = re.search(r"```python\n(.*?)```", api, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    verdict = namespace["verdict"]
    assert verdict.method == "model:default"
    assert verdict.findings and verdict.findings[0].rank == 1
    assert namespace["numbers_only"].method == "localizer"
    assert not namespace["steps"].empty
    assert (tmp_path / "demo-out" / "report-from-python.html").stat().st_size > 1000
