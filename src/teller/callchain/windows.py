"""A run too large to hold, cut into time windows that are each analysed as a run of their own.

Why: splitting by engine bounds memory by the largest engine (`split.py`), but one engine's
trace can itself be larger than memory: a multi-GB Kineto file is a single rank. Its steps are
compared only with steps near them in number, not with every step of the run, so the run can be
read a window of time at a time (`teller.ingest.kineto_windows`), each window analysed as a whole
run, and the windows' findings joined.

A window owns the steps that start inside it and reads a margin either side, so that the steps at
its edges are whole and have neighbours; the steps of a margin are scored there but reported only
by the window that owns them. Steps keep the ordinal they have in the whole run: the first pass
over each window (`window_steps`, the forests then kept on disk) counts every rank's steps, so the
windows number theirs from where the earlier ones stopped (`Ledger.numbering`). An iteration of an
engine belongs to the window where its earliest rank starts it, so every iteration is reported once.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from teller.callchain.breakdown import IdleGaps
from teller.callchain.engines import StepNumbering, step_base
from teller.callchain.per_rank import forest_of_events
from teller.callchain.split import FileSteps, forest_steps
from teller.callchain.steps import StepTable, number_engines
from teller.errors import TraceError
from teller.ingest import map_files
from teller.ingest.kineto import text_size_guess
from teller.ingest.kineto_windows import BUCKET_NS, SpilledTrace, read_window, spill_kineto
from teller.ingest.parallel import read_each

#: A trace file whose JSON text is larger than this is read in windows unless told otherwise
#: (`too_large`): a whole analysis peaks at about its text's size (docs/benchmarks.md).
WINDOWED_ABOVE_TEXT_BYTES = 1 << 30
#: Events a window reads, margins included, unless the caller says otherwise: about 1 GB at the
#: peak of an analysis (docs/benchmarks.md).
WINDOW_EVENTS = 1_500_000
#: A window's margin either side: this share of the time it owns, and at least `MIN_MARGIN_NS`,
#: longer than an engine step of a serving run; a step longer than its window's margin may be
#: cut where two windows meet, and the verdict says so (`read_windows`).
MARGIN_SHARE = 0.1
MIN_MARGIN_NS = 100_000_000
#: Where a window may end: the emptiest bucket in this last share of the time it could own.
CUT_SEARCH_SHARE = 0.25


@dataclass(frozen=True)
class TimeWindow:
    """One window: the steps it reports start in [own_start_ns, own_end_ns); the events it reads
    start in [read_start_ns, read_end_ns)."""

    index: int
    own_start_ns: int
    own_end_ns: int
    read_start_ns: int
    read_end_ns: int


def plan_windows(traces: list[SpilledTrace], events_per_window: int) -> list[TimeWindow]:
    """Windows over the run's time, each reading about `events_per_window` events of all its
    files together, cut where the run is quietest near that size."""
    counts: dict[int, int] = {}
    for trace in traces:
        for bucket, count in trace.events_of_bucket.items():
            counts[bucket] = counts.get(bucket, 0) + count
    if not counts:
        return []
    bucket = np.asarray(sorted(counts), dtype=np.int64)
    count = np.asarray([counts[b] for b in bucket.tolist()], dtype=np.int64)
    total = np.cumsum(count)
    own_events = max(int(events_per_window / (1 + 2 * MARGIN_SHARE)), 1)
    starts = [int(bucket[0]) * BUCKET_NS]
    first = 0  # index of the window's first bucket
    while True:
        before = int(total[first - 1]) if first else 0
        last = int(np.searchsorted(total, before + own_events, side="right"))
        if last >= len(bucket):
            break
        low = max(first + 1, last - max(int((last - first) * CUT_SEARCH_SHARE), 1))
        quietest = last - int(np.argmin(count[low : last + 1][::-1]))  # the latest of the least
        first = max(quietest, first + 1)
        starts.append(int(bucket[first]) * BUCKET_NS)
    ends = [*starts[1:], (int(bucket[-1]) + 1) * BUCKET_NS]
    windows = []
    for index, (start, end) in enumerate(zip(starts, ends, strict=True)):
        margin = max(MIN_MARGIN_NS, int((end - start) * MARGIN_SHARE))
        windows.append(TimeWindow(index, start, end, start - margin, end + margin))
    return windows


@dataclass(frozen=True)
class WindowFile:
    """One file's part of one window: a task of a window's first pass."""

    window: TimeWindow
    path: Path


def window_file_steps(
    task: WindowFile,
    traces: dict[Path, SpilledTrace],
    folder: Path,
    step_regex: str | None = None,
) -> FileSteps | None:
    """In a worker: one file's events of one window built into their forest, kept in the
    window's folder under `folder`, and their steps; None where the file has no event there."""
    window, path = task.window, task.path
    keep_in = folder / f"window-{window.index:05d}"
    events = read_window(traces[path], window.read_start_ns, window.read_end_ns)
    if events is None:
        return None
    return forest_steps(forest_of_events(path, events), step_regex, keep_in)


@dataclass
class WindowSteps:
    """What the first pass over one window found: its files' steps and forests on disk."""

    window: TimeWindow
    files: list[FileSteps]
    engine_of_rank: dict[int, int]


def window_engines(files: list[FileSteps]) -> dict[int, int]:
    """Each rank's engine in one window, as the window's analysis will group them."""
    if not files:
        return {}
    steps = StepTable.joined([f.steps for f in files], 1)
    if not len(steps):
        return {int(r): 0 for f in files for r in np.unique(f.steps.rank).tolist()}
    number_engines(steps)
    return dict(zip(steps.rank.tolist(), steps.engine.tolist(), strict=True))


class Ledger:
    """Every window's steps counted, so that each window numbers its own as the whole run would
    and reports only the iterations it owns."""

    def __init__(self, passes: list[WindowSteps]) -> None:
        self.passes = passes
        #: per window: per rank, the run ordinal of its first step in the window
        self.first_of_rank: list[dict[int, int]] = []
        #: per window: per engine, the run ordinals of the iterations it owns, [low, high)
        self.owned: list[dict[int, tuple[int, int]]] = []
        counted: dict[int, int] = {}  # per rank: its steps that start before this window reads
        previous: dict[int, np.ndarray] = {}  # per rank: the last window's step starts
        for done in passes:
            starts = _starts_of_rank(done.files)
            first: dict[int, int] = {}
            for rank in starts:
                before = previous.get(rank)
                if before is not None:
                    counted[rank] += int(np.searchsorted(before, done.window.read_start_ns))
                else:
                    counted[rank] = 0
                first[rank] = counted[rank]
            for rank in starts:
                previous[rank] = starts[rank]
            self.first_of_rank.append(first)
            self.owned.append(self._owned(done, starts, first))
        most = max((hi for owned in self.owned for _, hi in owned.values()), default=0)
        self.base = step_base(most)

    @staticmethod
    def _owned(
        done: WindowSteps, starts: dict[int, np.ndarray], first: dict[int, int]
    ) -> dict[int, tuple[int, int]]:
        """Per engine, the iterations whose earliest rank starts them in the window's own time."""
        earliest: dict[int, dict[int, int]] = {}  # engine → ordinal → earliest start
        for rank, start in starts.items():
            engine = done.engine_of_rank.get(rank, 0)
            mine = earliest.setdefault(engine, {})
            for ordinal, ns in enumerate(start.tolist(), start=first[rank]):
                if ns < mine.get(ordinal, ns + 1):
                    mine[ordinal] = ns
        window = done.window
        owned = {}
        for engine, start_of in earliest.items():
            inside = [
                k for k, ns in start_of.items() if window.own_start_ns <= ns < window.own_end_ns
            ]
            owned[engine] = (min(inside), max(inside) + 1) if inside else (0, 0)
        return owned

    def owned_gaps(self, index: int, gaps: IdleGaps) -> IdleGaps:
        """The idle gaps window `index` reports: those of the steps it owns, and those outside
        every step that start in its own time."""
        window = self.passes[index].window
        in_own_time = (gaps.start_ns >= window.own_start_ns) & (gaps.start_ns < window.own_end_ns)
        keep = np.where(gaps.step >= 0, self.owns_each(index, gaps.step), in_own_time)
        rows = np.flatnonzero(keep).tolist()
        return IdleGaps(
            rank=gaps.rank[keep],
            step=gaps.step[keep],
            start_ns=gaps.start_ns[keep],
            dur_ns=gaps.dur_ns[keep],
            cause=[gaps.cause[i] for i in rows],
            host_call=[gaps.host_call[i] for i in rows],
            cpu_operator=[gaps.cpu_operator[i] for i in rows],
        )

    def owns_each(self, index: int, steps: np.ndarray) -> np.ndarray:
        """`owns` for an array of run step ids (-1: none)."""
        engine, ordinal = np.divmod(np.asarray(steps, dtype=np.int64), self.base)
        low = np.zeros(len(engine), dtype=np.int64)
        high = np.zeros(len(engine), dtype=np.int64)
        for e, (lo, hi) in self.owned[index].items():
            low[engine == e], high[engine == e] = lo, hi
        return (np.asarray(steps) >= 0) & (low <= ordinal) & (ordinal < high)

    def numbering(self, index: int) -> StepNumbering:
        return StepNumbering(self.base, tuple(sorted(self.first_of_rank[index].items())))

    def owns(self, index: int, step: int | None) -> bool:
        """Whether window `index` reports `step` (a run step id): its engine's iteration is
        one the window owns. A row outside every step (None) is owned by the window whose own
        time holds it, which the caller checks."""
        return step is not None and bool(self.owns_each(index, np.asarray([step]))[0])


def _starts_of_rank(files: list[FileSteps]) -> dict[int, np.ndarray]:
    """Per rank, its steps' start times in the window, in order."""
    starts: dict[int, list[np.ndarray]] = {}
    for f in files:
        table = f.steps
        for rank in np.unique(table.rank).tolist():
            starts.setdefault(int(rank), []).append(table.start_ns[table.rank == rank])
    return {r: np.sort(np.concatenate(parts)) for r, parts in starts.items()}


def can_window(path: Path) -> bool:
    """Only Kineto/Chrome JSON is read a window at a time (`kineto_windows`)."""
    name = path.name.lower()
    return name.endswith(".json") or name.endswith(".json.gz")


def too_large(path: Path) -> bool:
    """Whether a trace file's JSON text is likely larger than an analysis holds whole
    (`kineto.text_size_guess`)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            handle.seek(max(size - 4, 0))
            last_four = handle.read(4)
    except OSError:
        return False  # the read names the problem
    compressed = path.name.lower().endswith(".gz")
    return text_size_guess(size, last_four, compressed) > WINDOWED_ABOVE_TEXT_BYTES


@dataclass
class WindowRead:
    """A run's files spilled, its windows planned and each window's first pass done."""

    passes: list[WindowSteps]
    refused: list[TraceError]  # files that could not be read, left out
    notes: list[str]


def read_windows(
    paths: list[Path],
    folder: Path,
    events_per_window: int,
    step_regex: str | None = None,
    progress: bool = False,
    jobs: int = 1,
) -> WindowRead:
    """Every file read once into slices under `folder` (`spill_kineto`, in `jobs` processes),
    the windows planned, and each window's forests built, kept under `folder` and their steps
    found: everything a `Ledger` needs before any window is analysed."""
    spilled, refused = map_files(
        partial(spill_under, root=folder), paths, progress, jobs, others_read=False
    )
    windows = plan_windows(spilled, events_per_window)
    # what each window's workers are sent: the slices, not the counts the plan was made from
    traces = {t.path: replace(t, events_of_bucket={}) for t in spilled}
    del spilled
    for window in windows:
        (folder / f"window-{window.index:05d}").mkdir()
    # every (window, file) a task of its own: a single large file's windows fill the pool too
    tasks = [WindowFile(window, path) for window in windows for path in traces]
    build = partial(window_file_steps, traces=traces, folder=folder, step_regex=step_regex)
    results: Iterable[FileSteps | TraceError | None] = read_each(build, tasks, jobs)  # type: ignore[arg-type]
    if progress:
        from tqdm import tqdm

        results = tqdm(results, total=len(tasks), desc="windows (first pass)", unit="part")
    files_of: dict[int, list[FileSteps]] = {w.index: [] for w in windows}
    for task, result in zip(tasks, results, strict=True):
        if isinstance(result, TraceError):
            refused.append(result)
        elif result is not None:
            files_of[task.window.index].append(result)
    passes = [WindowSteps(w, files_of[w.index], window_engines(files_of[w.index])) for w in windows]
    notes = []
    longest = max((_longest_step(p) for p in passes), default=0)
    margin = min((w.own_start_ns - w.read_start_ns for w in windows), default=0)
    if longest > margin:
        notes.append(
            f"a step of {longest / 1e9:.1f} s is longer than the {margin / 1e9:.1f} s a window "
            "reads past its edges: a step that long may be cut where two windows meet"
        )
    return WindowRead(passes, refused, notes)


def _longest_step(done: WindowSteps) -> int:
    return max((int(f.steps.dur_ns.max()) for f in done.files if len(f.steps)), default=0)


def spill_under(path: Path, root: Path) -> SpilledTrace:
    """In a worker: `path` spilled into a folder of its own under `root`."""
    return spill_kineto(path, Path(tempfile.mkdtemp(prefix="slices-", dir=root)))
