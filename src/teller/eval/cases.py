"""Labelled cases on disk: find them, load each once, split them by case (never by step).

A case is a directory with `labels.json` (teller.labels) and its traces, as written by
`teller lab run`, `teller lab dataset` and `teller lab sim`, and usually its service logs in
`logs/` (and OpenTelemetry spans in `otlp/`). Methods that read logs get them as `CaseLogs`:
aligned once to the case's tree, spans included as `teller analyze` aligns them, and shared by
every such method, so no method pays for (or differs in) the alignment.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from teller.callchain.tree import CallTree
from teller.errors import TellerError
from teller.labels import CaseLabels
from teller.layout import CaseDir, labelled_case_dirs

if TYPE_CHECKING:
    from teller.align.align import AlignResult
    from teller.align.host import HostSteps


@dataclass
class Case:
    path: Path
    labels: CaseLabels

    @property
    def case_id(self) -> str:
        return self.path.name

    def tree(self) -> CallTree:
        """The case's tree on one clock, as `teller analyze` builds it."""
        from teller.align.align import read_on_one_clock

        return read_on_one_clock([CaseDir(self.path).trace_root()])[0].tree

    def log_files(self) -> list[Path]:
        return CaseDir(self.path).log_files()

    def logs(self, tree: CallTree) -> CaseLogs:
        """The case's logs and spans aligned to `tree` (the tree `tree()` returned for it)."""
        return align_case_logs(tree, self.log_files(), CaseDir(self.path).otlp_files())

    def host(self, tree: CallTree) -> HostSteps | None:
        """The host counters `teller collect` sampled beside the traces, over `tree`'s steps, as
        `teller analyze` reads them; None where the case has none (a simulated one)."""
        files = CaseDir(self.path).host_files()
        if not files:
            return None
        from teller.align.host import read_host_steps

        return read_host_steps(tree, files)[0]


@dataclass
class CaseLogs:
    """A case's log files and, when it has logs or spans, their records placed on its steps.

    `aligned` holds the log table and, per line, its step, rank, tree node and template, and the
    request trees the logs and spans give (the model's request queue).
    """

    paths: list[Path]
    aligned: AlignResult | None  # None: the case has neither log files nor spans


def align_case_logs(tree: CallTree, paths: list[Path], span_paths: Sequence[Path] = ()) -> CaseLogs:
    """Align the log files (and spans) to the tree once, for every method that reads logs."""
    if not paths and not span_paths:
        return CaseLogs(paths=[], aligned=None)
    from teller.align.align import align_tree

    return CaseLogs(paths=list(paths), aligned=align_tree(tree, paths, span_paths))


def find_cases(roots: list[Path]) -> list[Case]:
    """Every directory holding a labels.json under the given roots, sorted by path."""
    cases = [Case(path, CaseLabels.read(path)) for path in labelled_case_dirs(roots)]
    if not cases:
        raise TellerError(f"{', '.join(map(str, roots))}: no labelled cases (labels.json) found")
    return cases


@dataclass
class Split:
    train: list[str]
    test: list[str]
    held_out_fault: str | None = None

    def to_json(self) -> dict:
        return {"train": self.train, "test": self.test, "held_out_fault": self.held_out_fault}

    @classmethod
    def read(cls, path: Path) -> Split:
        try:
            data = json.loads(path.read_text())
            return cls(data["train"], data["test"], data.get("held_out_fault"))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise TellerError(f"{path}: not a split file (train/test case ids): {error}") from None


def split_cases(
    cases: list[Case], test_share: float = 0.3, seed: int = 0, held_out_fault: str | None = None
) -> Split:
    """Split by case, stratified by fault; a held-out fault type goes wholly to the test side."""
    rng = random.Random(seed)
    by_fault: dict[str, list[str]] = {}
    for case in cases:
        by_fault.setdefault(case.labels.fault, []).append(case.case_id)
    train: list[str] = []
    test: list[str] = []
    for fault, ids in sorted(by_fault.items()):
        ids = sorted(ids)
        rng.shuffle(ids)
        if fault == held_out_fault:
            test.extend(ids)
            continue
        cut = max(1, round(len(ids) * test_share)) if len(ids) > 1 else 0
        test.extend(ids[:cut])
        train.extend(ids[cut:])
    return Split(sorted(train), sorted(test), held_out_fault)


def iterate(cases: list[Case], ids: list[str]) -> Iterator[Case]:
    wanted = set(ids)
    return (case for case in cases if case.case_id in wanted)
