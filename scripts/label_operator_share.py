"""How often a labelled case's guilty operator is what its flagged steps actually lost time in.

    .venv/bin/python scripts/label_operator_share.py CASE_DIR [CASE_DIR ...]

For each labelled case (labels.json beside its traces), `teller analyze --method model` is run
once (its JSON verdict kept as CASE_DIR.verdict.json beside the case, reused when present), and
over the flagged steps inside the label's window it counts two things. First, the steps whose
named rank's candidate with the largest excess is the label's operator. Second, the steps whose
finding names it. A fault that slows one operator scores near all of its steps on the first
count. A fault that takes the rank's CPU (a quota, busy processes on its core) stalls whichever
operator is running, so its label's operator is only the likeliest (`teller.labels.scored_operator`
scores such faults by their rank).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from teller.cli import main as teller
from teller.labels import CaseLabels

#: Candidate kinds whose score is the operator's excess over its normal time in the step.
EXCESS_KINDS = ("compute", "shift")


def verdict_of(case: Path) -> dict:
    out = case.parent / f"{case.name}.verdict.json"
    if not out.is_file():
        status = teller(["-q", "analyze", str(case), "--method", "model", "-o", str(out)])
        if status != 0:
            raise SystemExit(f"{case}: teller analyze exited {status}")
    return json.loads(out.read_text())


def shares(case: Path) -> tuple[CaseLabels, int, int, int]:
    """(labels, flagged labelled steps, largest excess is the label's, named is the label's)."""
    labels = CaseLabels.read(case)
    window = set(labels.steps)
    flagged = largest = named = 0
    for finding in verdict_of(case)["findings"]:
        if finding["step"] not in window:
            continue
        flagged += 1
        named += finding["operator"] == labels.guilty_operator
        own = [
            c
            for c in finding["candidates"]
            if c["rank"] == finding["rank"] and c["kind"] in EXCESS_KINDS
        ]
        if own:
            top = max(own, key=lambda c: c["score"])["operator"]
            largest += top == labels.guilty_operator
    return labels, flagged, largest, named


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", type=Path)
    args = parser.parse_args()
    print("| case | fault | label's operator | flagged labelled steps | largest excess | named |")
    print("|---|---|---|---:|---:|---:|")
    for case in args.cases:
        labels, flagged, largest, named = shares(case)
        print(
            f"| {case.name} | {labels.fault} | {labels.guilty_operator} | {flagged} "
            f"| {largest} | {named} |"
        )


if __name__ == "__main__":  # the analysis reads rank files in spawned processes
    run()
