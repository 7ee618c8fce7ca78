"""The watcher's output folder: complete cases only, and never more than the last K of them.

A capture is written into a hidden `.capture-*.partial` folder and renamed to its case name only
once its traces, logs and report are all there, so a case folder is always whole. Partial folders
left by a watcher that was killed are removed when the next one starts; the oldest cases are
removed when there are more than `keep`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

PARTIAL_PREFIX = ".capture-"
PARTIAL_SUFFIX = ".partial"
#: Every finished case holds this file (the incident record), which is how cases are recognised.
INCIDENT_FILE = "incident.json"


def partial_dir(out_dir: Path, name: str) -> Path:
    return out_dir / f"{PARTIAL_PREFIX}{name}{PARTIAL_SUFFIX}"


def remove_partials(out_dir: Path) -> list[Path]:
    """Remove captures a killed watcher left half-written; the folders removed."""
    if not out_dir.is_dir():
        return []
    removed = []
    for path in sorted(out_dir.glob(f"{PARTIAL_PREFIX}*{PARTIAL_SUFFIX}")):
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def case_dirs(out_dir: Path) -> list[Path]:
    """Finished cases, oldest first (names are UTC capture times, so they sort in time)."""
    if not out_dir.is_dir():
        return []
    return sorted(p for p in out_dir.iterdir() if p.is_dir() and (p / INCIDENT_FILE).is_file())


def prune_cases(out_dir: Path, keep: int) -> list[Path]:
    """Remove the oldest finished cases beyond the newest `keep`; the folders removed."""
    cases = case_dirs(out_dir)
    doomed = cases[: max(0, len(cases) - keep)]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def finish(partial: Path, final: Path) -> Path:
    """Give a complete capture its case name, atomically (one rename on one file system)."""
    if final.exists():
        raise FileExistsError(final)
    partial.rename(final)
    return final
