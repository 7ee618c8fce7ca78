"""Which steps the capped-scheduler floor flags, against the labels.

Usage: .venv/bin/python scripts/capped_report.py CASE_OR_ROOT...

For each labelled case, as `teller analyze` reads it: the steps that held back a waiting request
they had room for (`StepRecord.held_back` > 0), those the floor flags
(`teller.rca.infer.held_back_with_room`: held back with the step's own engine line stating a KV
cache under `KV_FULL`), inside and outside a capped scheduler's labels, and the least KV fill
stated among the held-back steps the floor leaves. The last lines give the totals over all
cases. docs/scoreboard.md and src/teller/rca/default_model/README.md quote its output.
"""

from __future__ import annotations

import sys

from teller.analysis import Analysis
from teller.labels import CaseLabels
from teller.layout import labelled_case_dirs
from teller.rca.dataset import case_records
from teller.rca.infer import QUEUED_FAULT, held_back_with_room


def main() -> int:
    totals = {"labelled": [0, 0], "other": [0, 0]}  # [steps, of them flagged by the floor]
    left_fills: list[float] = []
    for case in labelled_case_dirs(sys.argv[1:]):
        labels = CaseLabels.read(case)
        analysis = Analysis(case)
        labelled = set(labels.keyed_to(analysis.tree.steps).steps)
        records = case_records(analysis.tree, "", None, analysis.alignment, analysis.facts)
        floored = held_back_with_room(records)
        counts = {"labelled": [0, 0], "other": [0, 0]}
        for record, flagged in zip(records, floored, strict=True):
            capped = labels.fault == QUEUED_FAULT and record.iteration in labelled
            where = "labelled" if capped else "other"
            counts[where][0] += 1
            counts[where][1] += bool(flagged)
            if record.held_back and not flagged and record.kv_cache_fill is not None:
                left_fills.append(record.kv_cache_fill)
        for where, (steps, flagged) in counts.items():
            totals[where][0] += steps
            totals[where][1] += flagged
        if counts["labelled"][0] or counts["other"][1]:
            print(
                f"{case}: {labels.fault}; capped-scheduler labelled steps "
                f"{counts['labelled'][0]}, floored {counts['labelled'][1]}; other steps floored "
                f"{counts['other'][1]}"
            )
    for where, (steps, flagged) in totals.items():
        print(f"total {where} steps: {steps}, flagged by the floor: {flagged}")
    least = f"{min(left_fills):.3f}" if left_fills else "-"
    print(f"held back but not floored, with a stated fill: {len(left_fills)}, least fill {least}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
