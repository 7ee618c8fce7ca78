"""Hostile variants of real input files: what a reader must survive with a result or a TraceError.

Each mutation takes a random generator and one seed document (a slice of a real trace, a log, an
OTLP export) and returns the bytes of one variant plus the file name to write it under, so a
failing variant can be replayed from its seed and index alone. The operators are the ones the
readers' boundaries meet in the field: cut files, flipped bytes, values of the wrong type or beyond
int64, nesting past any recursion limit, odd unicode and terminal escapes, reordered, duplicated
and deleted events, corrupt and over-expanding gzip streams.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import sqlite3
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: Values that do not fit where a reader expects a small integer, a float or a string.
EXTREME_NUMBERS: tuple[str, ...] = (
    "1e999",
    "-1e999",
    "NaN",
    "Infinity",
    "-Infinity",
    str(10**30),
    str(-(10**30)),
    str(2**63),
    str(2**63 - 1),
    str(-(2**63)),
    str(2**64),
    "1e300",
    "-1",
    "0",
    "1e-320",
)
WRONG_TYPES: tuple[str, ...] = (
    '"\u2460"',
    '"\u00b2"',
    '"NaN"',
    '"-"',
    '""',
    "null",
    "true",
    "[]",
    "{}",
    "[1, 2]",
    '{"a": 1}',
    '"12abc"',
    '"\\u0000"',
)
HOSTILE_TEXT: tuple[str, ...] = (
    "\x1b[2J\x1b[31mred",
    "\x1b]0;title\x07",
    "\u202e\u0000\ud800",
    "\U0001f600" * 50,
    "a" * 100_000,
    "\r\n\t\x08",
    "%s%n{0}",
)
#: Depth of the nested lists that must not reach a recursion limit.
DEEP = 5000


@dataclass
class Variant:
    """One hostile file: its name, its bytes, and which operator made it (for the report)."""

    name: str
    data: bytes
    operator: str


def deep_list(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


def _raw(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=True)


def _events_text(head: dict, events: list[str]) -> bytes:
    """A Kineto document whose events are given as raw JSON text (so any literal fits)."""
    top = {k: v for k, v in head.items() if k != "traceEvents"}
    body = ", ".join(events)
    rest = _raw(top)[1:-1]
    text = '{"traceEvents": [' + body + "]" + (", " + rest if rest else "") + "}"
    return text.encode("utf-8", "surrogatepass")


def _event_with(event: dict, key: str, literal: str) -> str:
    fields = [f"{_raw(k)}: {_raw(v)}" for k, v in event.items() if k != key]
    fields.append(f"{_raw(key)}: {literal}")
    return "{" + ", ".join(fields) + "}"


class KinetoMutator:
    """Variants of one Kineto document (a dict with traceEvents) as `.json` or `.json.gz` bytes."""

    KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id")
    ARG_KEYS = ("correlation", "stream", "device", "External id", "bytes", "Rank", "Seq")

    def __init__(self, document: dict, stem: str) -> None:
        self.document = document
        self.events: list[dict] = document["traceEvents"]
        self.stem = stem
        self.text = json.dumps(document).encode()
        self.operators: list[Callable[[random.Random], Variant]] = [
            self.truncate,
            self.flip_bytes,
            self.extreme_field,
            self.wrong_type_field,
            self.extreme_arg,
            self.deep_nesting,
            self.hostile_name,
            self.reorder,
            self.duplicate,
            self.delete,
            self.top_level,
            self.gzip_corrupt,
            self.gzip_truncate,
        ]

    def variant(self, rng: random.Random) -> Variant:
        return rng.choice(self.operators)(rng)

    def _json(self, data: bytes, operator: str, gz: bool = False) -> Variant:
        if gz:
            return Variant(self.stem + ".json.gz", gzip.compress(data, 1), operator)
        return Variant(self.stem + ".json", data, operator)

    def _raw_events(self) -> list[str]:
        return [_raw(e) for e in self.events]

    def truncate(self, rng: random.Random) -> Variant:
        cut = rng.randrange(1, len(self.text))
        return self._json(self.text[:cut], "truncate", gz=rng.random() < 0.3)

    def flip_bytes(self, rng: random.Random) -> Variant:
        data = bytearray(self.text)
        for _ in range(rng.choice((1, 2, 8, 64))):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return self._json(bytes(data), "flip_bytes")

    def _set(self, rng: random.Random, key: str, literal: str, operator: str) -> Variant:
        events = self._raw_events()
        for _ in range(rng.choice((1, 1, 3, len(events)))):
            i = rng.randrange(len(events))
            events[i] = _event_with(self.events[i], key, literal)
        return self._json(_events_text(self.document, events), operator)

    def extreme_field(self, rng: random.Random) -> Variant:
        key = rng.choice(("pid", "tid", "ts", "dur", "id"))
        return self._set(rng, key, rng.choice(EXTREME_NUMBERS), f"extreme_{key}")

    def wrong_type_field(self, rng: random.Random) -> Variant:
        key = rng.choice(self.KEYS)
        return self._set(rng, key, rng.choice(WRONG_TYPES + EXTREME_NUMBERS), f"type_{key}")

    def extreme_arg(self, rng: random.Random) -> Variant:
        key = rng.choice(self.ARG_KEYS)
        literal = rng.choice(EXTREME_NUMBERS + WRONG_TYPES)
        events = self._raw_events()
        for _ in range(rng.choice((1, 5, len(events)))):
            i = rng.randrange(len(events))
            event = self.events[i]
            args = event.get("args") if isinstance(event.get("args"), dict) else {}
            fields = [f"{_raw(k)}: {_raw(v)}" for k, v in args.items() if k != key]
            fields.append(f"{_raw(key)}: {literal}")
            events[i] = _event_with(event, "args", "{" + ", ".join(fields) + "}")
        return self._json(_events_text(self.document, events), f"arg_{key}")

    def deep_nesting(self, rng: random.Random) -> Variant:
        where = rng.choice(("name", "args", "event", "document"))
        if where == "document":
            return self._json(
                deep_list(rng.choice((1000, DEEP, 100_000))).encode(), "deep_document"
            )
        if where == "event":
            events = self._raw_events()
            events.insert(rng.randrange(len(events) + 1), deep_list())
            return self._json(_events_text(self.document, events), "deep_event")
        return self._set(rng, where, deep_list(rng.choice((1000, DEEP))), f"deep_{where}")

    def hostile_name(self, rng: random.Random) -> Variant:
        return self._set(rng, rng.choice(("name", "cat")), _raw(rng.choice(HOSTILE_TEXT)), "text")

    def reorder(self, rng: random.Random) -> Variant:
        events = self._raw_events()
        rng.shuffle(events)
        return self._json(_events_text(self.document, events), "reorder")

    def duplicate(self, rng: random.Random) -> Variant:
        events = self._raw_events()
        for _ in range(rng.randrange(1, 20)):
            i = rng.randrange(len(events))
            events.insert(rng.randrange(len(events)), events[i])
        return self._json(_events_text(self.document, events), "duplicate")

    def delete(self, rng: random.Random) -> Variant:
        events = self._raw_events()
        keep = max(1, int(len(events) * rng.random()))
        kept = sorted(rng.sample(range(len(events)), keep))
        return self._json(_events_text(self.document, [events[i] for i in kept]), "delete")

    def top_level(self, rng: random.Random) -> Variant:
        doc = copy.copy(self.document)
        key = rng.choice(("traceEvents", "baseTimeNanoseconds", "distributedInfo", "host_name"))
        literal = rng.choice(EXTREME_NUMBERS + WRONG_TYPES)
        text = _raw({k: v for k, v in doc.items() if k != key})[:-1]
        text += (", " if len(doc) > (key in doc) else "") + f"{_raw(key)}: {literal}}}"
        return self._json(text.encode("utf-8", "surrogatepass"), f"top_{key}")

    def gzip_corrupt(self, rng: random.Random) -> Variant:
        data = bytearray(gzip.compress(self.text, 6))
        for _ in range(rng.choice((1, 4))):
            data[rng.randrange(10, len(data))] ^= 1 << rng.randrange(8)
        return Variant(self.stem + ".json.gz", bytes(data), "gzip_corrupt")

    def gzip_truncate(self, rng: random.Random) -> Variant:
        data = gzip.compress(self.text, 6)
        return Variant(self.stem + ".json.gz", data[: rng.randrange(2, len(data))], "gzip_truncate")


def gzip_bomb(inflated_bytes: int, prefix: bytes = b"") -> bytes:
    """A valid gzip file of `prefix` then zeros, `inflated_bytes` in all, about 1000x smaller.

    Built without deflating gigabytes: one fully flushed block of 1 MiB of zeros is independent of
    what came before, so repeating its bytes is a valid stream."""
    chunk = 1 << 20
    head = zlib.compressobj(9, zlib.DEFLATED, -15)
    start = head.compress(prefix) + head.flush(zlib.Z_FULL_FLUSH)
    block = zlib.compressobj(9, zlib.DEFLATED, -15)
    zeros = block.compress(bytes(chunk)) + block.flush(zlib.Z_FULL_FLUSH)
    end = zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)
    blocks = max(0, (inflated_bytes - len(prefix)) // chunk)
    crc = zlib.crc32(prefix)
    one = bytes(chunk)
    for _ in range(blocks):
        crc = zlib.crc32(one, crc)
    size = len(prefix) + blocks * chunk
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = struct.pack("<II", crc, size & 0xFFFFFFFF)
    return header + start + zeros * blocks + end + trailer


def kineto_seed(path: Path, events: int = 300) -> dict:
    """A small document from a real trace: its top-level keys, metadata and its first events."""
    with gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb") as handle:
        document = json.load(handle)
    if isinstance(document, list):
        document = {"traceEvents": document}
    all_events = document["traceEvents"]
    metadata = [e for e in all_events if e.get("ph") == "M"][:20]
    rest = [e for e in all_events if e.get("ph") != "M"][:events]
    return {
        **{k: v for k, v in document.items() if k != "traceEvents"},
        "traceEvents": metadata + rest,
    }


class LogMutator:
    """Variants of one engine log (plain text, or gzip named `.log` / `.log.gz`)."""

    def __init__(self, text: str, stem: str) -> None:
        self.lines = text.splitlines()
        self.stem = stem

    def variant(self, rng: random.Random) -> Variant:
        lines = list(self.lines)
        operator = rng.choice(
            (
                "truncate",
                "flip",
                "dates",
                "escape",
                "reorder",
                "duplicate",
                "gzip_named_log",
                "gzip_corrupt",
                "long_line",
                "deep",
            )
        )
        if operator == "truncate":
            data = "\n".join(lines).encode()
            return Variant(self.stem + ".log", data[: rng.randrange(len(data))], operator)
        if operator == "flip":
            data = bytearray("\n".join(lines).encode())
            for _ in range(rng.choice((1, 8, 64))):
                data[rng.randrange(len(data))] = rng.randrange(256)
            return Variant(self.stem + ".log", bytes(data), operator)
        if operator == "dates":
            stamp = rng.choice(
                (
                    "0000-01-01T00:00:00.000000Z",
                    "2262-04-12T00:00:00.000000Z",
                    "9999-12-31T23:59:59.999999Z",
                    "2025-13-40T25:61:61.000000Z",
                    "1677-09-21T00:12:43.145224Z",
                    "0001-01-01T00:00:00.000000Z",
                )
            )
            printed = rng.choice(
                ("00-00 00:00:00", "12-31 23:59:59", "02-30 11:33:33", "99-99 99:99:99")
            )
            for _ in range(rng.randrange(1, 5)):
                i = rng.randrange(len(lines))
                if rng.random() < 0.5:
                    lines[i] = f"{stamp} {lines[i]}"
                else:
                    lines[i] = lines[i].replace("02-13 11:33", printed[:11], 1)
            return Variant(self.stem + ".log", "\n".join(lines).encode(), operator)
        if operator == "escape":
            i = rng.randrange(len(lines))
            lines[i] += rng.choice(HOSTILE_TEXT)
            data = "\n".join(lines).encode("utf-8", "surrogatepass")
            return Variant(self.stem + ".log", data, operator)
        if operator == "reorder":
            rng.shuffle(lines)
        if operator == "duplicate":
            lines = lines + lines[: rng.randrange(len(lines))]
        if operator == "long_line":
            lines.insert(rng.randrange(len(lines)), "x" * 1_000_000)
        if operator == "deep":
            lines.insert(rng.randrange(len(lines)), "INFO 02-13 11:33:34 [a.py:1] " + deep_list())
        data = "\n".join(lines).encode()
        if operator == "gzip_named_log":
            return Variant(self.stem + ".log", gzip.compress(data), operator)
        if operator == "gzip_corrupt":
            packed = bytearray(gzip.compress(data))
            packed[rng.randrange(10, len(packed))] ^= 0xFF
            return Variant(self.stem + ".log.gz", bytes(packed), operator)
        return Variant(self.stem + ".log", data, operator)


class SpanMutator:
    """Variants of one OTLP/JSON export: values of the wrong type, extremes, nesting, cuts."""

    def __init__(self, document: dict, stem: str) -> None:
        self.document = document
        self.stem = stem
        self.text = json.dumps(document)

    def variant(self, rng: random.Random) -> Variant:
        operator = rng.choice(("truncate", "flip", "replace", "replace", "deep"))
        if operator == "truncate":
            return Variant(
                self.stem + ".json", self.text[: rng.randrange(len(self.text))].encode(), operator
            )
        if operator == "flip":
            data = bytearray(self.text.encode())
            for _ in range(rng.choice((1, 8))):
                data[rng.randrange(len(data))] = rng.randrange(256)
            return Variant(self.stem + ".json", bytes(data), operator)
        # replace one JSON value (found by its key) with a hostile literal
        keys = (
            '"scopeSpans"',
            '"spans"',
            '"attributes"',
            '"startTimeUnixNano"',
            '"endTimeUnixNano"',
            '"intValue"',
            '"doubleValue"',
            '"value"',
            '"resource"',
            '"stringValue"',
            '"arrayValue"',
            '"resourceSpans"',
            '"key"',
        )
        key = rng.choice(keys)
        literal = (
            rng.choice(EXTREME_NUMBERS + WRONG_TYPES) if operator == "replace" else deep_list()
        )
        text = self.text
        at = [i for i in range(len(text)) if text.startswith(key + ": ", i)]
        if not at:
            return Variant(self.stem + ".json", text.encode(), operator)
        start = rng.choice(at) + len(key) + 2
        end = _value_end(text, start)
        return Variant(
            self.stem + ".json",
            (text[:start] + literal + text[end:]).encode(),
            f"{operator}_{key.strip(chr(34))}",
        )


def _value_end(text: str, start: int) -> int:
    """End of the JSON value starting at `start` (json.dumps output, so no surprises)."""
    _, end = json.JSONDecoder().raw_decode(text, start)
    return end


def mutate_sqlite(source: Path, target: Path, rng: random.Random) -> str:
    """Copy an nsys export and write one hostile value into one column of a few rows."""
    target.write_bytes(source.read_bytes())
    connection = sqlite3.connect(target)
    try:
        tables = [
            r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        ]
        preferred = [
            t for t in tables if t.startswith(("CUPTI", "NVTX", "StringIds", "TARGET", "ENUM"))
        ]
        table = rng.choice(preferred or tables)
        columns = [r[1] for r in connection.execute(f'PRAGMA table_info("{table}")')]
        column = rng.choice(columns)
        value = rng.choice(
            (
                None,
                "text",
                "\u2460",
                b"\x00\xff",
                1e300,
                -1e300,
                float("nan"),
                2**63 - 1,
                -(2**63),
                -1,
                0,
                1.5,
                "\x1b[2J",
            )
        )
        limit = rng.choice((1, 3, 1000))
        rows = connection.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
        offset = rng.randrange(max(rows, 1))
        chosen = f'SELECT rowid FROM "{table}" LIMIT {limit} OFFSET {offset}'
        try:
            connection.execute(
                f'UPDATE "{table}" SET "{column}" = ? WHERE rowid IN ({chosen})', (value,)
            )
        except sqlite3.IntegrityError:  # an INTEGER PRIMARY KEY takes only integers
            value = None
            connection.execute(f'DELETE FROM "{table}" WHERE rowid IN ({chosen})')
        if rng.random() < 0.1:
            connection.execute(f'DROP TABLE "{table}"')
        connection.commit()
    finally:
        connection.close()
    return f"sqlite_{table}.{column}={value!r:.20}"
