"""TensorRT-LLM lines: `[TensorRT-LLM][INFO] {…}` per-iteration JSON (`--log_iteration_data`).

The iteration JSON carries the batch composition and KV-cache state of each executor iteration
(`Iteration Counter`, `Context Requests`, `Generation Requests`, `Free KV cache blocks`, …); keys are
normalised like every other engine's fields. The line prints no time of its own; when the JSON has
a `Timestamp` (`MM-DD-YYYY HH:MM:SS`) it is used, else the reader carries the time over from context.
"""

from __future__ import annotations

import re

import orjson

from teller.ingest.logs.fields import normalise_key
from teller.ingest.logs.table import LogRecord, second_of_day

HEADER = re.compile(r"^\[TensorRT-LLM\]\[(?P<level>[A-Z]+)\] ?(?P<message>.*)$", re.DOTALL)
_LEVELS = {"VERBOSE": "DEBUG", "DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "WARNING"}
#: The iteration JSON's `"Timestamp":"01-22-2025 10:01:07"`.
_TIMESTAMP = re.compile(
    r"""
    ^(?P<month>\d\d)-(?P<day>\d\d)-(?P<year>\d{4})    # month-day-year
    [ ](?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)
    """,
    re.VERBOSE,
)


def from_header(header: re.Match[str], line: int) -> LogRecord:
    """The record of a TensorRT-LLM line whose HEADER matched (an unknown level reads as ERROR)."""
    message = header.group("message")
    level = _LEVELS.get(header.group("level"), "ERROR")
    record = LogRecord(header.string, line, "trtllm", level=level, message=message)
    if message.startswith("{"):
        try:
            values = orjson.loads(message)
        except orjson.JSONDecodeError:
            return record  # kept, and template-mined like any other line
        if isinstance(values, dict):
            record.event = "iteration"
            record.template = "trtllm iteration data"
            record.fields = {normalise_key(k): v for k, v in values.items()}
            record.clock = _clock(values.get("Timestamp"))
    return record


def _clock(value: object) -> tuple | None:
    if not isinstance(value, str) or not (match := _TIMESTAMP.match(value)):
        return None
    g = match.group
    seconds = second_of_day(g("h"), g("m"), g("s"))
    return (int(g("year")), int(g("month")), int(g("day")), seconds, None)
