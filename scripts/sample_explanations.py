"""Print a sample of the default verdict's explanations on labelled cases, for a person to review.

Usage: .venv/bin/python scripts/sample_explanations.py CASE_ROOT [--cases 10] [--per-case 2]

The sample is fixed by rule, not chosen by hand: the fault cases under CASE_ROOT in name order,
each analysed as a user would (`teller -q analyze CASE --format json`), and from each the first
`--per-case` findings in the verdict's order whose step is in the labelled window, until
`--cases` cases have given at least one. Each is printed as a markdown list item with the case's
label, the finding's heads and the explanation verbatim, and an empty "Review:" line to write.
docs/scoreboard.md holds the reviewed samples.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from teller.labels import CaseLabels
from teller.layout import labelled_case_dirs


def verdict_of(case: Path) -> dict:
    """The verdict `teller analyze` writes for the case, in a fresh process as a user runs it."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "verdict.json"
        command = ["-q", "analyze", str(case), "--format", "json", "-o", str(out)]
        subprocess.run([sys.executable, "-m", "teller", *command], check=True, capture_output=True)
        return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--cases", type=int, default=10)
    parser.add_argument("--per-case", type=int, default=2)
    args = parser.parse_args()
    taken, number = 0, 0
    for case in labelled_case_dirs([args.root]):
        labels = CaseLabels.read(case)
        if labels.fault == "none" or taken == args.cases:
            continue
        verdict = verdict_of(case)
        inside = [f for f in verdict["findings"] if f["step"] in labels.steps][: args.per_case]
        if not inside:
            print(f"<!-- {case.name}: no finding inside the labelled window -->\n")
            continue
        taken += 1
        window = f"{min(labels.steps)}–{max(labels.steps)}"
        for finding in inside:
            number += 1
            print(
                f"{number}. **{case.name}**, label {labels.fault} on rank {labels.guilty_rank}, "
                f"operator {labels.guilty_operator}, steps {window}; finding: step "
                f"{finding['step']}, rank {finding['rank']}, {finding['fault_type']}, "
                f"{finding['operator']}\n"
            )
            print(f"   > {finding['explanation']}\n")
            print("   Review: \n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
