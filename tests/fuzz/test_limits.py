"""Limits: a gzip bomb or a file past a reader's stated limit is refused in bounded memory.

Each bomb is a 2 MB gzip file inflating to 2 GiB of zeros; it is read in a fresh process whose
peak resident memory is then compared with a bound far below the inflated size.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.mutations import gzip_bomb
from teller.errors import TraceError
from teller.ingest import kineto, read_trace
from teller.ingest.logs import read_logs
from teller.ingest.logs import reader as log_reader

REPO = Path(__file__).resolve().parents[2]
INFLATED = 2 << 30
#: Peak memory allowed while a bomb is refused: the interpreter, numpy and pyarrow take about
#: 150 MB, the readers' bounded steps a few tens more.
PEAK_BYTES = 600 << 20

#: The child reports its peak from /proc (VmHWM: this program's own address space). Not
#: getrusage's ru_maxrss: Linux carries that across exec from the forked copy of the parent, so
#: under a large pytest process it would report pytest's size.
READ = """
import sys
from teller.errors import TraceError
kind, path = sys.argv[1], sys.argv[2]
try:
    if kind == "trace":
        from teller.ingest import read_trace
        read_trace(path)
    elif kind == "logs":
        from teller.ingest.logs import read_logs
        read_logs([path])
    else:
        from teller.ingest.otlp import read_spans
        read_spans([path])
    print("read")
except TraceError as error:
    print("refused:", error)
with open("/proc/self/status") as status:
    peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(peak_kib * 1024)
"""


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return gzip_bomb(INFLATED, b'{"traceEvents": [')


def _read_in_fresh_process(kind: str, path: Path) -> tuple[str, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", READ, kind, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    outcome, peak = done.stdout.strip().rsplit("\n", 1)
    return outcome, int(peak)


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("trace", "rank0.json.gz"),
        ("logs", "rank0.log.gz"),
        ("logs", "rank0.log"),
        ("spans", "s.json.gz"),
    ],
)
def test_a_gzip_bomb_is_refused_in_bounded_memory(kind, name, bomb, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_bytes(bomb)
    assert path.stat().st_size < 3 << 20
    outcome, peak = _read_in_fresh_process(kind, path)
    assert outcome.startswith("refused:") and str(path) in outcome
    assert "gzip bomb" in outcome
    print(f"{name}: refused at peak {peak >> 20} MiB")
    assert peak < PEAK_BYTES, f"peak {peak >> 20} MiB while refusing a gzip bomb"


def test_a_trace_past_the_stated_limit_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rank0.json"
    path.write_bytes(b'{"traceEvents": [' + b" " * 4096 + b"]}")
    monkeypatch.setattr(kineto, "MAX_TRACE_BYTES", 1024)
    with pytest.raises(TraceError, match="larger than the 1024 bytes") as error:
        read_trace(path)
    assert error.value.path == str(path)


def test_a_trace_inflating_past_the_stated_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip_bomb(8 << 20, b'{"traceEvents": ['))
    monkeypatch.setattr(kineto, "MAX_TRACE_BYTES", 4 << 20)
    with pytest.raises(TraceError, match="inflates to more than"):
        read_trace(path)


def test_a_log_line_without_end_is_cut_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "rank0.log"
    path.write_bytes(b"INFO 02-13 11:33:33 [a.py:1] start\n" + b"x" * (3 << 20) + b"\nlast\n")
    logs = read_logs([path], year=2025)
    assert logs.sources[0].counts["lines_cut"] == 1
    assert max(len(text) for text in logs.column("raw")) <= log_reader.MAX_LINE_BYTES
    assert logs.column("raw")[-1] == "last"
