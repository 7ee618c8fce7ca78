"""Which steps of a lab fault's window the fault acted on, read from the counter it raises.

A fault that is on is not a fault that acts. A CPU quota throttles the rank only in the periods
where it asks for more than its share; a rate limit delays only the transfers its bucket cannot
absorb; a memory limit slows only the steps that touch evicted pages; a GC storm stalls only
the steps its collections overlap, not those that run while it sleeps. A window step in which
none of that happened ran as a healthy step runs, and labelling it would score every method
for missing a fault that was not there (and teach a model to flag healthy steps). Where the
fault's counter stays flat on a healthy rank (`FaultKind.marks_steps`), the labels therefore
name the window steps in which it rose, on the guilty rank, between the end of that rank's
previous step and the end of the step: a rank held back between steps arrives late at the
step's first collective, which is where its peers wait.

A capped scheduler has no counter: the engine records, per step, whether the lowered limits kept
out work the configured ones would have run (`steps_held_back`), and the labels name those.

Where between two samples a rise happened is read as the analysis reads it
(`teller.ingest.host.cumulative_at`): a quota's throttled time is added when the throttled stretch
ends, so a rise covers the time just before its sample.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from teller.errors import TellerError
from teller.ingest.host import cumulative_at, read_host_file
from teller.lab.faults.catalog import LAB_FAULTS
from teller.lab.faults.host_stall import COUNTER as GC_COUNTER
from teller.lab.faults.host_stall import collections_file, read_collections
from teller.lab.faults.link_counters import COUNTER as LINK_COUNTER
from teller.lab.faults.link_counters import FILE_NAME as LINK_FILE
from teller.lab.faults.link_counters import read_link_overlimits
from teller.layout import GROUND_TRUTH_DIR


@dataclass(frozen=True)
class FaultCounter:
    """One cumulative counter of the guilty rank, sampled through a recording."""

    name: str
    t_ns: np.ndarray  # int64, wall clock
    values: np.ndarray  # float64, cumulative
    source: str  # the file it was read from, relative to the case directory


def fault_counter(case_dir: Path, fault: str, rank: int) -> FaultCounter | None:
    """The counter `fault` raises on `rank` as the recording in `case_dir` sampled it; None where
    the fault has none, or it was not sampled or not readable (no cgroup controller)."""
    name = LAB_FAULTS[fault].shows_in
    if name is None:
        return None
    if name == LINK_COUNTER:
        samples = read_link_overlimits(case_dir)
        if samples is None or len(samples[0]) < 2:
            return None
        t_ns, counts = samples
        source = f"run/{LINK_FILE}"
        return FaultCounter(
            name, np.asarray(t_ns, np.int64), np.asarray(counts, np.float64), source
        )
    if name == GC_COUNTER:
        path = collections_file(case_dir / GROUND_TRUTH_DIR, rank)
        samples = read_collections(path)
        if samples is None or len(samples[0]) < 2:
            return None
        return FaultCounter(name, samples[0], samples[1], str(path.relative_to(case_dir)))
    source = f"host/rank{rank}.jsonl"
    path = case_dir / source
    if not path.exists():
        return None
    try:
        series, _ = read_host_file(path, rank)
    except TellerError:
        return None
    values = series.counters[name]
    if len(values) < 2 or np.isnan(values).any():
        return None
    return FaultCounter(name, series.t_ns, values, source)


def steps_acted_on(start_ns: np.ndarray, end_ns: np.ndarray, counter: FaultCounter) -> np.ndarray:
    """Per step of one rank (in time order), whether the counter shows the fault acting between
    the end of the rank's previous step and the step's end."""
    if len(start_ns) == 0:
        return np.zeros(0, dtype=bool)
    order = np.argsort(start_ns, kind="stable")
    begins = np.empty(len(order), dtype=np.float64)
    begins[order] = np.concatenate([[start_ns[order[0]]], end_ns[order[:-1]]])
    begins = np.minimum(begins, start_ns)
    at = cumulative_at(counter.name, counter.t_ns, counter.values, np.concatenate([begins, end_ns]))
    return at[len(begins) :] - at[: len(begins)] > 0


#: The engine's record of its steps, under the case's `ground_truth/`.
STEPS_FILE = "steps.jsonl"


def steps_held_back(case_dir: Path) -> np.ndarray | None:
    """The engine's steps (rank 0's ordinals) whose limits kept out work the configured ones
    would have run: where a capped scheduler acted. Why: with nothing waiting, or a batch the
    lowered limits still hold whole, the cap changes nothing, and the step runs as a healthy one
    does. None where the recording does not say (written before the engine recorded it)."""
    path = case_dir / GROUND_TRUTH_DIR / STEPS_FILE
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not rows or any("held_back" not in row for row in rows):
            return None
        return np.asarray([row["step"] for row in rows if row["held_back"]], dtype=np.int64)
    except (OSError, ValueError, KeyError, TypeError):
        return None
