"""Read one log file into records: prefixes, per-line parsers, multi-line records, one wall clock.

Each line goes through the same steps: the `teller collect` time prefix (exact UTC, gives the
year), ANSI colour codes, the vLLM process prefix `(Name pid=N)`, then the first engine parser that
recognises the line's header (chosen by its first character), else the generic header and template
mining. A traceback (with the lines of its chained exceptions) and indented continuation lines fold
into the record they belong to.

Printed times without a year take it from, in order: the `year` argument, the collector prefix or a
dated line earlier in the file, the file's modification time (counted in a warning). Times without
a sub-second part are spread over their second in file order (`ts_exact` false), and lines that
print no time at all (uvicorn, TensorRT-LLM) carry the previous record's time over. Nothing is
dropped: undecodable bytes, unknown and out-of-order lines are kept and counted.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from teller.errors import TraceError
from teller.ingest.files import guard_reader
from teller.ingest.logs import detect, templates, vllm
from teller.ingest.logs.line import parse_line
from teller.ingest.logs.table import LogColumns, LogRecord, LogSource

NS = 1_000_000_000
#: Times at or past this do not fit int64 ns (2262-04-11): such a line counts as an impossible date.
_MAX_UNIX_NS = 2**63 - 1
#: Longest line kept whole; the rest of a longer line is dropped (counted), so a file without
#: newlines (a stream of zeros) never becomes one huge string.
MAX_LINE_BYTES = 1 << 20
#: Largest log read (after gunzip), and the expansion past which a gzip log is refused.
MAX_LOG_BYTES = 16 << 30
MAX_GZIP_RATIO = 200
_RATIO_FLOOR_BYTES = 64 << 20
_DAY_S = 86_400
#: A month-day that falls this far before the previous one is the next year (Dec 31 → Jan 1).
_YEAR_ROLLOVER_DAYS = 180
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_COLLECTOR_FILE = re.compile(r"^rank(?P<rank>\d+)\.log")
_TRACEBACK_START = "Traceback (most recent call last):"
_TRACEBACK_LINKS = (
    "Traceback (most recent call last):",
    "During handling of the above exception",
    "The above exception was the direct cause",
)
_EXCEPTION_LINE = re.compile(r"^(?P<type>(?:[a-z_]\w*\.)*[A-Z]\w*)(?:: ?(?P<text>.*))?$", re.DOTALL)
_EXCEPTION_SUFFIXES = ("Error", "Exception", "Interrupt", "Exit", "Warning", "Iteration")
#: Traceback states: inside the frames, after the exception line, between chained exceptions.
_TB_FRAMES, _TB_RAISED, _TB_CHAINING = 1, 2, 3
ENGINE_FORMATS = frozenset({"vllm", "sglang", "trtllm", "pytorch"})


@dataclass
class ReadFile:
    """One file's records as columns, with their final times (templates still to resolve)."""

    columns: LogColumns
    ts_ns: np.ndarray
    exact: np.ndarray

    def table(self, templates: list[str], file: str) -> pa.Table:
        return self.columns.finish(templates, self.ts_ns, self.exact, file)


class WallClock:
    """Turns printed (year?, month?, day?, second-of-day, fraction?) times into unix seconds."""

    def __init__(self, year: int | None, fallback: date) -> None:
        self.year = year
        self.fallback = fallback
        self.current: date | None = None  # date of the last resolved time
        self.last_second_of_day = 0
        self.inferred: Counter[str] = Counter()
        self._days: dict[tuple[int, int, int], int] = {}
        self._last_printed: tuple = (None, None, None)
        self._last_days = 0

    def observe_exact(self, unix_ns: int) -> None:
        """An exact time (collector prefix) fixes the date context for the lines after it."""
        moment = datetime.fromtimestamp(unix_ns // NS, UTC)
        self.current = moment.date()
        self._last_printed = (None, None, None)
        self.last_second_of_day = moment.hour * 3600 + moment.minute * 60 + moment.second

    def seconds(self, clock: tuple) -> int:
        """Unix seconds of a printed time; ValueError for an impossible date or time of day."""
        year, month, day, second_of_day, _ = clock
        if second_of_day is None:
            raise ValueError("time of day out of range")
        if month is not None and (year, month, day) == self._last_printed:
            # same printed date as the line before (nearly every line): no context to update
            self.last_second_of_day = second_of_day
            return self._last_days * _DAY_S + second_of_day
        printed = (year, month, day)
        if month is None:
            if self.current is None:
                self.inferred["date_from_file_mtime"] += 1
                self.current = self.fallback
            elif second_of_day < self.last_second_of_day - _DAY_S // 2:
                self.current = date.fromordinal(self.current.toordinal() + 1)
            year, month, day = self.current.year, self.current.month, self.current.day
        elif year is None:
            year = self._year_for(month, day)
        key = (year, month, day)
        days = self._days.get(key)
        if days is None:
            days = date(year, month, day).toordinal() - _EPOCH_ORDINAL
            self._days[key] = days
        self.current = date.fromordinal(days + _EPOCH_ORDINAL)
        if printed[1] is not None:
            self._last_printed, self._last_days = printed, days
        self.last_second_of_day = second_of_day
        return days * _DAY_S + second_of_day

    def _year_for(self, month: int, day: int) -> int:
        """The given year for the first date, then the running year (rolling over at New Year)."""
        if self.current is None:
            if self.year is not None:
                return self.year
            self.inferred["year_from_file_mtime"] += 1
            return self.fallback.year
        year = self.current.year
        gap = (date(year, month, day) - self.current).days if _valid(year, month, day) else 0
        if gap < -_YEAR_ROLLOVER_DAYS:
            year += 1  # Dec 31 → Jan 1
        elif gap > _YEAR_ROLLOVER_DAYS:
            year -= 1  # a late Dec 31 line after Jan 1
        return year


_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def _valid(year: int, month: int, day: int) -> bool:
    try:
        date(year, month, day)
    except ValueError:
        return False
    return True


class _FileReader:
    """State of one pass over one file: the pending record, its traceback, the clock, counters."""

    def __init__(
        self, path: Path, miner: templates.Templates, clock: WallClock, rank: int, host: str
    ):
        self.path = path
        self.miner = miner
        self.clock = clock
        self.rank = rank
        self.host = host
        self.columns = LogColumns()
        self.counts: Counter[str] = Counter()
        self.pending: LogRecord | None = None
        self.pending_lines: list[str] = []
        self.traceback_state = 0  # 0: not in a traceback, else one of _TB_*

    def feed(self, text: str, line: int, exact_ns: int) -> None:
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        process = ("", -1, -1, "")
        if text.startswith("(") and (prefix := vllm.PROCESS_PREFIX.match(text)):
            process = vllm.process_fields(prefix)
            body = text[prefix.end() :]
        else:
            body = text
        record = parse_line(body, line)
        if self.pending is not None and self._continues(record, body, process):
            self.pending_lines.append(text)
            return
        self.flush()
        record.raw = text
        record.process = record.process or process[0]
        record.pid = process[1]
        record.host = process[3] or self.host
        if record.rank < 0:
            record.rank = process[2] if process[2] >= 0 else self.rank
        if exact_ns >= 0:
            record.ts_ns, record.ts_exact = exact_ns, True
        elif record.clock is not None:
            self._resolve_clock(record)
        if record.message.startswith(_TRACEBACK_START) or body.startswith(_TRACEBACK_START):
            record.event = "traceback"
            if record.format == "unparsed":
                record.format = "python"
            self.traceback_state = _TB_FRAMES
        self.pending = record
        self.pending_lines = [text]

    def _continues(self, record: LogRecord, body: str, process: tuple) -> bool:
        """Whether this line belongs to the pending record (traceback or indented continuation)."""
        pending = self.pending
        assert pending is not None
        headed = record.format not in ("unparsed", "python")
        if (headed or process[1] >= 0) and process[1] != pending.pid:
            return False  # another process's line (or a new header): interleaved, not ours
        text = record.message if record.format in ENGINE_FORMATS else body
        if self.traceback_state:
            return self._continues_traceback(text)
        return not headed and body[:1] in (" ", "\t") and bool(body.strip())

    def _continues_traceback(self, text: str) -> bool:
        """Frames, the exception line, then only the links of a chained exception continue it."""
        state = self.traceback_state
        if state == _TB_FRAMES:
            if text[:1].isspace():
                return True
            if is_exception_line(text):
                self.traceback_state = _TB_RAISED
                return True
            return not text.strip()
        if not text.strip() or text.startswith(_TRACEBACK_LINKS[1:]):
            self.traceback_state = _TB_CHAINING
            return True
        if state == _TB_CHAINING and text.startswith(_TRACEBACK_START):
            self.traceback_state = _TB_FRAMES
            return True
        return False

    def _resolve_clock(self, record: LogRecord) -> None:
        try:
            seconds = self.clock.seconds(record.clock)  # type: ignore[arg-type]
        except (ValueError, OverflowError):  # no such date, or past year 9999
            self.counts["impossible_dates"] += 1
            return
        fraction = record.clock[4]  # type: ignore[index]
        ts_ns = seconds * NS + (fraction or 0)
        if not 0 <= ts_ns <= _MAX_UNIX_NS:
            self.counts["impossible_dates"] += 1
            return
        record.ts_ns, record.ts_exact = ts_ns, fraction is not None

    def flush(self) -> None:
        record = self.pending
        if record is None:
            return
        if len(self.pending_lines) > 1:
            record.raw = "\n".join(self.pending_lines)
            self.counts["continuation_lines"] += len(self.pending_lines) - 1
        if self.traceback_state:
            _describe_traceback(record, self.pending_lines)
        if not record.template:
            record.cluster, record.template_key = self.miner.add(record.message)
            self.counts["template_mined"] += 1
        self.counts[f"format_{record.format}"] += 1
        if record.fields:
            record.fields_json = orjson.dumps(record.fields).decode()
        self.columns.add(record)
        self.pending = None
        self.traceback_state = 0


def is_exception_line(text: str) -> bool:
    """`ValueError: bad`, `torch.OutOfMemoryError: …`, `KeyboardInterrupt`: a traceback's last line."""
    match = _EXCEPTION_LINE.match(text)
    if match is None:
        return False
    name = match.group("type")
    return match.group("text") is not None or name.endswith(_EXCEPTION_SUFFIXES)


def _describe_traceback(record: LogRecord, lines: list[str]) -> None:
    record.event = "traceback"
    for line in reversed(lines):
        body = line
        if prefix := vllm.PROCESS_PREFIX.match(line):
            body = line[prefix.end() :]
        parsed = parse_line(body, 0)
        text = parsed.message if parsed.format in ENGINE_FORMATS else body
        if is_exception_line(text):
            match = _EXCEPTION_LINE.match(text)
            assert match is not None
            record.template = f"traceback {match.group('type')}"
            record.fields = {
                "exception": match.group("type"),
                "error": match.group("text") or "",
                "lines": len(lines),
            }
            return
    record.template = "traceback <unknown>"
    record.fields = {"lines": len(lines)}


def read_file(
    path: Path, miner: templates.Templates, year: int | None = None, host: str = ""
) -> tuple[ReadFile, LogSource]:
    """Records of one log file in file order, with resolved times, plus what was counted."""
    with guard_reader(path, "a text log (UTF-8 lines, plain or gzip)"):
        return _read_file(path, miner, year, host)


def _read_file(
    path: Path, miner: templates.Templates, year: int | None, host: str
) -> tuple[ReadFile, LogSource]:
    try:
        modified = datetime.fromtimestamp(path.stat().st_mtime, UTC).date()
        handle = detect.open_log(path)
    except OSError as error:
        raise TraceError(path, f"cannot read log file: {error.strerror or error}") from error
    collector_rank = _COLLECTOR_FILE.match(path.name)
    rank = int(collector_rank.group("rank")) if collector_rank else -1
    reader = _FileReader(path, miner, WallClock(year, modified), rank, host)
    source = LogSource(path=str(path), format="", host=host, rank=rank)
    head: list[str] = []
    invalid_utf8 = prefixless = number = 0
    lines = _BoundedLines(path, handle)
    try:
        with handle:
            first_lines = [lines.readline() for _ in range(detect.SNIFF_LINES)]
            prefixed = detect.has_collector_prefix(first_lines)
            source.collector_prefix = prefixed
            for raw in _chain(first_lines, lines):
                number += 1
                exact_ns = -1
                if prefixed:
                    if detect.COLLECTOR_PREFIX.match(raw):
                        exact_ns = _collector_ns(raw)
                        if exact_ns >= 0:
                            reader.clock.observe_exact(exact_ns)
                        else:
                            reader.counts["impossible_dates"] += 1
                        raw = raw[28:]
                    else:
                        prefixless += 1
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    text = raw.decode("utf-8", "replace")
                    invalid_utf8 += 1
                text = text.rstrip("\r\n")
                if len(head) < detect.SNIFF_LINES:
                    head.append(text)
                reader.feed(text, number, exact_ns)
            reader.flush()
    except (OSError, EOFError, zlib.error) as error:
        raise TraceError(
            path, f"cannot read log file (corrupt gzip?): {error}", f"line {number + 1}"
        ) from None
    source.lines = number
    columns = reader.columns
    source.records = len(columns)
    source.format = detect.detect_format(head)
    ts_ns = (
        np.frombuffer(columns.ts_ns, dtype=np.int64).copy()
        if len(columns)
        else np.zeros(0, np.int64)
    )
    exact = np.frombuffer(columns.exact, dtype=bool).copy() if len(columns) else np.zeros(0, bool)
    ts_ns, exact = _finish_times(ts_ns, exact, source)
    counts = reader.counts + reader.clock.inferred + Counter(source.counts)
    if lines.cut:
        counts["lines_cut"] = lines.cut
        source.warnings.append(f"{lines.cut} lines longer than {MAX_LINE_BYTES} bytes were cut")
    if invalid_utf8:
        counts["invalid_utf8_lines"] = invalid_utf8
        source.warnings.append(f"{invalid_utf8} lines had invalid UTF-8 (replaced with U+FFFD)")
    if prefixless:
        counts["lines_without_collector_prefix"] = prefixless
        source.warnings.append(f"{prefixless} lines lacked the collector time prefix")
    if counts["format_unparsed"]:
        source.warnings.append(
            f"{counts['format_unparsed']} records matched no known line shape "
            "(kept, with a mined template)"
        )
    if counts["impossible_dates"]:
        source.warnings.append(
            f"{counts['impossible_dates']} lines printed an impossible date or time (kept, "
            "with the time of the line before)"
        )
    for what, note in (
        ("year_from_file_mtime", "year"),
        ("date_from_file_mtime", "date"),
    ):
        if counts[what]:
            source.warnings.append(
                f"the log prints no {note}: took {modified.year if note == 'year' else modified} "
                f"from the file's modification time (pass year= or use `teller collect`)"
            )
    source.counts = dict(sorted(counts.items()))
    return ReadFile(columns, ts_ns, exact), source


def _chain(first: list[bytes], rest: Iterator[bytes]) -> Iterator[bytes]:
    for line in first:
        if line:
            yield line
    yield from rest


class _BoundedLines:
    """Lines of a (possibly gzip) log, each at most MAX_LINE_BYTES, in bounded memory: a gzip
    stream that inflates absurdly or a log past MAX_LOG_BYTES is refused while it is read."""

    def __init__(self, path: Path, handle) -> None:
        self.path = path
        self.handle = handle
        self.compressed = isinstance(handle, gzip.GzipFile)
        self.file_bytes = max(path.stat().st_size, 1)
        self.read = 0
        self.cut = 0

    def readline(self) -> bytes:
        line = self.handle.readline(MAX_LINE_BYTES)
        if len(line) == MAX_LINE_BYTES and not line.endswith(b"\n"):
            self.cut += 1
            while (rest := self.handle.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                self._count(len(rest))
            self._count(len(rest))
            line += b"\n"
        self._count(len(line))
        return line

    def _count(self, size: int) -> None:
        self.read += size
        if self.read > MAX_LOG_BYTES:
            raise TraceError(
                self.path, f"larger than the {MAX_LOG_BYTES} bytes teller reads per log"
            )
        if (
            self.compressed
            and self.read > _RATIO_FLOOR_BYTES
            and self.read > MAX_GZIP_RATIO * self.file_bytes
        ):
            raise TraceError(
                self.path,
                f"gzip log inflates more than {MAX_GZIP_RATIO}x its {self.file_bytes} bytes: "
                "not a log (a gzip bomb?)",
            )

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line


_COLLECTOR_DAYS: dict[bytes, int] = {}


def _collector_ns(raw: bytes) -> int:
    """Unix ns of `YYYY-MM-DDTHH:MM:SS.ffffffZ` without strptime (this runs once per line)."""
    day_key = raw[:10]
    days = _COLLECTOR_DAYS.get(day_key)
    if days is None:
        try:
            days = date(int(raw[0:4]), int(raw[5:7]), int(raw[8:10])).toordinal() - _EPOCH_ORDINAL
        except ValueError:  # year 0, month 13
            days = -1 << 40
        _COLLECTOR_DAYS[day_key] = days
    seconds = days * _DAY_S + int(raw[11:13]) * 3600 + int(raw[14:16]) * 60 + int(raw[17:19])
    unix_ns = seconds * NS + int(raw[20:26]) * 1000
    return unix_ns if 0 <= unix_ns <= _MAX_UNIX_NS else -1


def _finish_times(
    ts: np.ndarray, exact: np.ndarray, source: LogSource
) -> tuple[np.ndarray, np.ndarray]:
    """Carry times over to lines that print none, spread whole seconds, count disorder."""
    count = len(ts)
    if count == 0:
        return ts, exact
    given = ts >= 0
    if not given.any():
        source.warnings.append("no line carries a time: ts_ns is -1 (order by `line`)")
        return ts, exact
    second_resolution = given & ~exact
    # forward-fill the last given time (and whether it was whole-second), back-fill the head
    last = np.maximum.accumulate(np.where(given, np.arange(count), -1))
    last[last < 0] = int(np.argmax(given))
    carried = ~given
    ts = ts[last]
    spread = second_resolution[last]
    # whole-second times: the k-th of n lines printed in one second sits at (k+1)/(n+1) of it
    rows = np.flatnonzero(spread)
    if len(rows):
        order = rows[np.argsort(ts[rows], kind="stable")]
        seconds = ts[order]
        starts = np.r_[0, np.flatnonzero(np.diff(seconds)) + 1]
        sizes = np.diff(np.r_[starts, len(order)])
        ordinal = np.arange(len(order)) - np.repeat(starts, sizes)
        ts[order] = seconds + (ordinal + 1) * NS // (np.repeat(sizes, sizes) + 1)
    exact = exact & ~carried
    backwards = int(np.count_nonzero(np.diff(ts) < 0))
    if carried.any():
        source.counts["time_carried_over"] = int(carried.sum())
    if backwards:
        source.counts["out_of_order"] = backwards
        source.warnings.append(
            f"{backwards} records are earlier than the record before them "
            "(interleaved processes or clock steps); kept in file order"
        )
    return ts, exact
