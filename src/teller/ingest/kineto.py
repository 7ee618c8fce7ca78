"""Reader for PyTorch-profiler / Kineto Chrome-trace JSON (`.json`, `.json.gz`, bare event lists).

This is what vLLM, SGLang, TensorRT-LLM and Hugging Face write when their profiler is on, so it is
the format users have most. Kineto has changed over the years and the reader accepts every shape
seen in real files: modern categories and the legacy aliases (`Kernel`, `Runtime`, `async_gpu`
flows, lower-case `external id`), ROCm `hip*` runtimes, `displayTimeUnit: "ns"` files whose
sub-microsecond digits do not survive a float, integers beyond int64, raw control characters in
strings, string pids, and `baseTimeNanoseconds` offsets. Anything it cannot place is counted in
`SourceInfo.skipped` and named in a warning; nothing is dropped silently.
"""

from __future__ import annotations

import io
import json
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np
import orjson
import pyarrow as pa
from isal import isal_zlib

from teller.errors import TraceError
from teller.ingest.comm_names import collective_kind, is_comm_cpu_op, is_comm_kernel
from teller.ingest.files import guard_reader, read_bytes
from teller.ingest.schema import LAYER_CODE, EventTable, SourceInfo, build_table, string_array

#: Kineto category → layer. Legacy (pre-2021) names map to the same layers as today's.
CATEGORY_LAYER: dict[str, str] = {
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "Operator": "cpu_op",
    "user_annotation": "engine",
    "gpu_user_annotation": "engine",
    "python_function": "python",
    "cuda_runtime": "runtime",
    "Runtime": "runtime",
    "cuda_driver": "runtime",
    "xpu_runtime": "runtime",
    "privateuse1_runtime": "runtime",
    "privateuse1_driver": "runtime",
    "kernel": "kernel",
    "Kernel": "kernel",
    "cuda_profiler_range": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "cuda_sync": "sync",
    "Trace": "profiler",
    "overhead": "profiler",
    "Overhead": "profiler",
    "cpu_instant_event": "instant",
}
#: Categories recorded on a GPU stream: pid is the device and tid the stream.
GPU_CATEGORIES = frozenset(
    {
        "kernel",
        "Kernel",
        "cuda_profiler_range",
        "gpu_memcpy",
        "Memcpy",
        "gpu_memset",
        "Memset",
        "cuda_sync",
        "gpu_user_annotation",
    }
)
#: Flow categories that tie a runtime call to the GPU activity it launched.
LAUNCH_FLOW_CATEGORIES = frozenset({"ac2g", "async_gpu", "async_cpu_to_gpu"})
_DTYPE_BYTES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Int": 4,
    "Long": 8,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
}
#: Element sizes by the C++ type names of an operator's "Input type" arg: a host-side collective
#: without NCCL's "In msg nelems" (gloo, or an older PyTorch) still records its tensor this way.
_INPUT_TYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "int": 4,
    "long int": 8,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
}
_RANK_IN_FILE_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_MERGED_RANK_PROCESS = re.compile(r"rank (\d+)")
_FIRST_CONTENT = re.compile(rb"\s*\S")
_RAW_TS = re.compile(rb'"ts"\s*:\s*(-?\d+)(?:\.(\d+))?')
_RAW_TS_FRACTION = re.compile(rb'"ts"\s*:\s*-?\d+\.\d*[1-9]')
_INT64_MAX = 2**63 - 1
#: Microsecond times and durations beyond this do not fit int64 nanoseconds once a base time is
#: added (about 146 years): such an event is skipped and counted, not wrapped to a negative value.
_MAX_US = 4.6e15
#: Nesting deeper than this is not a trace (Kineto's deepest is args holding lists of shapes).
MAX_JSON_DEPTH = 256
#: Largest trace (JSON, after gunzip) read: beyond it the file is refused before memory runs out.
MAX_TRACE_BYTES = 8 << 30
#: Inflated text above this is decoded a slice of events at a time (`_read_in_slices`): below it
#: the whole document's objects are small, and the cut scan would only add its compile to a first
#: read.
SLICED_ABOVE_BYTES = 32 << 20
#: About how much text each slice holds (some 30k events).
_SLICE_BYTES = 8 << 20
#: How much text a sliced read takes in at a time: the window it keeps is about a slice and a
#: piece, and each slice cut off copies what is left of the last piece.
_PIECE_BYTES = 2 << 20
#: A gzip file's text is at least this many times its size (traces compress 5-30x).
_GZIP_LEAST_RATIO = 4
#: How far back a search for a slice's end starts again once more text has arrived: a `},{`
#: may straddle two pieces.
_BOUNDARY_SPAN = 64
#: A `},{` between two events, its comma the group: where a slice may end.
_BETWEEN_EVENTS = re.compile(rb"\}\s*(,)\s*\{")
#: Candidate ends of one slice tried before the document is read whole instead.
_CUT_TRIES = 4
#: A gzip stream inflating more than this many times its size, past `_RATIO_FLOOR_BYTES`, is
#: refused: real traces compress 5-30x, a stream of zeros 1000x.
MAX_GZIP_RATIO = 200
_RATIO_FLOOR_BYTES = 64 << 20
_INFLATE_CHUNK = 16 << 20
_INFLATE_INPUT = 1 << 20
#: Stream id for GPU activity that names no single stream (device-wide synchronisation).
_ALL_STREAMS = 2**31 - 1
#: Traces whose microsecond timestamps exceed this have lost sub-ns digits in a float64.
_FLOAT_EXACT_US = 2.0e12
#: Microsecond timestamps above this are unix epoch (after 2001), not a trace-relative clock.
_EPOCH_US = 1.0e15


class _Event(msgspec.Struct):
    """The fields of a Chrome-trace event the reader uses; `args` stays raw until needed."""

    ph: str = ""
    cat: str = ""
    name: Any = ""
    pid: Any = -1
    tid: Any = -1
    ts: Any = None
    dur: Any = 0
    id: Any = None
    bp: str = ""
    args: msgspec.Raw = msgspec.Raw(b"")


class _Document(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None
    host_name: Any = None


class _LiftedArgs(msgspec.Struct):
    """Arguments that become columns; anything else stays in the raw `args` JSON."""

    correlation: Any = -1
    stream: Any = -1
    device: Any = -1
    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_legacy: Any = msgspec.field(default=-1, name="external id")
    bytes: Any = -1


_NO_ARGS = _LiftedArgs()
_DOCUMENT = msgspec.json.Decoder(_Document)
_EVENT_LIST = msgspec.json.Decoder(list[_Event])
_LIFTED = msgspec.json.Decoder(_LiftedArgs)
_ANY = msgspec.json.Decoder()


def read(path: str | Path, rank: int | None = None) -> EventTable:
    """Read one Kineto trace file into an event table.

    `rank` overrides what the file says (for callers that know better, e.g. the collector).
    Raises TraceError for a missing, empty, truncated, non-JSON or wrong-schema file.
    """
    path = Path(path)
    with guard_reader(path, "a Kineto/Chrome trace (JSON)"):
        notes: list[str] = []
        raw = _load_file(path)
        compressed = raw[:2] == b"\x1f\x8b"
        reader = None
        if text_size_guess(len(raw), raw[-4:], compressed) > SLICED_ABOVE_BYTES:
            reader = _read_in_slices(path, _text_pieces(path, io.BytesIO(raw), compressed))
        if reader is None:
            reader = _read_whole(path, raw, compressed, notes)
        del raw
        reader.source.warnings.extend(notes)
        if rank is not None:
            reader.source.rank, reader.source.rank_source = rank, "caller"
        return reader.finish()


def _read_whole(path: Path, raw: bytes, compressed: bool, notes: list[str]) -> _KinetoEvents:
    """The whole document decoded at once: small files, and whatever a sliced read gave up on
    (its warnings for a cut or lenient file go to `notes`)."""
    text = _gunzip(path, raw, notes) if compressed else raw
    events, top, parse_notes, text = _parse(path, text)
    notes += parse_notes
    reader = _KinetoEvents(path, top)
    reader.place(events, text)
    return reader


def _read_in_slices(
    path: Path,
    pieces: Iterator[bytes | memoryview],
    reader: _KinetoEvents | None = None,
) -> _KinetoEvents | None:
    """The events decoded and placed a slice at a time as the text arrives (inflated, or read),
    so that the columns, one slice's events and a window of text are held at once, never the
    whole text or every event as a Python object (an 8 x 800 rank file of 19.7 MB gzipped
    peaked at 1.0 GB decoded whole: docs/benchmarks.md).

    A slice ends at a comma between two events, found as the next `},{` past `_SLICE_BYTES`
    and confirmed by decoding: read from an event's start, the text decodes as a list closed
    at that comma only if the comma separates two events of the list (inside a string, or in
    an event's args, the list cannot close there). The last slice is decoded with the start
    of the document, so that it also yields the document's other keys. None for anything but
    a well-formed document (cut, lenient, wrong-shaped, a damaged gzip stream), which the
    whole-document path then reads with its own warnings and errors. `reader`: the reader to
    place them with (a new one where None), whose `spill` may take each slice's arrays, and
    which a caller keeps what it placed of."""
    window = _TextWindow(pieces)
    try:
        while (first := _FIRST_CONTENT.match(window.text)) is None:
            if not window.more():
                return None
        opens_at = first.end() - 1
        is_list = window.text[opens_at] == ord("[")
        head = b"["
        if not is_list:
            while (found := _EVENTS_KEY_BYTES.search(window.text)) is None:
                if not window.more():
                    return None
            opens_at = found.end() - 1
            head = bytes(window.text[: opens_at + 1])
            _DOCUMENT.decode(head + b"]}")  # the document's own key, not a nested object's
        window.drop(opens_at)  # from here the window starts at a bracket or a comma
        reader = reader if reader is not None else _KinetoEvents(path, {})
        while (cut := _next_slice(window)) is not None:
            events, end = cut
            reader.place(events, memoryview(window.text)[: end + 1])
            del events, cut
            window.drop(end)
        while window.more():
            pass
        tail = b"".join((head, memoryview(window.text)[1:]))
        window.drop(len(window.text))
        if not is_list and _EVENTS_KEY_BYTES.search(tail, len(head)) is not None:
            return None  # a second events key (JSON keeps the last): the whole read decides
        if is_list:
            events, top = _EVENT_LIST.decode(tail), {}
        else:
            document = _DOCUMENT.decode(tail)
            events, top = document.traceEvents, _other_keys(document)
        if not events:
            return None
        reader.place(events, tail)
        reader.describe(top)
        return reader
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, _NotSliceable):
        return None


class _NotSliceable(Exception):
    """The text could not be cut or had no more to give: read the document whole."""


class _TextWindow:
    """The part of a document's text not yet decoded, refilled from the text's pieces."""

    def __init__(self, pieces: Iterator[bytes | memoryview]) -> None:
        self.pieces = pieces
        self.text = bytearray()

    def more(self) -> bool:
        """The next piece appended; False once there is none."""
        piece = next(self.pieces, None)
        if piece is None:
            return False
        self.text += piece
        return True

    def drop(self, count: int) -> None:
        """The first `count` bytes let go (a copy of the rest: a window is about a slice)."""
        self.text = self.text[count:]


def _next_slice(window: _TextWindow) -> tuple[list[_Event], int] | None:
    """The events from the window's start (an opening bracket or the comma after an event) to
    a comma some `_SLICE_BYTES` on, and that comma's position; None where no event boundary
    lies past that before the text ends (the rest is the last slice)."""
    search_from = _SLICE_BYTES
    tries = 0
    while True:
        found = _BETWEEN_EVENTS.search(window.text, search_from)
        if found is None:
            searched = len(window.text)
            if not window.more():
                return None
            search_from = max(search_from, searched - _BOUNDARY_SPAN)
            continue
        text, end = window.text, found.start(1)
        opening, closing = text[0], text[end]
        text[0], text[end] = ord("["), ord("]")
        view = memoryview(text)
        try:
            events = _EVENT_LIST.decode(view[: end + 1])
        except msgspec.DecodeError:  # the `},{` was inside a string or an event's args
            tries += 1
            if tries >= _CUT_TRIES:
                raise _NotSliceable from None
            search_from = found.end()
            continue
        finally:
            view.release()  # the events' raw args keep their own view, not this one
            text[0], text[end] = opening, closing
        if not events:
            raise _NotSliceable
        return events, end


def _text_pieces(
    path: Path, source: BinaryIO, compressed: bool, capped: bool = True
) -> Iterator[bytes | memoryview]:
    """A file's JSON text in pieces, read from `source` (the file's bytes in memory, or the
    file itself where it is too large to hold): inflated a piece at a time from gzip (with
    `_gunzip`'s limits; not `capped`: no cap on the text, the ratio still checked), or cut from
    the bytes read. A damaged stream raises `_NotSliceable`: the whole read then says what is
    wrong, or keeps what a cut stream holds."""
    if not compressed:
        while piece := source.read(_PIECE_BYTES):
            yield piece
        return
    try:
        yield from _inflate(path, source, _PIECE_BYTES, capped)
    except (EOFError, zlib.error, isal_zlib.error, TraceError):
        raise _NotSliceable from None


def _inflate(
    path: Path, source: BinaryIO, piece_bytes: int, capped: bool = True
) -> Iterator[bytes]:
    """A gzip stream's text, at most `piece_bytes` at a time; EOFError where the stream ends
    before its end-of-stream marker, TraceError where it inflates absurdly (`_check_expansion`).
    """
    # ISA-L's inflate is much faster than zlib's, and inflating is a large part of reading a trace.
    # Input goes in by slices, so the bytes consumed (the ratio's denominator) are known exactly.
    total = fed = 0
    pending = b""  # input given to the inflater but not yet consumed, or the next member
    at_end = False
    decompressor = isal_zlib.decompressobj(wbits=31)
    while True:
        if not pending and not at_end:
            pending = source.read(_INFLATE_INPUT)
            fed += len(pending)
            at_end = len(pending) < _INFLATE_INPUT
        piece = decompressor.decompress(pending, piece_bytes)
        total += len(piece)
        pending = decompressor.unconsumed_tail
        _check_expansion(path, total, max(fed - len(pending), 1), capped)
        if piece:
            yield piece
        if decompressor.eof:
            pending = decompressor.unused_data.lstrip(b"\x00")
            while not pending and not at_end:  # padding, or the next member's first bytes
                more = source.read(_INFLATE_INPUT)
                fed += len(more)
                at_end = len(more) < _INFLATE_INPUT
                pending = more.lstrip(b"\x00")
            if not pending:
                return
            decompressor = isal_zlib.decompressobj(wbits=31)  # the next gzip member
            continue
        if not pending and not piece and at_end:
            raise EOFError("compressed file ended before the end-of-stream marker")


def text_size_guess(size: int, last_four: bytes, compressed: bool) -> int:
    """How large a file of `size` bytes is as JSON text: a gzip stream states it in its last
    four bytes (`last_four`; modulo 4 GiB, and for its last member only), so the guess is the
    least size of that remainder that is at least a low ratio's guess."""
    if not compressed:
        return size
    remainder = int.from_bytes(last_four, "little")
    least = size * _GZIP_LEAST_RATIO
    return remainder + max(0, -(-(least - remainder) // (1 << 32))) * (1 << 32)


def _load_file(path: Path) -> bytes:
    """A trace file's bytes as stored (gzip or not), refused when too large or empty."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0  # read_bytes names the problem
    if size > MAX_TRACE_BYTES:
        raise TraceError(
            path, f"{size} bytes is larger than the {MAX_TRACE_BYTES} bytes teller reads per trace"
        )
    raw = read_bytes(path, "a trace file")
    if _FIRST_CONTENT.match(raw) is None:
        raise TraceError(path, "empty file, expected a Kineto/Chrome trace (JSON)")
    return raw


def _gunzip(path: Path, raw: bytes, notes: list[str]) -> bytes:
    """Inflate in bounded steps, refusing absurd expansion before it costs the memory.

    A stream cut short keeps what inflated, when that holds whole events (`_parse` reads up to
    the last one); a corrupt stream is refused, naming how much was readable."""
    parts: list[bytes] = []
    error: Exception | None = None
    try:
        for piece in _inflate(path, io.BytesIO(raw), _INFLATE_CHUNK):
            parts.append(piece)
    except (EOFError, zlib.error, isal_zlib.error) as failure:
        error = failure
    data = b"".join(parts)
    del parts
    if error is not None:
        truncated = isinstance(error, EOFError) or "incomplete" in str(error).lower()
        if not truncated or _FIRST_CONTENT.match(data) is None:
            raise TraceError(
                path,
                f"gzip stream is truncated or corrupt ({error}); {len(data)} bytes of JSON "
                "could be recovered, expected a complete .json.gz",
                where=f"byte {len(raw)} of compressed input",
            )
        notes.append(
            f"gzip stream truncated at byte {len(raw)} of compressed input "
            f"({len(data)} bytes inflated)"
        )
    if _FIRST_CONTENT.match(data) is None:
        raise TraceError(path, "empty file (after gunzip), expected a Kineto/Chrome trace (JSON)")
    return data


def _check_expansion(path: Path, inflated: int, compressed: int, capped: bool = True) -> None:
    if capped and inflated > MAX_TRACE_BYTES:
        raise TraceError(
            path, f"inflates to more than the {MAX_TRACE_BYTES} bytes teller reads per trace"
        )
    if inflated > _RATIO_FLOOR_BYTES and inflated > MAX_GZIP_RATIO * compressed:
        raise TraceError(
            path,
            f"gzip stream inflates more than {MAX_GZIP_RATIO}x ({compressed} bytes to over "
            f"{inflated}): not a trace (a gzip bomb?)",
            where=f"byte {compressed} of compressed input",
        )


def _parse(path: Path, raw: bytes) -> tuple[list[_Event], dict, list[str], bytes]:
    """Typed fast path (msgspec); on anything unusual, a tolerant path that counts what it skips.

    Also returns the bytes the events came from: a truncated file's, up to its last whole event."""
    first = _FIRST_CONTENT.match(raw)
    is_list = first is not None and raw[first.end() - 1] == ord("[")
    try:
        if is_list:
            return _EVENT_LIST.decode(raw), {}, [], raw
        document = _DOCUMENT.decode(raw)
    except RecursionError:
        raise _too_deep(path, raw) from None
    except msgspec.ValidationError:
        return (*_parse_tolerant(path, _decode_any(path, raw), []), raw)
    except msgspec.DecodeError:
        try:
            return (*_parse_tolerant(path, _lenient_json(path, raw), [_LENIENT_NOTE]), raw)
        except TraceError:
            recovered = _complete_events(raw, is_list)
            if recovered is None:
                raise
            whole, note = recovered
            return (*_parse_tolerant(path, _lenient_json(path, whole), [note]), whole)
    if document.traceEvents is None:
        return (*_parse_tolerant(path, _decode_any(path, raw), []), raw)
    top = _other_keys(document)
    if not document.traceEvents:
        raise TraceError(path, "'traceEvents' is empty: the trace holds no events")
    return document.traceEvents, top, [], raw


def _other_keys(document: _Document) -> dict:
    """The document's keys besides its events, what `_KinetoEvents.describe` reads."""
    return {f: getattr(document, f) for f in document.__struct_fields__ if f != "traceEvents"}


def _cut_after_events(
    text: str, list_end: int, count: int, size: int, is_list: bool
) -> tuple[bytes, str] | None:
    """A file cut in the keys after a complete events list: the document closed after its last
    complete key, when the broken key runs to the end of the file (a cut), else None."""
    if is_list:
        return None
    decoder = json.JSONDecoder(strict=False)
    length = len(text)
    good_end = position = list_end + 1

    def skip(at: int) -> int:
        while at < length and text[at] in " \t\r\n":
            at += 1
        return at

    while True:
        position = skip(position)
        if position >= length:
            break
        if text[position] != ",":
            return None  # a closing brace or junk: the document is not merely cut
        try:
            _, position = decoder.raw_decode(text, skip(position + 1))  # the key
            position = skip(position)
            if position >= length:
                break
            if text[position] != ":":
                return None
            _, position = decoder.raw_decode(text, skip(position + 1))  # its value
        except RecursionError:
            return None
        except json.JSONDecodeError as error:
            if not (error.msg.startswith("Unterminated string") or error.pos >= length - 1):
                return None
            break
        good_end = position
    note = (
        f"truncated at byte {size}, after all {count} events: the top-level keys after the "
        "cut are missing"
    )
    return (text[:good_end] + "}").encode("utf-8"), note


_EVENTS_KEY = re.compile(r'"traceEvents"\s*:\s*\[')
_EVENTS_KEY_BYTES = re.compile(_EVENTS_KEY.pattern.encode())


def _complete_events(raw: bytes, is_list: bool) -> tuple[bytes, str] | None:
    """A cut file's text up to its last complete event, closed, and a warning saying where it
    ends; None unless the file is a prefix of a trace (the first unreadable event runs to the
    end of the file), so a corrupt middle is still refused."""
    text = raw.decode("utf-8", errors="replace")
    if is_list:
        start = text.find("[") + 1
    else:
        found = _EVENTS_KEY.search(text)
        if found is None:
            return None
        start = found.end()
    decoder = json.JSONDecoder(strict=False)
    position, last_end, count = start, -1, 0
    length = len(text)
    while True:
        while position < length and text[position] in " \t\r\n":
            position += 1
        if position >= length or text[position] == "]":
            if position < length:  # the list is complete: what is broken lies after it
                return _cut_after_events(text, position, count, len(raw), is_list)
            break
        try:
            _, end = decoder.raw_decode(text, position)
        except RecursionError:
            return None
        except json.JSONDecodeError as error:
            runs_to_end = error.msg.startswith("Unterminated string") or error.pos >= length - 1
            if not runs_to_end:
                return None
            break
        last_end, count, position = end, count + 1, end
        while position < length and text[position] in " \t\r\n":
            position += 1
        if position < length and text[position] == ",":
            position += 1
        elif position < length:
            if text[position] == "]":
                return _cut_after_events(text, position, count, len(raw), is_list)
            return None  # two events without a comma: corrupt, not cut
    if count == 0:
        return None
    closed = text[:last_end] + ("]" if is_list else "]}")  # the events list is last in Kineto
    kept = len(text[:last_end].encode("utf-8"))
    note = (
        f"truncated at byte {len(raw)}: read the {count} complete events up to byte {kept} "
        "(the rest of the trace is missing)"
    )
    return closed.encode("utf-8"), note


_LENIENT_NOTE = (
    "file is not strict JSON (raw control characters, integers beyond 64 bits or numbers beyond "
    "float64); parsed leniently"
)


def _decode_any(path: Path, raw: bytes) -> object:
    """The document as plain Python values; numbers msgspec refuses (1e999) go the lenient way."""
    try:
        return _ANY.decode(raw)
    except RecursionError:
        raise _too_deep(path, raw) from None
    except (msgspec.ValidationError, msgspec.DecodeError):
        return _lenient_json(path, raw)


def _too_deep(path: Path, raw: bytes) -> TraceError:
    """Where the nesting first passes MAX_JSON_DEPTH (brackets in strings are counted too: the
    position is for the message, the refusal itself comes from the decoder's own depth limit)."""
    codes = np.frombuffer(raw, dtype=np.uint8)
    step = np.zeros(256, dtype=np.int8)
    step[list(b"[{")], step[list(b"]}")] = 1, -1
    depth = np.cumsum(step[codes], dtype=np.int64)
    deep = np.flatnonzero(depth > MAX_JSON_DEPTH)
    where = f"byte {int(deep[0])}" if deep.size else ""
    return TraceError(
        path, f"JSON nested more than {MAX_JSON_DEPTH} levels deep; expected Kineto events", where
    )


def _lenient_json(path: Path, raw: bytes) -> object:
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text, strict=False)
    except RecursionError:
        raise _too_deep(path, raw) from None
    except json.JSONDecodeError as error:
        at_end = error.pos >= len(text.rstrip()) - 1 or error.msg.startswith("Unterminated string")
        what = (
            "JSON ends before the trace is complete (truncated file?); expected the rest of "
            "the traceEvents list and a closing '}'"
            if at_end
            else f"not valid JSON ({error.msg}); expected a Kineto/Chrome trace"
        )
        position = len(text[: error.pos].encode("utf-8"))
        raise TraceError(path, what, where=f"byte {position}") from None


def _parse_tolerant(
    path: Path, doc: object, notes: list[str]
) -> tuple[list[_Event], dict, list[str]]:
    """Validate event by event; events of the wrong shape are counted, never fatal on their own."""
    if isinstance(doc, dict):
        events = doc.get("traceEvents")
        if events is None:
            keys = ", ".join(sorted(map(str, doc))[:8]) or "none"
            raise TraceError(
                path, f"no 'traceEvents' key (keys: {keys}); expected a Kineto/Chrome trace object"
            )
        if not isinstance(events, list):
            raise TraceError(path, f"'traceEvents' is a {type(events).__name__}, expected a list")
        top = {key: doc.get(key) for key in _Document.__struct_fields__ if key != "traceEvents"}
    elif isinstance(doc, list):
        events, top = doc, {}
    else:
        raise TraceError(
            path, f"top level is a JSON {type(doc).__name__}, expected an object with traceEvents"
        )
    if not events:
        raise TraceError(path, "'traceEvents' is empty: the trace holds no events")
    typed: list[_Event] = []
    bad: list[int] = []
    for index, event in enumerate(events):
        try:
            if not isinstance(event, dict):
                raise msgspec.ValidationError("not an object")
            args = event.get("args")
            fields = {
                k: v for k, v in event.items() if k in _Event.__struct_fields__ and k != "args"
            }
            typed_event = msgspec.convert(fields, _Event)
            if args is not None:
                typed_event.args = msgspec.Raw(_dumps(args).encode())
            typed.append(typed_event)
        except msgspec.ValidationError:
            bad.append(index)
    if bad:
        if not typed:
            raise TraceError(
                path,
                "no event has the Chrome-trace shape (objects with string ph/cat and numeric ts)",
                where=f"event {bad[0]}",
            )
        notes = [*notes, f"skipped {len(bad)} malformed events (first at event {bad[0]})"]
    return typed, top, notes


def _as_int(value: object, default: int = -1) -> int:
    """An int64 from an int, a finite float or a decimal string; `default` for anything else
    (NaN, inf, beyond int64, "①": Python's int() takes unicode digits JSON never means)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if -_INT64_MAX <= value <= _INT64_MAX else default
    if isinstance(value, float) and -_INT64_MAX <= value <= _INT64_MAX:
        return int(value)
    if isinstance(value, str) and _is_decimal(value):
        return _as_int(int(value), default)
    return default


def _is_decimal(text: str) -> bool:
    digits = text[1:] if text[:1] == "-" else text
    return digits.isascii() and digits.isdigit()


def _dumps(value: object) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # integers beyond 64 bits
        return json.dumps(value)


#: The columns `_KinetoEvents.place` fills, one value per placed event. `ts_event_index` is the
#: row's index in the slice's event list, for the exact-timestamp re-read.
_ROW_FIELDS = (
    "pid",
    "tid",
    "stream",
    "device",
    "layer",
    "name",
    "cat",
    "ts",
    "dur",
    "correlation",
    "external_id",
    "coll_name",
    "group",
    "seq",
    "bytes",
    "args",
    "ts_event_index",
)


#: Columns of ids that a file may state beyond int64.
_ID_COLUMNS = ("pid", "tid", "stream", "device", "correlation", "external_id", "seq", "bytes")
_CATEGORY_CODE = {cat: LAYER_CODE[layer] for cat, layer in CATEGORY_LAYER.items()}
_CPU_OP, _ENGINE, _KERNEL, _COMM = (LAYER_CODE[k] for k in ("cpu_op", "engine", "kernel", "comm"))
_INSTANT, _COUNTER = LAYER_CODE["instant"], LAYER_CODE["counter"]
#: Rows whose args never hold link ids: their args are not decoded (python frames, instants).
_UNLINKED = frozenset({LAYER_CODE["python"], _INSTANT, _COUNTER, LAYER_CODE["profiler"]})


class _KinetoEvents:
    """One pass over a trace's events, a slice at a time: each slice fills plain lists, which
    become arrays when the slice is done (`_seal`), and the arrays one table at the end."""

    def __init__(self, path: Path, top: dict) -> None:
        self.path = path
        self.source = SourceInfo(path=str(path), format="kineto", rank=-1, rank_source="")
        self.describe(top)
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self.coll_names: dict[str, int] = {}
        self.groups: dict[str, int] = {}
        self.string_ids: dict[str, int] = {}
        self.columns: dict[str, Sequence] = {}  # the whole file's, filled by finish()
        self.sealed: list[dict[str, Any]] = []  # per slice: its columns as arrays
        # launch-flow events (ph, pid, tid, ts, id), used only if some launch lacks a correlation
        self.flow_events: list[tuple] = []
        self.unknown_cats: dict[str, None] = {}  # in the order first seen: warnings say so
        self.rank_from_comms: int | None = None
        self.events_seen = 0  # events of the slices placed so far
        self.category_counts: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self.first_bad: dict[str, int] = {}
        # (ph, cat, name) -> (layer code, name id, cat id, on GPU, collective id or None, decode
        # link args?): see _classify
        self.kinds: dict[tuple, tuple] = {}
        self.beyond_int64: dict[str, int] = dict.fromkeys(_ID_COLUMNS, 0)
        self.rounded_timestamps = False  # some slice's sub-µs digits could not be recovered
        #: where each slice's arrays go instead of `sealed`, for a file read in time windows
        #: (`kineto_windows`): the pass then holds one slice at a time
        self.spill: Callable[[dict[str, Any]], None] | None = None

    def describe(self, top: dict) -> None:
        """What the document's keys besides its events say (a sliced read learns them last)."""
        self.top = top
        distributed = (
            top.get("distributedInfo") if isinstance(top.get("distributedInfo"), dict) else {}
        )
        self.source.host = str(top.get("host_name", "") or "")
        self.source.world_size = _as_int(distributed.get("world_size"), 0)
        self.source.distributed = distributed

    # -- the pass -------------------------------------------------------------------------------
    def place(self, events: list[_Event], text: bytes) -> None:
        """One slice's events into the columns. This is the reader's hot loop (a few hundred
        thousand events per file), so everything decided by an event's (category, name) alone
        is decided once per distinct pair and cached, flow events are only remembered, and each
        placed event costs one append per column. `text` is the slice's JSON, for the exact
        re-read of timestamps a float cannot hold."""
        columns: dict[str, list] = {field: [] for field in _ROW_FIELDS}
        (
            pid_col,
            tid_col,
            stream_col,
            device_col,
            layer_col,
            name_col,
            cat_col,
            ts_col,
            dur_col,
            corr_col,
            ext_col,
            coll_col,
            group_col,
            seq_col,
            bytes_col,
            args_col,
            index_col,
        ) = (column.append for column in columns.values())
        category_counts = self.category_counts
        skipped = self.skipped
        first_bad = self.first_bad
        kinds = self.kinds
        classify = self._classify
        flow_events = self.flow_events
        pid_of = self._int_id
        lifted_decode = _LIFTED.decode
        no_args = _NO_ARGS
        all_streams = _ALL_STREAMS
        max_us = _MAX_US
        first_index = self.events_seen

        def skip(reason: str, index: int) -> None:
            skipped[reason] = skipped.get(reason, 0) + 1
            first_bad.setdefault(reason, first_index + index)

        for index, event in enumerate(events):
            ph = event.ph
            if ph == "X" or ph == "i" or ph == "I" or ph == "C":
                ts = event.ts
                if type(ts) is not float and type(ts) is not int:
                    skip("missing or non-numeric ts", index)
                    continue
                if not -max_us < ts < max_us:  # also false for NaN
                    skip("ts not finite or beyond int64 nanoseconds", index)
                    continue
                if ph == "X":
                    dur = event.dur
                    if (type(dur) is not float and type(dur) is not int) or dur < 0:
                        skip("missing or negative dur", index)
                        continue
                    if not dur < max_us:
                        skip("dur not finite or beyond int64 nanoseconds", index)
                        continue
                else:
                    dur = 0
                cat = event.cat
                name = event.name
                if type(name) is not str:
                    name = str(name)
                key = (ph, cat, name)
                kind = kinds.get(key)
                if kind is None:
                    kind = kinds[key] = classify(ph, cat, name)
                code, name_id, cat_id, on_gpu, coll, link_args = kind
                count_key = cat or ph
                category_counts[count_key] = category_counts.get(count_key, 0) + 1
                raw_args = event.args
                lifted = no_args
                if raw_args and link_args:
                    try:  # try/except, not contextlib.suppress: no call per event
                        lifted = lifted_decode(raw_args)
                    except msgspec.DecodeError:  # args not an object
                        lifted = no_args
                pid = event.pid
                tid = event.tid
                if type(pid) is not int:
                    pid = pid_of(pid)
                if type(tid) is not int:
                    tid = pid_of(tid)
                group = seq = -1
                if on_gpu:
                    stream = lifted.stream if lifted.stream != -1 else tid
                    device = lifted.device if lifted.device != -1 else pid
                    if type(stream) is not int:
                        stream = _as_int(stream)
                    if type(device) is not int:
                        device = _as_int(device)
                    if not 0 <= stream < all_streams:  # CUPTI writes uint32(-1): "any stream"
                        stream = all_streams
                    nbytes = lifted.bytes
                    if type(nbytes) is not int:
                        nbytes = _as_int(nbytes)
                else:
                    stream = device = nbytes = -1
                    if coll is not None:  # a host-side collective: its metadata is in args
                        args = _ANY.decode(raw_args) if raw_args else {}
                        coll, group, seq, nbytes = self._collective(
                            name, args if isinstance(args, dict) else {}
                        )
                correlation = lifted.correlation
                external = lifted.external_id
                if external is None:
                    external = lifted.external_id_legacy
                pid_col(pid)
                tid_col(tid)
                stream_col(stream)
                device_col(device)
                layer_col(code)
                name_col(name_id)
                cat_col(cat_id)
                ts_col(ts)
                dur_col(dur)
                corr_col(correlation if type(correlation) is int else _as_int(correlation))
                ext_col(external if type(external) is int else _as_int(external))
                coll_col(-1 if coll is None else coll)
                group_col(group)
                seq_col(seq)
                bytes_col(nbytes)
                args_col(raw_args or None)
                index_col(index)
            elif ph == "s" or ph == "f" or ph == "t":
                cat = event.cat
                category_counts[cat or "flow"] = category_counts.get(cat or "flow", 0) + 1
                if cat in LAUNCH_FLOW_CATEGORIES:
                    flow_events.append((ph, event.pid, event.tid, event.ts, event.id))
                else:
                    reason = f"{cat or 'uncategorised'} flow events (not launch links)"
                    skipped[reason] = skipped.get(reason, 0) + 1
            elif ph == "M":
                category_counts["metadata"] = category_counts.get("metadata", 0) + 1
                self._metadata(event)
            elif ph == "B" or ph == "E":
                skip("unpaired B/E duration events (only complete X events are read)", index)
            else:
                skip(f"event phase {ph!r} not understood", index)
        self.events_seen += len(events)
        self._seal(columns, events, text)

    def _seal(self, columns: dict[str, list], events: list[_Event], text: bytes) -> None:
        """A slice's lists as arrays (ids as int64, times in ns), so that its events and their
        Python values can go before the next slice is decoded."""
        ts = np.asarray(columns["ts"], dtype=np.float64)
        dur = np.asarray(columns["dur"], dtype=np.float64)
        sealed: dict[str, Any] = {
            "ts": ts,
            "ts_ns": self._ts_ns(ts, columns["ts_event_index"], events, text),
            "dur_ns": np.rint(dur * 1000.0).astype(np.int64),
            "layer": np.asarray(columns["layer"], dtype=np.int8),
            "args": string_array(columns["args"]),
        }
        for column in ("name", "cat", "coll_name", "group"):
            sealed[column] = np.asarray(columns[column], dtype=np.int32)
        for column in _ID_COLUMNS:
            sealed[column] = self._int64_array(column, columns[column])
        if self.spill is None:
            self.sealed.append(sealed)
            return
        # a spilled pass holds no slice once it is written: its launch flows are applied now
        self._apply_flows(sealed)
        self.flow_events.clear()
        self.spill(sealed)

    def _end_pass(self) -> None:
        """After the last slice: what the pass counted, said; the slices' arrays joined into the
        file's columns; launch flows and the clock applied."""
        self.source.events_by_category = self.category_counts
        self.source.skipped = self.skipped
        for reason, count in self.skipped.items():
            where = (
                f" (first at event {self.first_bad[reason]})" if reason in self.first_bad else ""
            )
            self.source.warnings.append(f"skipped {count} events: {reason}{where}")
        sealed, self.sealed = self.sealed, []
        for column in sealed[0] if sealed else ():
            parts = [part[column] for part in sealed]
            if column == "args":
                self.columns[column] = parts[0] if len(parts) == 1 else pa.chunked_array(parts)
            else:
                self.columns[column] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        del sealed
        placed = len(self.columns["ts_ns"]) if self.columns else 0
        if self.unknown_cats and placed:
            cat_ids = self.columns["cat"]
            duration = ~np.isin(self.columns["layer"], [_INSTANT, _COUNTER])
            for cat in self.unknown_cats:
                count = int(((cat_ids == self.cats[cat]) & duration).sum())
                self.source.warnings.append(
                    f"{count} events of unknown category {cat!r} read as cpu_op"
                )
        if not placed:
            first = min(self.first_bad.values(), default=0)
            raise TraceError(
                self.path,
                "no event could be placed: expected Chrome-trace events with ph, ts and dur",
                where=f"event {first}",
            )
        self._apply_flows(self.columns)
        self._clock()

    # -- helpers ---------------------------------------------------------------------------------
    def _classify(self, ph: str, cat: str, name: str) -> tuple:
        """What an event's phase, category and name alone decide, once per distinct triple:
        (layer code, name id, cat id, on GPU, collective id or None, decode link args?).
        For a host-side collective the collective id is -1: its kind comes from each event's args.
        """
        if ph == "X":
            code = _CATEGORY_CODE.get(cat)
            if code is None:
                self.unknown_cats[cat] = None
                code = _CPU_OP
        else:
            code = _COUNTER if ph == "C" else _INSTANT
        name_id = self._symbol(self.names, name)
        cat_id = self._symbol(self.cats, cat)
        on_gpu = cat in GPU_CATEGORIES
        link_args = code not in _UNLINKED
        coll = None
        if on_gpu:
            if code == _KERNEL and is_comm_kernel(name):
                code, coll = _COMM, self._symbol(self.coll_names, collective_kind(name))
        elif code in (_CPU_OP, _ENGINE) and is_comm_cpu_op(name):
            code, coll = _COMM, -1
        return code, name_id, cat_id, on_gpu, coll, link_args

    def _int_id(self, value: object) -> int:
        """Stable negative ids for string pids/tids ("Spans", "PyTorch Profiler")."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return _as_int(value)
        key = str(value)
        if _is_decimal(key):
            return _as_int(int(key))
        known = self.string_ids.get(key)
        if known is None:
            known = self.string_ids[key] = -1000 - len(self.string_ids)
            self.source.thread_names.setdefault(str(known), key)
        return known

    @staticmethod
    def _symbol(table: dict[str, int], value: str) -> int:
        known = table.get(value)
        if known is None:
            known = table[value] = len(table)
        return known

    def _collective(self, name: str, args: dict) -> tuple[int, int, int, int]:
        coll = self._symbol(
            self.coll_names, collective_kind(str(args.get("Collective name") or name))
        )
        group_value = args.get("Process Group Name", args.get("Process Group ID"))
        group = self._symbol(self.groups, str(group_value)) if group_value is not None else -1
        seq = _as_int(args.get("Seq", args.get("seq")))
        nelems = _as_int(args.get("In msg nelems"))
        nbytes = nelems * _DTYPE_BYTES.get(str(args.get("dtype")), 0) if nelems >= 0 else -1
        if nbytes == 0 and nelems > 0:
            nbytes = -1
        if nelems < 0:
            nbytes = _first_input_bytes(args)
        if "Rank" in args and self.rank_from_comms is None:
            self.rank_from_comms = _as_int(args["Rank"], None)  # type: ignore[arg-type]
        return coll, group, seq, nbytes

    def _metadata(self, event: _Event) -> None:
        args = _ANY.decode(event.args) if event.args else {}
        if not isinstance(args, dict):
            args = {}
        kind = event.name
        key = f"{event.pid}"
        if kind == "process_name":
            self.source.process_names[key] = str(args.get("name", ""))
        elif kind == "process_labels":
            self.source.process_names[key + ":labels"] = str(args.get("labels", ""))
        elif kind == "thread_name":
            self.source.thread_names[f"{key}:{event.tid}"] = str(args.get("name", ""))

    def _apply_flows(self, columns: dict[str, Any]) -> None:
        """Legacy files may link launches only by flow events: lift their ids into the
        `correlation` of `columns` (the file's, or one spilled slice's).

        Flow events are looked at only here, and only when some launch or GPU row lacks a
        correlation id: current Kineto files carry it in args, and their tens of thousands of
        `ac2g` flows would otherwise cost the pass a dict entry each."""
        if not self.flow_events:
            return
        corr = columns["correlation"]
        runtime_code = LAYER_CODE["runtime"]
        linked = [
            LAYER_CODE[name] for name in ("runtime", "kernel", "memcpy", "memset", "sync", "comm")
        ]
        layer = columns["layer"]
        host_comm = (layer == _COMM) & (columns["stream"] < 0)  # no launch to link
        missing = np.flatnonzero((corr < 0) & np.isin(layer, linked) & ~host_comm)
        if not missing.size:
            return
        starts: dict[tuple, int] = {}
        ends: dict[tuple, int] = {}
        for ph, pid, tid, ts, flow_id in self.flow_events:
            target = starts if ph == "s" else ends
            target[(pid, tid, ts)] = _as_int(flow_id)
        raw_pids = {v: k for k, v in self.string_ids.items()}
        for i, pid, tid, ts, code in zip(
            missing.tolist(),
            columns["pid"][missing].tolist(),
            columns["tid"][missing].tolist(),
            columns["ts"][missing].tolist(),
            layer[missing].tolist(),
            strict=True,
        ):
            key = (raw_pids.get(pid, pid), raw_pids.get(tid, tid), ts)
            flows = starts if code == runtime_code else ends
            flow_id = flows.get(key, -1)
            if flow_id >= 0:
                corr[i] = flow_id

    def _ts_ns(
        self, ts: np.ndarray, event_index: list[int], events: list[_Event], text: bytes
    ) -> np.ndarray:
        """µs floats as int64 ns, exactly even where a float64 cannot hold the digits."""
        whole = np.floor(ts)
        ts_ns = whole.astype(np.int64) * 1000 + np.rint((ts - whole) * 1000.0).astype(np.int64)
        if (
            ts.size
            and np.abs(ts).max() > _FLOAT_EXACT_US
            and (not np.all(ts == whole) or _RAW_TS_FRACTION.search(text) is not None)
        ):  # a slice's floats may all look whole where its text has digits they lost
            exact = _exact_timestamps(text, events, event_index)
            if exact is not None:
                return exact
            self.rounded_timestamps = True
        return ts_ns

    def _clock(self) -> None:
        """The file's clock: its base time added, and whether it is unix time."""
        ts, ts_ns = self.columns["ts"], self.columns["ts_ns"]
        if self.rounded_timestamps:
            self.source.warnings.append(
                "could not recover exact sub-microsecond timestamps; they are rounded to "
                "float64 precision (about 0.25 µs)"
            )
        base = _as_int(self.top.get("baseTimeNanoseconds"), 0)
        if base > 0 and ts_ns.size and int(ts_ns.max()) > _INT64_MAX - base:
            self.source.warnings.append(
                f"baseTimeNanoseconds {base} puts events beyond int64 ns; ignored"
            )
            base = 0
        if base > 0:
            self.source.base_time_ns = base
            ts_ns = ts_ns + base
            self.source.clock = "unix"
        elif ts.size and ts.max() > _EPOCH_US:
            self.source.clock = "unix"
        else:
            self.source.clock = "trace"
            self.source.warnings.append(
                "timestamps are on the profiler's own clock (no baseTimeNanoseconds): "
                "wall-clock alignment needs a clock anchor"
            )
        self.columns["ts_ns"] = ts_ns

    def _int64_array(self, column: str, values: list) -> np.ndarray:
        """An id column as int64; ids beyond int64 (a pid of 10**30) become -1, counted."""
        try:
            return np.asarray(values, dtype=np.int64)
        except OverflowError:
            fixed = [_as_int(v) for v in values]
            self.beyond_int64[column] += sum(
                1 for v, f in zip(values, fixed, strict=True) if v != f
            )
            return np.asarray(fixed, dtype=np.int64)

    def _merged_ranks(self) -> dict[int, int]:
        """A merged multi-rank file (teller's annotated Perfetto export, or any Chrome trace whose
        processes are named "rank N") keeps each process's rank instead of one rank per file."""
        ranks = {}
        for pid, name in self.source.process_names.items():
            match = _MERGED_RANK_PROCESS.fullmatch(name)
            if match and pid.lstrip("-").isdigit():
                ranks[int(pid)] = int(match.group(1))
        return ranks if len(ranks) > 1 else {}

    def finish(self) -> EventTable:
        self._end_pass()
        source = self.source
        merged = self._merged_ranks()
        if merged and source.rank < 0:
            return self._finish_merged(merged)
        if source.rank < 0:
            distributed_rank = _as_int(source.distributed.get("rank"), -1)
            file_match = _RANK_IN_FILE_NAME.search(Path(source.path).name)
            if distributed_rank >= 0:
                source.rank, source.rank_source = distributed_rank, "distributedInfo"
            elif file_match:
                source.rank, source.rank_source = int(file_match.group(1)), "file name"
            elif self.rank_from_comms is not None and self.rank_from_comms >= 0:
                source.rank, source.rank_source = self.rank_from_comms, "record_param_comms"
            else:
                source.rank, source.rank_source = 0, "assumed"
                source.warnings.append("rank not stated in the file or its name; assumed rank 0")
        rank = np.full(len(self.columns["ts_ns"]), source.rank, dtype=np.int32)
        return EventTable(table=self._table(rank), sources=[source])

    def _table(self, rank: np.ndarray) -> pa.Table:
        """The Arrow event table of the pass's columns, with `rank` per row."""
        self.columns["rank"] = rank
        for column, bad in self.beyond_int64.items():
            if bad:
                self.source.warnings.append(
                    f"{bad} events had a {column} beyond int64 (read as -1)"
                )
        return build_table(
            self.columns,
            names=list(self.names),
            cats=list(self.cats),
            coll_names=list(self.coll_names),
            groups=list(self.groups),
            host=self.source.host,
        )

    def _finish_merged(self, ranks: dict[int, int]) -> EventTable:
        pids = self.columns["pid"]
        rank = np.zeros(len(pids), dtype=np.int32)
        for pid, r in ranks.items():
            rank[pids == pid] = r
        unplaced = int((~np.isin(pids, list(ranks))).sum())
        table = self._table(rank)
        sources = []
        for r in sorted(set(ranks.values())):
            source = SourceInfo(
                **{**self.source.to_json(), "rank": r, "rank_source": "process name"}
            )
            sources.append(source)
        if unplaced:
            sources[0].warnings.append(
                f"{unplaced} events of processes not named 'rank N' were put on rank 0"
            )
        return EventTable(table=table, sources=sources)


def _exact_timestamps(
    text: bytes, events: list[_Event], event_index: list[int]
) -> np.ndarray | None:
    """Every top-level `"ts"` re-read from the raw text, in order, to keep all ns digits, for
    the rows placed from `events` (their indices in `event_index`); None where the text's count
    of timestamps does not match the events'."""
    matches = _RAW_TS.findall(text)
    every_ts = [i for i, e in enumerate(events) if e.ts is not None]
    if len(matches) != len(every_ts):
        return None
    position = {index: k for k, index in enumerate(every_ts)}
    out = np.empty(len(event_index), dtype=np.int64)
    for row, index in enumerate(event_index):
        whole, frac = matches[position[index]]
        frac = (frac + b"000")[:3]
        value = int(whole) * 1000
        out[row] = value - int(frac) if value < 0 else value + int(frac)
    return out


def _first_input_bytes(args: dict) -> int:
    """The size of an operator's first input tensor from its "Input Dims" and "Input type", or
    -1 where either is missing or not a plain shape of a known element type."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not (isinstance(dims, list) and isinstance(types, list) and dims and types):
        return -1
    shape, size = dims[0], _INPUT_TYPE_BYTES.get(str(types[0]), 0)
    if not (isinstance(shape, list) and shape and size):
        return -1
    count = 1
    for extent in shape:
        if type(extent) is not int or extent < 0:
            return -1
        count *= extent
    return count * size if count * size <= _INT64_MAX else -1
