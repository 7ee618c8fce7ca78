"""A large Kineto file is decoded a slice of events at a time; the table must be the one the
whole-document read makes, on real files and on the texts where a cut could go wrong.

Slices are made small here (a few kB) so that every file is cut many times; the reader's
threshold is lowered so that small files are sliced at all.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import real_trace
from teller.ingest import kineto
from teller.ingest.schema import EventTable

from .test_kineto import KINETO_FILES

SMALL_SLICE = 4096
SMALL_PIECE = 1024


def read_both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object, int]:
    """The whole read's and the sliced read's outcomes (a table, or the error's text), and how
    many slices the sliced read placed."""
    slices = 0
    place = kineto._KinetoEvents.place

    def counting_place(reader, events, text) -> None:
        nonlocal slices
        slices += 1
        place(reader, events, text)

    def outcome() -> object:
        try:
            return kineto.read(path)
        except Exception as error:  # compared as text: the same error either way
            return f"{type(error).__name__}: {error}"

    with monkeypatch.context() as patch:
        patch.setattr(kineto, "SLICED_ABOVE_BYTES", 1 << 40)
        whole = outcome()
    with monkeypatch.context() as patch:
        patch.setattr(kineto, "SLICED_ABOVE_BYTES", 0)
        patch.setattr(kineto, "_SLICE_BYTES", SMALL_SLICE)
        patch.setattr(kineto, "_PIECE_BYTES", SMALL_PIECE)
        patch.setattr(kineto._KinetoEvents, "place", counting_place)
        sliced = outcome()
    return whole, sliced, slices


def assert_same(whole: object, sliced: object) -> None:
    if isinstance(whole, str) or isinstance(sliced, str):
        assert whole == sliced
        return
    assert isinstance(whole, EventTable) and isinstance(sliced, EventTable)
    assert sliced.table.equals(whole.table)
    assert [s.to_json() for s in sliced.sources] == [s.to_json() for s in whole.sources]


@pytest.mark.parametrize("relative", KINETO_FILES)
def test_every_real_file_sliced_reads_as_it_does_whole(
    relative: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = real_trace(relative)
    whole, sliced, slices = read_both(path, monkeypatch)
    assert_same(whole, sliced)
    if len(gzip.decompress(path.read_bytes())) > 4 * SMALL_SLICE:
        assert slices > 1


def event(name: str, ts: float | str, args: dict | None = None, **fields) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 2.0,
            "args": args or {}, **fields}  # fmt: skip


def many_events(count: int = 400) -> list[dict]:
    return [event(f"aten::op_{i}", 1000.0 + 3 * i) for i in range(count)]


def write_text(tmp_path: Path, text: str | bytes, name: str = "trace.json") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_a_cut_never_lands_in_a_string_or_in_args(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `},{` in names and in args' lists of objects, every few events: candidates a slice must
    # not end at; keys before and after the list, one holding "traceEvents" in a string
    events = many_events()
    for i in range(0, len(events), 7):
        events[i]["name"] = 'odd"},{"name": "x'
        events[i]["args"] = {"Input Dims": [{"a": 1}, {"b": [2, {"c": 3}]}], "note": "]},{["}
    document = {
        "schemaVersion": 1,
        "comment": 'looks like "traceEvents": [ but is text, "traceEvents": [',
        "traceEvents": events,
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "distributedInfo": {"rank": 3, "world_size": 4},
    }
    path = write_text(tmp_path, json.dumps(document, indent=1))

    whole, sliced, slices = read_both(path, monkeypatch)

    assert_same(whole, sliced)
    assert slices > 5
    assert isinstance(sliced, EventTable)
    assert sliced.sources[0].rank == 3 and sliced.sources[0].base_time_ns > 0
    assert len(sliced) == len(events)


def test_a_bare_list_and_a_gzip_file_are_sliced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = write_text(tmp_path, json.dumps(many_events()), "bare_rank2.json")
    packed = tmp_path / "packed.json.gz"
    packed.write_bytes(gzip.compress(json.dumps({"traceEvents": many_events()}).encode()))
    for path in (bare, packed):
        whole, sliced, slices = read_both(path, monkeypatch)
        assert_same(whole, sliced)
        assert slices > 5


def test_sub_microsecond_digits_survive_in_every_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # epoch microseconds with ns digits: beyond what a float64 holds; in some slices every
    # float rounds to a whole microsecond, yet the text has the digits
    events = [event(f"op{i}", f"1712195495505{i:03d}.125") for i in range(300)]
    events += [event(f"op{i}", f"1712195495506{i:03d}.121") for i in range(300)]
    text = json.dumps({"traceEvents": events}).replace('.125"', ".125").replace('.121"', ".121")
    path = write_text(tmp_path, text.replace('"ts": "', '"ts": '))

    whole, sliced, _ = read_both(path, monkeypatch)

    assert_same(whole, sliced)
    assert isinstance(sliced, EventTable)
    ts_ns = sorted(sliced.table.column("ts_ns").to_pylist())
    assert ts_ns[0] == 1712195495505000125 and ts_ns[-1] == 1712195495506299121


@pytest.mark.parametrize(
    "damage",
    ["cut in the events", "cut after the events", "control characters", "malformed events",
     "no events", "a second events key", "a nested events key first", "cut gzip stream",
     "corrupt gzip stream"],
)  # fmt: skip
def test_damaged_documents_read_as_the_whole_reader_reads_them(
    damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = many_events()
    if damage == "malformed events":
        events[150]["ts"] = "soon"
        events[300] = ["not", "an", "event"]
    document: dict = {"traceEvents": [] if damage == "no events" else events, "traceName": "x"}
    text = json.dumps(document)
    if damage == "cut in the events":
        text = text[: len(text) // 2]
    elif damage == "cut after the events":
        text = text[:-5]
    elif damage == "control characters":
        text = text.replace("aten::op_200", "aten::\top_200\x01")
    elif damage == "a nested events key first":
        text = '{"meta": {"traceEvents": [1, 2]}, ' + text[1:]
    elif damage == "a second events key":
        text = text[:-1] + ', "traceEvents": [' + json.dumps(event("late", 5.0)) + "]}"
    path = write_text(tmp_path, text)
    if damage.endswith("gzip stream"):
        packed = bytearray(gzip.compress(text.encode()))
        if damage == "cut gzip stream":
            del packed[len(packed) // 2 :]
        else:
            packed[len(packed) // 2] ^= 0xFF
        path = write_text(tmp_path, bytes(packed), "damaged.json.gz")

    whole, sliced, _ = read_both(path, monkeypatch)

    assert_same(whole, sliced)
