"""The scoreboard: every method as a row, per view, as markdown and JSON.

Explanation figures get their own small table under each group, listing only the methods that
explain their steps: as extra columns they would be a dash for most rows of an already wide table.
"""

from __future__ import annotations

import json
from pathlib import Path

from teller.eval.harness import EvalResult, Row
from teller.report import write_atomic

PAPER = {"horizontal": 0.85, "vertical": 0.82}


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


EXPLANATIONS_NOTE = (
    "Explanations are judged on the true-positive steps of fault cases: fault type right; "
    "faithful (the text names exactly the operator and rank the method's pointer picked, and no "
    "other rank); grounded right (the pick is the labelled operator and rank; where the label "
    "scores no operator, the labelled rank for a fault of one rank, else any pick); ROUGE-L F "
    "against the label's reference sentence; well-formed (the text parses under the "
    "sentence-plan grammar, docs/explanations.md); agreement (its fault type, rank and operator "
    "are the method's heads'); excess explained (the share of the step's excess the named "
    "evidence accounts for, over the explanations that state one)."
)


JOINT_NOTE = (
    "A joint hit is a labelled step flagged with the labelled operator named (where the label "
    "scores one) and the labelled rank (for horizontal faults, and for a fault of one rank "
    "whose operator is not scored: the lab's CPU quota and CPU contention, which stall whichever "
    "operator runs when the CPU is taken; `teller.labels.scored_operator`, `rank_scored`)."
)


def _explanation_table(rows: list[Row]) -> list[str]:
    """The group's explanation figures, for the methods that have them (none: no table)."""
    explaining = [r for r in rows if r.explained_steps is not None]
    if not explaining:
        return []
    lines = [
        "",
        "Explanations:",
        "",
        "| method | steps explained | fault type right | faithful | grounded right | ROUGE-L F "
        "| well-formed | agreement | excess explained |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in explaining:
        lines.append(
            f"| {r.method} | {r.explained_steps} | {_cell(r.fault_type_right)} "
            f"| {_cell(r.faithful)} | {_cell(r.grounded_right)} | {_cell(r.rouge_l)} "
            f"| {_cell(r.well_formed)} | {_cell(r.agreement)} | {_cell(r.excess_explained)} |"
        )
    return lines


def render_markdown(result: EvalResult, command: str, cases_note: str) -> str:
    lines = [
        "# Scoreboard",
        "",
        f"Produced by `{command}` on {cases_note}.",
        f"Split by case: {len(result.split.train)} train, {len(result.split.test)} test"
        + (
            f"; held-out fault type: {result.split.held_out_fault}"
            if result.split.held_out_fault
            else ""
        )
        + ". Paper (TELLER) joint F1: horizontal 0.85, vertical 0.82.",
        "",
        JOINT_NOTE,
        "",
    ]
    if any(r.explained_steps is not None for r in result.rows):
        lines += [EXPLANATIONS_NOTE, ""]
    groups: dict[str, list[Row]] = {}
    for row in result.rows:
        groups.setdefault(row.group, []).append(row)
    for group, rows in groups.items():
        lines.append(f"## {group}")
        lines.append("")
        lines.append(
            "| method | cases | step P | step R | step F1 | AC@1 | AC@3 | Avg@5 | rank AC@1 "
            "| joint P | joint R | **joint F1** | false alarms |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            lines.append(
                f"| {r.method} | {r.cases} | {_cell(r.step_precision)} | {_cell(r.step_recall)} "
                f"| {_cell(r.step_f1)} | {_cell(r.ac1)} | {_cell(r.ac3)} | {_cell(r.avg5)} "
                f"| {_cell(r.rank_ac1)} | {_cell(r.joint_precision)} | {_cell(r.joint_recall)} "
                f"| **{_cell(r.joint_f1)}** | {_cell(r.false_alarm_rate)} |"
            )
        if group in PAPER:
            lines.append(f"\nPaper's joint F1 for this view: {PAPER[group]:.2f}.")
        lines += _explanation_table(rows)
        lines.append("")
    return "\n".join(lines)


def write_scoreboard(
    result: EvalResult, directory: Path, command: str, cases_note: str
) -> list[Path]:
    markdown = write_atomic(
        directory / "scoreboard.md", render_markdown(result, command, cases_note)
    )
    data = {"command": command, "cases": cases_note, **result.to_json()}
    js = write_atomic(directory / "scoreboard.json", json.dumps(data, indent=2))
    return [markdown, js]
