"""The case directory: where a run's traces, logs, spans and labels lie on disk.

`teller collect`, `teller lab run` and `teller lab sim` write this layout, and `teller analyze`,
the evaluation harness and training read it, so one folder a user hands over is a whole run:

    CASE/traces/          one trace file per rank (Kineto JSON, .json.gz, nsys .sqlite)
    CASE/logs/*.log       the service's own logs, one file per process
    CASE/otlp/*.json      OpenTelemetry spans (OTLP JSON)
    CASE/host/*.jsonl     host counters of each traced process (`teller.collect.host`)
    CASE/ground_truth/    what the lab's or simulator's engine recorded (labelled cases only)
    CASE/labels.json      the injected fault (labelled cases only)
    CASE/manifest.json    what was run, when and how
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TRACES_DIR = "traces"
LOGS_DIR = "logs"
OTLP_DIR = "otlp"
HOST_DIR = "host"
HOST_PATTERN = "rank*.jsonl"
GROUND_TRUTH_DIR = "ground_truth"
LABELS_FILE = "labels.json"
MANIFEST_FILE = "manifest.json"
LOG_PATTERN = "*.log"
SPAN_PATTERN = "*.json"


@dataclass(frozen=True)
class CaseDir:
    """One case directory; every path below it is named here and nowhere else."""

    root: Path

    @property
    def traces(self) -> Path:
        return self.root / TRACES_DIR

    @property
    def logs(self) -> Path:
        return self.root / LOGS_DIR

    @property
    def otlp(self) -> Path:
        return self.root / OTLP_DIR

    @property
    def host(self) -> Path:
        return self.root / HOST_DIR

    @property
    def ground_truth(self) -> Path:
        return self.root / GROUND_TRUTH_DIR

    @property
    def labels(self) -> Path:
        return self.root / LABELS_FILE

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST_FILE

    def trace_root(self) -> Path:
        """Where the rank files are: `traces/` when present, else the folder itself (a plain
        folder of rank files is a case without logs)."""
        return self.traces if self.traces.is_dir() else self.root

    def log_files(self) -> list[Path]:
        return sorted(self.logs.glob(LOG_PATTERN)) if self.logs.is_dir() else []

    def otlp_files(self) -> list[Path]:
        return sorted(self.otlp.glob(SPAN_PATTERN)) if self.otlp.is_dir() else []

    def host_files(self) -> list[Path]:
        """The host counters of the processes that got a rank name (`rank0.jsonl`)."""
        return sorted(self.host.glob(HOST_PATTERN)) if self.host.is_dir() else []

    def is_labelled(self) -> bool:
        return self.labels.is_file()


def labelled_case_dirs(roots: Iterable[Path]) -> list[Path]:
    """Every labelled case under the roots: a root that is a case itself, else each directory
    below it holding a labels file, sorted by path within each root."""
    dirs: list[Path] = []
    for root in map(Path, roots):
        if CaseDir(root).is_labelled():
            dirs.append(root)
        else:
            dirs.extend(sorted(_labelled_below(root)))
    return dirs


def _labelled_below(root: Path) -> list[Path]:
    """Directories under `root` holding a labels file, through symbolic links too: a board is
    often a folder of links to cases recorded elsewhere. Each real directory is visited once, so
    a link back up the tree ends the walk there."""
    found: list[Path] = []
    visited: set[str] = set()
    for here, subdirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(here)
        if real in visited:
            subdirs.clear()
            continue
        visited.add(real)
        if LABELS_FILE in files:
            found.append(Path(here))
    return found
