"""Which log files to read, whether they carry `teller collect`'s time prefix, and their format.

The reader parses every line by its own shape (one file often mixes engine lines, NCCL watchdog
lines and uvicorn access lines), so detection only has to say what a file mostly is, for the
report, and whether its lines start with the collector's 28-byte prefix
(`2026-11-30T08:13:37.123456Z `, see `teller.collect.logs`).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from teller.ingest.logs import vllm
from teller.ingest.logs.line import parse_line

#: File names read from a directory; other files (traces, manifests) are left alone.
LOG_SUFFIXES: tuple[str, ...] = (".log", ".txt", ".out", ".err", ".log.gz", ".txt.gz")
COLLECTOR_PREFIX = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z ")
#: How many lines of a file decide its format.
SNIFF_LINES = 200


#: `teller collect`'s console copy: it repeats every line of the per-process `rank*.log` files.
COLLECTOR_CONSOLE = "launcher.log"
_COLLECTOR_PROCESS_LOG = re.compile(r"^rank(?:pid)?\d+\.log$")


def find_log_files(paths: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    """(log files to read, files skipped): directories expand to their log files, sorted.

    In a `teller collect` folder the console copy (`launcher.log`) repeats the per-process logs
    line for line, so it is skipped when those are there; a file named explicitly is always read.
    """
    found: list[Path] = []
    skipped: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            found.append(path)
            continue
        files = [
            p
            for p in sorted(path.rglob("*"))
            if p.is_file() and p.name.lower().endswith(LOG_SUFFIXES)
        ]
        for file in files:
            siblings = (p.name for p in files if p.parent == file.parent)
            if file.name == COLLECTOR_CONSOLE and any(
                _COLLECTOR_PROCESS_LOG.match(name) for name in siblings
            ):
                skipped.append(file)
            else:
                found.append(file)
    return found, skipped


def manifest_hosts(files: Iterable[Path]) -> dict[Path, str]:
    """Host of each file that a `teller collect` manifest beside it names (resolved path → host).

    The manifest sits in the run folder, one or two levels above the logs (`DIR/logs/rank0.log`),
    and lists each process's log path (relative to DIR) and host (`teller.collect.manifest`).
    """
    folders = {parent for file in files for parent in Path(file).resolve().parents[:2]}
    hosts: dict[Path, str] = {}
    for folder in sorted(folders):
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        ranks = manifest.get("ranks") if isinstance(manifest, dict) else None
        if not isinstance(ranks, dict):
            continue  # not `teller collect`'s (the lab simulator writes another shape)
        for record in ranks.values():
            if isinstance(record, dict) and record.get("log") and record.get("host"):
                hosts[(folder / str(record["log"])).resolve()] = str(record["host"])
    return hosts


def open_log(path: Path):
    """Binary handle on a log file, gzip or plain (decided by content, not the name)."""
    with path.open("rb") as handle:
        magic = handle.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else path.open("rb")


def has_collector_prefix(head: list[bytes]) -> bool:
    """True when most non-empty head lines start with the collector's timestamp."""
    lines = [line for line in head if line.strip()]
    hits = sum(1 for line in lines if COLLECTOR_PREFIX.match(line))
    return bool(lines) and hits * 2 > len(lines)


def detect_format(lines: list[str]) -> str:
    """The format most head lines parse as: vllm, sglang, trtllm, pytorch, uvicorn or generic."""
    votes: Counter[str] = Counter()
    for number, text in enumerate(lines[:SNIFF_LINES]):
        if match := vllm.PROCESS_PREFIX.match(text):
            text = text[match.end() :]
        if (shape := parse_line(text, number).format) != "unparsed":
            votes[shape] += 1
    engine_votes = {k: v for k, v in votes.items() if k != "uvicorn"}
    if engine_votes:
        return max(engine_votes, key=engine_votes.__getitem__)
    return "uvicorn" if votes else "generic"
