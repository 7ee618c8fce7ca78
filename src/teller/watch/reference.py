"""The reference capture: a few seconds of the service running normally, kept to compare against.

An incident capture is taken after the objective broke, so every step in it may be slow alike,
and a verdict that compares steps with steps needs normal ones beside them. The watcher records
one short capture while every objective holds (again after an engine restart, and every so often),
keeps it in `OUT/.reference/`, and puts its traces and logs into each incident case under a
`reference-` prefix (and its host counters, where the engine wrote them, into each rank's series): `teller analyze CASE` then sees normal steps followed by the incident's, the
shape of a run whose fault began part-way, and anyone re-running it gets the same verdict.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from teller.atomic import write_text_atomic
from teller.layout import CaseDir
from teller.watch.capture import Capture

REFERENCE_DIR = ".reference"
REFERENCE_FILE = "reference.json"
PREFIX = "reference-"


@dataclass
class Reference:
    root: Path
    start_wall_ns: int
    end_wall_ns: int

    def files(self) -> list[Path]:
        case = CaseDir(self.root)
        traces = sorted(case.traces.iterdir()) if case.traces.is_dir() else []
        return traces + case.log_files()


def store_reference(partial: Path, captured: Capture, out_dir: Path) -> Reference:
    """Make the capture in `partial` the reference, replacing the previous one."""
    record = {"start_wall_ns": captured.start_wall_ns, "end_wall_ns": captured.end_wall_ns}
    write_text_atomic(partial / REFERENCE_FILE, json.dumps(record) + "\n")
    final = out_dir / REFERENCE_DIR
    retired = out_dir / f"{REFERENCE_DIR}.old"
    shutil.rmtree(retired, ignore_errors=True)
    if final.exists():
        final.rename(retired)
    partial.rename(final)
    shutil.rmtree(retired, ignore_errors=True)
    return Reference(final, captured.start_wall_ns, captured.end_wall_ns)


def add_reference(reference: Reference, case_dir: Path) -> list[Path]:
    """Put the reference's traces and logs into a case (hard links where the file system allows)."""
    case, added = CaseDir(case_dir), []
    for path in reference.files():
        folder = (
            case.traces if path.parent.name == CaseDir(reference.root).traces.name else case.logs
        )
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{PREFIX}{path.name}"
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)
        added.append(target)
    for path in CaseDir(reference.root).host_files():  # one series per rank: appended
        case.host.mkdir(parents=True, exist_ok=True)
        with (case.host / path.name).open("ab") as target_file:
            target_file.write(path.read_bytes())
    return added
