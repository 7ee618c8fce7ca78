"""`teller analyze --format json` matches its published JSON Schema (teller.verdict/1) on real
outputs, and the schema is strict enough to catch a renamed or mistyped field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from conftest import real_trace
from teller.cli import main
from teller.rca.verdict import SCHEMA_VERSION
from teller.report import render

jsonschema = pytest.importorskip(
    "jsonschema", reason="jsonschema not installed: .venv/bin/pip install jsonschema"
)

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "src/teller/report/verdict.schema.json"
VLLM = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"


def _strict_json(text: str) -> dict:
    """Parse as a strict JSON reader would: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not valid JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _errors(validator, document: dict) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]


def test_schema_names_the_version_the_code_writes():
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["properties"]["schema"]["const"] == SCHEMA_VERSION
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_simulated_fault_case_validates(validator, contention_analysis):
    document = _strict_json(
        render(contention_analysis.diagnose(), contention_analysis.tree, "json")
    )
    assert _errors(validator, document) == []
    finding = document["findings"][0]  # every nested object is exercised
    assert finding["candidates"] and finding["evidence"] and finding["log_lines"]
    assert finding["requests"] and document["steps"]


def test_real_vllm_trace_validates(validator, tmp_path: Path):
    out = tmp_path / "verdict.json"
    assert main(["-q", "analyze", str(real_trace(VLLM)), "-o", str(out)]) == 0
    document = _strict_json(out.read_text())
    assert _errors(validator, document) == []
    assert document["schema"] == SCHEMA_VERSION and document["steps"]
    breakdown = document["breakdown"]
    assert breakdown["runs"] and breakdown["steps"]  # where the time went, per rank and step
    assert breakdown["steps"][0]["top_kernels"] and breakdown["steps"][0]["summary"]


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d["findings"][0].pop("operator"),
        lambda d: d["findings"][0].update(view="X"),
        lambda d: d["steps"][0].update(dur_ns="1 ms"),
        lambda d: d["findings"][0]["evidence"][0].update(extra=1),
        lambda d: d.update(schema="teller.verdict/2"),
        lambda d: d.pop("breakdown"),
        lambda d: d["breakdown"]["steps"][0]["idle_by_cause_ns"].pop("sync"),
        lambda d: d["breakdown"]["runs"][0]["longest_gaps"][0].update(cause="gc"),
    ],
    ids=[
        "missing-field",
        "bad-enum",
        "wrong-type",
        "unknown-field",
        "other-version",
        "no-breakdown",
        "breakdown-missing-cause",
        "breakdown-bad-cause",
    ],
)
def test_schema_rejects_damaged_documents(validator, contention_analysis, damage):
    document = json.loads(render(contention_analysis.diagnose(), contention_analysis.tree, "json"))
    damaged = copy.deepcopy(document)
    damage(damaged)
    assert _errors(validator, damaged)
