"""`DIR/manifest.json`: what ran, where, for how long, and where each rank's trace and log are.

The runner writes it once, atomically, after the command ends, from its own facts and the per-process
records the agents left in `DIR/procs/`. Paths in it are relative to DIR. Shape (format 1)::

    {"format": 1, "command": [...], "cwd": "...", "backend": "torch", "steps": [A, B] | null,
     "hosts": ["vm"], "start_wall_ns": ..., "end_wall_ns": ..., "start_utc": "...", "end_utc": "...",
     "exit_code": 0, "launcher_log": "logs/launcher.log",
     "ranks": {"0": {"pid": ..., "host": "...", "trace": "traces/rank0.pt.trace.json.gz" | null,
                     "log": "logs/rank0.log", "clock_at_profiler_start":
                     {"time_ns": ..., "monotonic_ns": ..., "perf_counter_ns": ...}, ...}},
     "processes": [every agent record, ranked or not]}

`ranks` keys are the rank number, or `pid{PID}` for a process that never learned its rank. The
clock readings were taken together just before the profiler started, so a trace's monotonic or
perf-counter timestamps map to wall clock by adding `time_ns - monotonic_ns` (resp. perf_counter).
Kineto's own export already carries `baseTimeNanoseconds`, which teller's reader applies.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from teller.atomic import write_text_atomic

FORMAT = 1


@dataclass
class Manifest:
    command: list[str]
    cwd: str
    backend: str
    steps: list[int] | None
    start_wall_ns: int
    end_wall_ns: int
    exit_code: int
    launcher_log: str
    hosts: list[str] = field(default_factory=list)
    ranks: dict[str, dict] = field(default_factory=dict)
    processes: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        value = {"format": FORMAT, **asdict(self)}
        value["start_utc"] = _utc(self.start_wall_ns)
        value["end_utc"] = _utc(self.end_wall_ns)
        return value


def _utc(wall_ns: int) -> str:
    return datetime.fromtimestamp(wall_ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def read_process_records(procs_dir: Path, out_dir: Path) -> list[dict]:
    """The agents' records, oldest process first, with paths made relative to the run folder."""
    records = []
    for path in sorted(procs_dir.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a record being replaced right now; the rename makes this vanishingly rare
        for key in ("trace", "log"):
            if record.get(key):
                record[key] = os.path.relpath(record[key], out_dir)
        records.append(record)
    return sorted(records, key=lambda r: r.get("torch_imported_wall_ns", 0))


def ranks_from_records(records: list[dict]) -> dict[str, dict]:
    """Rank → its process record; a process without a rank is keyed `pid{PID}`."""
    ranks: dict[str, dict] = {}
    for record in records:
        key = str(record["rank"]) if record.get("rank") is not None else f"pid{record['pid']}"
        if key in ranks:  # a child that inherited RANK: keep the first, keep the other by pid
            key = f"pid{record['pid']}"
        ranks[key] = record
    return ranks


def write_manifest(manifest: Manifest, path: Path) -> None:
    """Write atomically, so a reader never sees half a manifest."""
    write_text_atomic(path, json.dumps(manifest.to_json(), indent=1) + "\n")
