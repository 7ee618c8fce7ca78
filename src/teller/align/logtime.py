"""Log records on the trace clock: exact where the log says so, bracketed by anchors where not.

vLLM prints times to the second, and a second holds dozens of steps, so a printed time alone
cannot say which step a line belongs to. Two facts can:

* *iteration lines are anchors*: each reports one step (its counter and elapsed time). The
  counter-to-step shift is found by matching the printed elapsed times against the traced step
  durations (no clock needed, so a time-zone or host offset does not matter), and the anchor then
  sits at its step's end on the trace clock. An exact line the counters cannot place anchors to
  the step that ended just before it, which assumes the log and trace share a clock;
* *file order is time order* within one process's console: a line printed between the anchors of
  steps a and b happened between their ends.

So each record gets an interval [lo_ns, hi_ns] on the trace clock: a point for exact times
(collector prefix, glog nanoseconds, shifted by the measured log offset) and anchors, the bracket
of its neighbouring anchors for lines in between (before a file's first anchor or after its last:
that side of it, within the printed second), else its printed second moved by the log clock
offset the anchors imply. `how` says which.

Each host keeps its own clock, so the log offset is measured per host (the line's `host`: Ray's
`ip=`, the caller's, or the `teller collect` manifest's), and per file where no host is known; a
file without anchors of its own takes the offset of all anchors together.

A run of several engines (`teller.callchain.engines`) has several step sequences: a line that
names its engine (vLLM's `EngineCore_1` or `EngineCore_DP1` process, `Engine 001:` stats) is
anchored to that engine's steps, its counter shift found among its engine's lines alone; so is
every line of a file whose engine lines all name one engine (one engine's console). Engines
are matched by position: the log's engine k is the k-th engine by lowest rank, which is how vLLM
lays out data-parallel ranks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from teller.align.clock import AnchorOffsets, estimate_anchor_offsets
from teller.callchain.steps import StepTable
from teller.callchain.tree import CallTree
from teller.ingest.logs.table import LogTable

NS_PER_S = 1_000_000_000
#: An exact iteration line further than this after the nearest step end is not that step's.
ANCHOR_GAP_NS = 50_000_000
#: Fewer elapsed-time matches than this and the counter shift is not trusted.
MIN_MATCHES = 5
#: Counter shifts scored one by one where there are fewer than this; beyond, only the
#: `SHIFT_CANDIDATES` whose elapsed times correlate best with the steps' (`_candidate_shifts`).
EXACT_SHIFTS = 4096
SHIFT_CANDIDATES = 32
#: A log line's engine: its process tag, else the engine its stats line names.
ENGINE_PROCESS = re.compile(r"EngineCore_(?:DP)?(\d+)")
ENGINE_STATS = re.compile(r"\bEngine (\d{3}):")
#: A log offset smaller than this is the engine's printing delay, not a clock difference: exact
#: times are then used as they are.
SAME_CLOCK_NS = 10_000_000
HOWS = ("exact", "anchor", "order", "second", "none")


@dataclass
class LogTimes:
    """Per log record (table order): where on the trace clock it happened, as an interval."""

    lo_ns: np.ndarray
    hi_ns: np.ndarray
    how: list[str]  # one of HOWS
    anchor_step: np.ndarray  # step ordinal an iteration line reports, -1 otherwise
    log_offset: AnchorOffsets | None
    warnings: list[str] = field(default_factory=list)
    #: the engine a line names, in a run of several (`record_engines`); -1: none or one engine
    engine: np.ndarray | None = None
    #: its printed second on the trace clock (the log offsets' bounds applied); -1: none printed
    second_lo_ns: np.ndarray | None = None
    second_hi_ns: np.ndarray | None = None

    @property
    def mid_ns(self) -> np.ndarray:
        return self.lo_ns + (self.hi_ns - self.lo_ns) // 2

    def within(self, start_ns: int, end_ns: int) -> np.ndarray:
        """Per record: whether it most likely lies in [start_ns, end_ns) (the middle of where
        it may lie: of its interval, narrowed by the second it printed), or has no time at all.
        Why the middle: a line placed only to its printed second may lie anywhere in it, and a
        window of a run (`teller.callchain.windows`) takes the lines its neighbours do not."""
        timeless = np.asarray([h == "none" for h in self.how], dtype=bool)
        lo, hi = self.lo_ns, self.hi_ns
        if self.second_lo_ns is not None and self.second_hi_ns is not None:
            # a line bracketed by file order (before its file's first anchor, say) is also
            # bounded by the second it printed
            printed = (
                (self.second_lo_ns >= 0) & (self.second_lo_ns <= hi) & (self.second_hi_ns >= lo)
            )
            lo = np.where(printed, np.maximum(lo, self.second_lo_ns), lo)
            hi = np.where(printed, np.minimum(hi, self.second_hi_ns), hi)
        middle = lo + (hi - lo) // 2
        return timeless | ((middle >= start_ns) & (middle < end_ns))

    def kept(self, keep: np.ndarray) -> LogTimes:
        """The records where `keep` is true, in order."""
        rows = np.flatnonzero(keep).tolist()
        return LogTimes(
            lo_ns=self.lo_ns[keep],
            hi_ns=self.hi_ns[keep],
            how=[self.how[i] for i in rows],
            anchor_step=self.anchor_step[keep],
            log_offset=self.log_offset,
            warnings=self.warnings,
            engine=None if self.engine is None else self.engine[keep],
            second_lo_ns=None if self.second_lo_ns is None else self.second_lo_ns[keep],
            second_hi_ns=None if self.second_hi_ns is None else self.second_hi_ns[keep],
        )


def place_log_times(tree: CallTree, logs: LogTable, reference_rank: int | None = None) -> LogTimes:
    """Intervals on the trace clock for every log record (see the module docstring)."""
    table = logs.table
    count = len(logs)
    ts = table.column("ts_ns").to_numpy()
    exact = table.column("ts_exact").to_numpy(zero_copy_only=False)
    events = table.column("event").to_pylist()
    counters = table.column("iteration_counter").to_pylist()
    elapsed_ns = table.column("iteration_elapsed_ns").to_pylist()
    files = table.column("file").to_pylist()
    clocks = [
        host or file for host, file in zip(table.column("host").to_pylist(), files, strict=True)
    ]
    steps = tree.steps
    warnings: list[str] = []
    if reference_rank is None:
        reference_rank = int(steps.rank.min()) if len(steps) else 0
    engine = record_engines(logs, tree)
    anchor_step = np.full(count, -1, dtype=np.int64)
    iteration = [i for i in range(count) if events[i] == "iteration" and ts[i] >= 0]
    ordinal_end: dict[int, int] = {}
    for group, group_reference in engine_groups(engine, tree, reference_rank):
        lines = [i for i in iteration if engine[i] == group]
        ends = _anchor_steps(
            steps, group_reference, lines, counters, elapsed_ns, ts, exact, anchor_step, warnings
        )
        ordinal_end.update(ends)

    log_offset = _log_offsets(ts, exact, anchor_step, ordinal_end, clocks)
    bounds = _offset_bounds(log_offset, ts, exact, anchor_step, ordinal_end)
    offset_lo = np.asarray([bounds.get(c, bounds[""])[0] for c in clocks], dtype=np.int64)
    offset_hi = np.asarray([bounds.get(c, bounds[""])[1] for c in clocks], dtype=np.int64)
    exact_shift = (offset_lo + offset_hi) // 2
    exact_shift[np.abs(exact_shift) < SAME_CLOCK_NS] = 0
    lo = np.full(count, -1, dtype=np.int64)
    hi = np.full(count, -1, dtype=np.int64)
    how = ["none"] * count
    for i in range(count):
        if anchor_step[i] >= 0:
            lo[i] = hi[i] = ordinal_end[int(anchor_step[i])]
            how[i] = "anchor"
        elif ts[i] >= 0 and exact[i]:
            lo[i] = hi[i] = ts[i] - exact_shift[i]
            how[i] = "exact"
    # the printed second on the trace clock: [second − highest offset, next second − lowest]
    second = ts - ts % NS_PER_S
    second_lo, second_hi = second - offset_hi, second + NS_PER_S - offset_lo
    _bracket_by_file_order(files, ts, exact, lo, hi, how, second_lo, second_hi)
    for i in range(count):
        if how[i] == "none" and ts[i] >= 0:
            lo[i], hi[i] = second_lo[i], second_hi[i]
            how[i] = "second"
    printed = ts >= 0
    return LogTimes(
        lo,
        hi,
        how,
        anchor_step,
        log_offset,
        warnings,
        engine,
        second_lo_ns=np.where(printed, second_lo, -1),
        second_hi_ns=np.where(printed, second_hi, -1),
    )


def record_engines(logs: LogTable, tree: CallTree) -> np.ndarray:
    """Per record, the engine of the tree its line names (see the module docstring); -1 where it
    names none, or the run has one engine."""
    engines = set(tree.steps.engine.tolist())
    if len(engines) <= 1:
        return np.full(len(logs), -1, dtype=np.int64)
    engine = named_engines(logs, engines)
    # a console whose engine lines all name one engine is that engine's: its API server's
    # request lines are that engine's requests
    files = np.asarray(logs.table.column("file").to_pylist(), dtype=object)
    for name in set(files.tolist()):
        here = files == name
        named = set(engine[here].tolist()) - {-1}
        if len(named) == 1:
            engine[here & (engine < 0)] = named.pop()
    return engine


def named_engines(logs: LogTable, engines: set[int]) -> np.ndarray:
    """Per record, the engine of `engines` its line names by its process tag or stats line; -1
    where it names none of them."""
    engine = np.full(len(logs), -1, dtype=np.int64)
    processes = logs.table.column("process").to_pylist()
    raws = logs.table.column("raw").to_pylist()
    for i, (process, raw) in enumerate(zip(processes, raws, strict=True)):
        found = ENGINE_PROCESS.search(process or "") or ENGINE_STATS.search(raw or "")
        if found and int(found.group(1)) in engines:
            engine[i] = int(found.group(1))
    return engine


def engine_reference(tree: CallTree, engine: int) -> int:
    """The lowest rank of `engine`: the rank its lines are placed on."""
    steps = tree.steps
    return int(steps.rank[steps.engine == engine].min())


def engine_groups(engine: np.ndarray, tree: CallTree, reference_rank: int) -> list[tuple[int, int]]:
    """(engine, the rank it is placed on) per group of lines, or of requests, placed together:
    -1 (those that name no engine) on `reference_rank`, then each engine named on its lowest
    rank."""
    named = sorted(set(engine.tolist()) - {-1})
    return [(-1, reference_rank)] + [(e, engine_reference(tree, e)) for e in named]


def _anchor_steps(
    steps: StepTable,
    reference_rank: int,
    lines: list[int],
    counters: list[int | None],
    elapsed_ns: list[int | None],
    ts: np.ndarray,
    exact: np.ndarray,
    anchor_step: np.ndarray,
    warnings: list[str],
) -> dict[int, int]:
    """Anchor the iteration `lines` on `reference_rank`'s steps (filling `anchor_step`); returns
    that rank's step ends by step id."""
    rows = np.flatnonzero(steps.rank == reference_rank)
    ordinal_end = dict(
        zip(steps.index[rows].tolist(), (steps.start_ns + steps.dur_ns)[rows].tolist(), strict=True)
    )
    ordinal_dur = dict(zip(steps.index[rows].tolist(), steps.dur_ns[rows].tolist(), strict=True))
    shift = _counter_shift(
        [counters[i] for i in lines], [elapsed_ns[i] for i in lines], ordinal_dur, warnings
    )
    if shift is not None:
        for i in lines:
            counter = counters[i]
            if counter is not None and counter + shift in ordinal_end:
                anchor_step[i] = counter + shift
    # exact lines the counters did not place: the step that ended just before (one clock assumed)
    ends_sorted = np.sort(np.asarray(list(ordinal_end.values()), dtype=np.int64))
    end_to_ordinal = {e: o for o, e in ordinal_end.items()}
    for i in lines:
        if anchor_step[i] >= 0 or not exact[i]:
            continue
        k = int(np.searchsorted(ends_sorted, ts[i], side="right")) - 1
        if k >= 0 and ts[i] - ends_sorted[k] <= ANCHOR_GAP_NS:
            anchor_step[i] = end_to_ordinal[int(ends_sorted[k])]
    return ordinal_end


def _bracket_by_file_order(
    files: list[str],
    ts: np.ndarray,
    exact: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    how: list[str],
    second_lo: np.ndarray,
    second_hi: np.ndarray,
) -> None:
    """Inexact lines between two placed lines of one file lie between their times; those before
    a file's first placed line (a backlog printed as the first step ran) or after its last lie
    on that side of it, within their printed second."""
    by_file: dict[str, list[int]] = {}
    for i, name in enumerate(files):
        by_file.setdefault(name, []).append(i)
    for indices in by_file.values():
        placed = [i for i in indices if how[i] in ("anchor", "exact")]
        if not placed:
            continue
        position = {i: k for k, i in enumerate(indices)}
        placed_positions = np.asarray([position[i] for i in placed])
        for k, i in enumerate(indices):
            if how[i] != "none" or ts[i] < 0 or exact[i]:
                continue
            after = int(np.searchsorted(placed_positions, k, side="right"))
            if after == 0:  # before the first placed line
                hi[i] = lo[placed[0]]
                lo[i] = min(int(second_lo[i]), int(hi[i]))
            elif after == len(placed):  # after the last
                lo[i] = hi[placed[-1]]
                hi[i] = max(int(second_hi[i]), int(lo[i]))
            else:
                before_i, after_i = placed[after - 1], placed[after]
                lo[i], hi[i] = lo[before_i], max(hi[after_i], lo[before_i])
            how[i] = "order"


def _counter_shift(
    line_counters: list[int | None],
    line_elapsed_ns: list[int | None],
    ordinal_dur: dict[int, int],
    warnings: list[str],
) -> int | None:
    """Step ordinal minus iteration counter, from printed elapsed times vs traced durations
    (one entry per iteration line: its counter and elapsed time, None where it prints none)."""
    counters, elapsed = [], []
    for counter, ns in zip(line_counters, line_elapsed_ns, strict=True):
        if counter is not None and ns is not None and ns > 0:
            counters.append(counter)
            elapsed.append(float(ns))
    if len(counters) < MIN_MATCHES or not ordinal_dur:
        return None
    counter = np.asarray(counters, dtype=np.int64)
    log_elapsed = np.log(np.asarray(elapsed))
    ordinals = np.asarray(sorted(ordinal_dur), dtype=np.int64)
    durations = np.asarray([max(ordinal_dur[o], 1) for o in ordinals.tolist()], dtype=np.float64)
    # half of the smaller side: logs often run longer than the capture (or its window)
    least = max(MIN_MATCHES, min(len(counter), len(ordinals)) // 2)
    best: tuple[float, int] | None = None
    for shift in _candidate_shifts(counter, log_elapsed, ordinals, np.log(durations), least):
        target = counter + shift
        pos = np.searchsorted(ordinals, target)
        hit = (pos < len(ordinals)) & (ordinals[np.minimum(pos, len(ordinals) - 1)] == target)
        if int(hit.sum()) < least:
            continue
        error = float(np.median(np.abs(log_elapsed[hit] - np.log(durations[pos[hit]]))))
        if best is None or error < best[0]:
            best = (error, shift)
    if best is None:
        warnings.append("iteration lines do not line up with the traced steps")
        return None
    if best[0] > 0.2:
        warnings.append(
            f"iteration lines' elapsed times differ from step durations by "
            f"{100 * (np.exp(best[0]) - 1):.0f}% (median): step matching is doubtful"
        )
    return best[1]


def _candidate_shifts(
    counter: np.ndarray,
    log_elapsed: np.ndarray,
    ordinals: np.ndarray,
    log_durations: np.ndarray,
    least: int,
) -> list[int]:
    """The shifts worth scoring exactly: every one, where the counters and ordinals span few
    (`EXACT_SHIFTS`); else those where at least `least` lines meet a step, the `SHIFT_CANDIDATES`
    whose lines' elapsed times correlate best with the steps' durations (both as deviations
    from their own mean, summed per shift by FFT: a log of 10⁵ iterations against a capture, or
    a window of it, of 10³ steps would otherwise take 10⁵ medians over 10³ lines)."""
    low = int(ordinals.min() - counter.max())
    high = int(ordinals.max() - counter.min())
    if high - low < EXACT_SHIFTS:
        return list(range(low, high + 1))
    line_at = np.zeros(int(counter.max() - counter.min()) + 1)
    step_at = np.zeros(int(ordinals.max() - ordinals.min()) + 1)
    line_on = np.zeros_like(line_at)
    step_on = np.zeros_like(step_at)
    np.add.at(line_at, counter - counter.min(), log_elapsed - log_elapsed.mean())
    np.add.at(line_on, counter - counter.min(), 1.0)
    step_at[ordinals - ordinals.min()] = log_durations - log_durations.mean()
    step_on[ordinals - ordinals.min()] = 1.0
    size = 1 << int(len(line_at) + len(step_at)).bit_length()

    def correlated(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        # per shift k (ordinal - counter = low + k): the sum over lines of a[line] b[line + shift]
        full = np.fft.irfft(np.fft.rfft(a[::-1], size) * np.fft.rfft(b, size), size)
        return full[: len(a) + len(b) - 1]

    product = correlated(line_at, step_at)
    meeting = np.rint(correlated(line_on, step_on))
    shift_of = np.arange(len(product)) + low
    enough = np.flatnonzero(meeting >= least)
    if not len(enough):
        return []
    score = product[enough] / meeting[enough]
    best = enough[np.argsort(-score, kind="stable")[:SHIFT_CANDIDATES]]
    return sorted(int(shift_of[k]) for k in best)


def _log_offsets(
    ts: np.ndarray,
    exact: np.ndarray,
    anchor_step: np.ndarray,
    ordinal_end: dict[int, int],
    clocks: list[str],
) -> AnchorOffsets | None:
    """Log clock minus trace clock per clock (host, else file), from its anchored lines."""
    anchored = np.flatnonzero(anchor_step >= 0)
    if len(anchored) == 0:
        return None
    ends = np.asarray([ordinal_end[int(anchor_step[i])] for i in anchored], dtype=np.int64)
    anchored_clocks = np.asarray([clocks[i] for i in anchored.tolist()], dtype=object)
    names = sorted(set(anchored_clocks.tolist()))
    rows = []
    for name in names:
        mask = anchored_clocks == name
        rows.append(_log_offset(ts[anchored[mask]], exact[anchored[mask]], ends[mask]))
    return AnchorOffsets(
        key=names,
        offset_ns=np.asarray([r[0] for r in rows], dtype=np.int64),
        residual_ns=np.asarray([r[1] for r in rows], dtype=np.int64),
        anchors=np.asarray([r[2] for r in rows], dtype=np.int64),
    )


def _log_offset(line_ts: np.ndarray, exact: np.ndarray, ends: np.ndarray) -> tuple[int, int, int]:
    """(offset, residual, anchors) of one log clock from its anchors' times and step ends.

    Exact lines give (time − step end) directly. Whole-second lines give an interval each (the
    printed second contains the end plus the offset), and their intersection bounds the offset
    to far below a second once there are many anchors.
    """
    if exact.any():
        got = estimate_anchor_offsets(["log"] * int(exact.sum()), line_ts[exact], ends[exact])
        return int(got.offset_ns[0]), int(got.residual_ns[0]), int(got.anchors[0])
    seconds = line_ts - line_ts % NS_PER_S
    lower, upper = seconds - ends, seconds + NS_PER_S - ends
    low, high = int(np.percentile(lower, 95)), int(np.percentile(upper, 5))
    if low > high:
        low, high = high, low
    return (low + high) // 2, (high - low) // 2, len(line_ts)


def _offset_bounds(
    offsets: AnchorOffsets | None,
    ts: np.ndarray,
    exact: np.ndarray,
    anchor_step: np.ndarray,
    ordinal_end: dict[int, int],
) -> dict[str, tuple[int, int]]:
    """Clock → (lowest, highest) offset; "" for clocks without anchors: all anchors together."""
    if offsets is None:
        return {"": (0, 0)}
    bounds = {
        key: (int(middle) - int(half), int(middle) + int(half))
        for key, middle, half in zip(
            offsets.key, offsets.offset_ns, offsets.residual_ns, strict=True
        )
    }
    if len(offsets.key) == 1:
        bounds[""] = bounds[offsets.key[0]]
    else:
        anchored = np.flatnonzero(anchor_step >= 0)
        ends = np.asarray([ordinal_end[int(anchor_step[i])] for i in anchored], dtype=np.int64)
        middle, half, _ = _log_offset(ts[anchored], exact[anchored], ends)
        bounds[""] = (middle - half, middle + half)
    return bounds
