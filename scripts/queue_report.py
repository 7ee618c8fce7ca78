"""Whether the steps the default model types as a capped scheduler held requests back.

Usage: .venv/bin/python scripts/queue_report.py CASE_OR_ROOT...

For each labelled case, as `teller analyze` reads it: the steps the model flags and types
`scheduler_misconfig` before the queue's check (`teller.rca.infer.queue_refutes`, switched off
here by reading every record's queue as unknown), inside and outside the labelled steps, and how
many of each held a waiting request back (`StepRecord.held_back` > 0). The last lines give the
totals over all cases. docs/scoreboard.md and src/teller/rca/default_model/README.md quote its
output.
"""

from __future__ import annotations

import dataclasses
import sys

from teller.analysis import Analysis
from teller.labels import CaseLabels
from teller.layout import labelled_case_dirs
from teller.rca.dataset import case_records
from teller.rca.infer import QUEUED_FAULT, LoadedModel


def main() -> int:
    model = LoadedModel.load()
    totals = {"inside": [0, 0], "outside": [0, 0]}  # [flagged, of them held back]
    for case in labelled_case_dirs(sys.argv[1:]):
        labels = CaseLabels.read(case)
        analysis = Analysis(case)
        labelled = set(labels.keyed_to(analysis.tree.steps).steps)
        records = case_records(analysis.tree, "", None, analysis.alignment, analysis.facts)
        unknown = [dataclasses.replace(r, held_back=None) for r in records]
        diagnoses = model.diagnose_records(unknown)
        counts = {"inside": [0, 0], "outside": [0, 0]}
        for record, diagnosis in zip(records, diagnoses, strict=True):
            if not (diagnosis.anomalous and diagnosis.fault == QUEUED_FAULT):
                continue
            where = "inside" if record.iteration in labelled else "outside"
            counts[where][0] += 1
            counts[where][1] += bool(record.held_back)
        for where, (flagged, held) in counts.items():
            totals[where][0] += flagged
            totals[where][1] += held
        if counts["inside"][0] or counts["outside"][0]:
            print(
                f"{case}: {labels.fault}, {len(labelled)} labelled steps; typed {QUEUED_FAULT}: "
                + "; ".join(
                    f"{where} the labels {flagged}, {held} of them held requests back"
                    for where, (flagged, held) in counts.items()
                )
            )
    for where, (flagged, held) in totals.items():
        print(
            f"total {where} the labels: {flagged} typed {QUEUED_FAULT}, {held} held requests back"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
