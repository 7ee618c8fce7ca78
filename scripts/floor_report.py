"""What the default model's step threshold and the floors under it flag on labelled cases.

Usage: .venv/bin/python scripts/floor_report.py CASE_OR_ROOT...

For each labelled case, as `teller analyze` reads it (traces, logs, host counters): the labelled
steps the verdict flags on the guilty rank, the steps it flags outside the labelled window, the
ranks other than the guilty one it names, and how many steps inside and outside the window
each rule flags: the step head at the checkpoint's threshold, `teller.rca.infer.unmissable`
(3x expected, robust z >= 4) and `teller.rca.infer.held_off_cpu` (host counters). Labelled steps
left unflagged are listed with the step head's output, their time against expected and the
largest share of a rank's step time the counters show it held off a CPU beyond its usual. The last
line gives the quantiles of the unlabelled steps' time against expected over all cases: how far
a normal step strays from what its batch predicts, which `HELD_SLOWER` must clear.
docs/scoreboard.md and src/teller/rca/default_model/README.md quote its output.
"""

from __future__ import annotations

import sys

import numpy as np

from teller.analysis import Analysis
from teller.labels import CaseLabels
from teller.layout import labelled_case_dirs
from teller.rca.dataset import case_records
from teller.rca.host import held_off_share
from teller.rca.infer import LoadedModel, held_off_cpu, unmissable


def main() -> int:
    model = LoadedModel.load()
    totals = {"head": [0, 0], "unmissable": [0, 0], "held_off_cpu": [0, 0]}
    normal_ratios: list[float] = []
    for case in labelled_case_dirs(sys.argv[1:]):
        labels = CaseLabels.read(case)
        window = set(labels.steps)
        analysis = Analysis(case)
        verdict = analysis.diagnose()
        records = case_records(analysis.tree, "", None, analysis.alignment, analysis.facts)
        probability = model.forward(records).probability
        host = analysis.host
        held = held_off_share(analysis.tree, host) if host is not None else {}
        rules = {
            "head": probability >= model.threshold,
            "unmissable": unmissable(records),
            "held_off_cpu": held_off_cpu(records, held),
        }
        counts = []
        for name, flagged in rules.items():
            steps = {r.iteration for r, f in zip(records, flagged, strict=True) if f}
            inside, outside = len(steps & window), len(steps - window)
            totals[name][0] += inside
            totals[name][1] += outside
            counts.append(f"{name} {inside} in / {outside} out")
        named = {f.step for f in verdict.findings}
        on_guilty = {f.step for f in verdict.findings if f.rank == labels.guilty_rank}
        others = sorted({f.rank for f in verdict.findings if f.rank != labels.guilty_rank} - {None})
        share = len(on_guilty & window) / len(window) if window else 0.0
        print(
            f"{case}: {labels.fault}, {len(on_guilty & window)}/{len(window)} labelled steps "
            f"({share:.0%}) flagged on rank {labels.guilty_rank}; outside the window "
            f"{sorted(named - window)}; other ranks named {others}; {'; '.join(counts)}"
        )
        normal_ratios += [
            r.dur_ns / r.expected_ns
            for r in records
            if r.iteration not in window and r.expected_ns > 0
        ]
        for r, p in zip(records, probability, strict=True):
            if r.iteration in window and r.iteration not in on_guilty:
                ratio = r.dur_ns / max(r.expected_ns, 1)
                print(
                    f"    missed step {r.iteration}: head {p:.2f}, {ratio:.2f}x expected, "
                    f"held off a CPU {held.get(r.iteration, 0.0):.0%} of the step beyond usual"
                )
    print(
        "total: "
        + "; ".join(
            f"{name} {inside} in / {outside} out" for name, (inside, outside) in totals.items()
        )
    )
    if normal_ratios:
        quantiles = np.quantile(normal_ratios, [0.5, 0.95, 0.99, 1.0])
        print(
            f"unlabelled steps ({len(normal_ratios)}), time against expected: "
            + ", ".join(
                f"{name} {q:.2f}x"
                for name, q in zip(("p50", "p95", "p99", "max"), quantiles, strict=True)
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
