"""vLLM log lines (V0 and V1) and the uvicorn access lines its API server prints.

Shapes (quoted in shared/formats/engine-logs.md)::

    INFO 10-01 18:43:28 logger.py:36] Received request cmpl-…-0: prompt: …          (V0)
    (APIServer pid=90458) INFO 02-13 11:33:33 [async_llm.py:382] Added request chatcmpl-…-a8a65d16.
    INFO:     172.18.0.1:49422 - "POST /v1/chat/completions HTTP/1.1" 200 OK        (uvicorn)

The `(Process pid=N)` prefix is stripped by the reader before this module sees the line (other
engines' lines carry it too). The printed time has no year and, by default, no sub-second part:
the reader resolves it from context. V1's engine request id is the API id plus a suffix; the
record keeps the id as printed and the table derives the shared `request_key`.
"""

from __future__ import annotations

import re

from teller.ingest.logs.fields import key_values, normalise_key
from teller.ingest.logs.table import LogRecord, second_of_day

#: `LEVEL MM-DD HH:MM:SS[.frac] [file.py:line] message` (V1 brackets the source, V0 does not).
HEADER = re.compile(
    r"""
    ^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)
    [ ](?P<stamp>\d\d-\d\d[ ]\d\d:\d\d:\d\d)    # month-day and time, no year
    (?:[.,](?P<frac>\d{1,9}))?                  # sub-second part (a custom log format)
    [ ]\[?(?P<source>[\w./\-]+:\d+)\]?[ ]?      # the engine's file.py:line
    (?P<message>.*)$
    """,
    re.DOTALL | re.VERBOSE,
)
#: `MM-DD HH:MM:SS` → (month, day, second of day); stamps repeat for every line of a second.
_STAMPS: dict[str, tuple[int, int, int | None]] = {}
_STAMP_CACHE_SIZE = 100_000
#: `(APIServer pid=1)`, `(VllmWorker TP0 pid=1)`, `(RayWorkerWrapper pid=1, ip=10.0.0.2)`.
PROCESS_PREFIX = re.compile(
    r"""
    ^\((?P<process>[^()]*?)             # the process tag
    [ ]pid=(?P<pid>\d+)
    (?:,[ ]ip=(?P<ip>[^)\s]+))?         # Ray names the worker's host
    \)[ ]
    """,
    re.VERBOSE,
)
_PROCESS_RANK = re.compile(r"(?:TP|rank=)(\d+)")

#: uvicorn's `INFO:     172.18.0.1:49422 - "POST /v1/chat/completions HTTP/1.1" 200 OK`.
ACCESS = re.compile(
    r"""
    ^(?P<level>INFO|WARNING|ERROR):\s+
    (?P<client>\S+?):(?P<port>\d+)[ ]-[ ]                           # client address
    "(?P<method>[A-Z]+)[ ](?P<path>\S+)[ ](?P<protocol>HTTP/[\d.]+)"  # request line
    [ ](?P<status>\d{3})
    """,
    re.VERBOSE,
)

#: V1 aborts print `Aborted request(s) id1,id2.`: the record keeps the first id, all in fields.
_REQUEST = re.compile(
    r"""
    ^(?P<what>Received|Added|Finished|Aborted)
    [ ]request(?:\(s\))?[ ]
    (?P<rid>[^\s:,]+?)(?:[.:,]|$)       # the id, up to the punctuation after it
    """,
    re.VERBOSE,
)
_REQUEST_EVENT = {
    "Received": "request_received",
    "Added": "request_added",
    "Finished": "request_finished",
    "Aborted": "request_aborted",
}
_PREEMPTED_V0 = re.compile(
    r"^Sequence group (?P<rid>\S+) is preempted by PreemptionMode\.(?P<mode>\w+) mode"
)
_RESUMED = re.compile(r"^Preempted request (?P<rid>\S+) has been resumed")
_ENGINE = re.compile(r"^Engine (?P<engine>\d+): ")
_ITERATION = re.compile(r"Iteration\((?P<iteration>\d+)\): ")
_COUNTED = re.compile(r"(?P<count>\d+) (?P<what>(?:context|generation) (?:requests|tokens))")
_JIT = re.compile(r"JIT compilation during inference: (?P<kernel>[\w<>]+(?:\.\w+)*)")
_PROMPT_IDS = re.compile(r"prompt_token_ids: \[(?P<ids>[^\]]*)\]")
_MAX_TOKENS = re.compile(r"max_tokens=(?P<n>\d+)")
_CUMULATIVE = re.compile(r"total_num_cumulative_preemption=(?P<n>\d+)")


def from_header(header: re.Match[str], line: int) -> LogRecord:
    """The record of a vLLM line (process prefix already removed) whose HEADER matched."""
    level, stamp, frac, source, message = header.groups()
    month, day, time_of_day = _STAMPS.get(stamp) or _parse_stamp(stamp)
    fraction = int(frac.ljust(9, "0")) if frac else None
    record = LogRecord(header.string, line, "vllm", level=level, source=source, message=message)
    record.clock = (None, month, day, time_of_day, fraction)
    classify(record)
    return record


def _parse_stamp(stamp: str) -> tuple[int, int, int | None]:
    parsed = (
        int(stamp[0:2]),
        int(stamp[3:5]),
        second_of_day(stamp[6:8], stamp[9:11], stamp[12:14]),
    )
    if len(_STAMPS) >= _STAMP_CACHE_SIZE:
        _STAMPS.clear()
    _STAMPS[stamp] = parsed
    return parsed


def classify(record: LogRecord) -> None:
    """Set event, request id, template and fields from the message of a vLLM record.

    Cheap substring tests guard every regex: most lines are one of a few shapes, and this runs
    once per line.
    """
    message = record.message
    first = message[:1]
    if first in ("R", "A", "F") and (match := _REQUEST.match(message)):
        what = match.group("what")
        _about_request(record, _REQUEST_EVENT[what], match, f"vllm {what} request <id>")
        if record.event == "request_received":
            record.fields = _received_fields(message)
        elif record.event == "request_aborted" and message[match.end() - 1 : match.end()] == ",":
            ids = message[match.start("rid") :].strip().rstrip(".").split(",")
            record.fields = {"request_ids": [rid.strip() for rid in ids if rid.strip()]}
        return
    if "throughput:" in message:
        record.event = "stats"
        record.template = "vllm stats"
        record.fields = _with_engine(message, key_values(message))
        return
    if "Iteration(" in message and (match := _ITERATION.search(message)) is not None:
        record.event = "iteration"
        record.template = "vllm iteration details"
        fields = _with_engine(message, {"iteration": int(match.group("iteration"))})
        for counted in _COUNTED.finditer(message):
            fields[normalise_key(counted.group("what"))] = int(counted.group("count"))
        fields.update(key_values(message[match.end() :]))
        record.fields = fields
        return
    if first == "S" and (match := _PREEMPTED_V0.match(message)):
        _about_request(record, "request_preempted", match, "vllm Sequence group <id> is preempted")
        preempted: dict = {"mode": match.group("mode").lower()}
        if cumulative := _CUMULATIVE.search(message):
            preempted["total_num_cumulative_preemption"] = int(cumulative.group("n"))
        record.fields = preempted
        return
    if first == "P" and (match := _RESUMED.match(message)):
        _about_request(
            record, "request_resumed", match, "vllm Preempted request <id> has been resumed"
        )
        return
    if "JIT compilation" in message and (match := _JIT.search(message)):
        record.event = "jit_compile"
        record.template = "vllm JIT compilation during inference"
        record.fields = {"kernel": match.group("kernel")}
        return
    if first == "I" and message.startswith(
        ("Initializing an LLM engine", "Initializing a V1 LLM engine")
    ):
        record.event = "engine_config"
        record.template = "vllm Initializing an LLM engine"


def _about_request(record: LogRecord, event: str, match: re.Match[str], template: str) -> None:
    """A line about one request (its id in group `rid`): event, id and template."""
    record.event, record.request_id, record.template = event, match.group("rid"), template


def from_access(access: re.Match[str], line: int) -> LogRecord:
    """The record of a uvicorn access line whose ACCESS matched; it prints no time."""
    record = LogRecord(access.string, line, "uvicorn", level=access.group("level"))
    fill_access(record, access)
    return record


def fill_access(record: LogRecord, match: re.Match[str]) -> None:
    record.event = "http_access"
    record.message = match.string
    record.template = f"http {match.group('method')} {match.group('path')} <status>"
    record.fields = {
        "client": match.group("client"),
        "method": match.group("method"),
        "path": match.group("path"),
        "status": int(match.group("status")),
    }


def process_fields(match: re.Match[str]) -> tuple[str, int, int, str]:
    """(process tag, pid, rank or -1, host ip or "") from a `(Name pid=N)` prefix match."""
    process = match.group("process")
    rank_match = _PROCESS_RANK.search(process)
    return (
        process,
        int(match.group("pid")),
        int(rank_match.group(1)) if rank_match else -1,
        match.group("ip") or "",
    )


def _with_engine(message: str, fields: dict) -> dict:
    if match := _ENGINE.match(message):
        return {"engine": int(match.group("engine")), **fields}
    return fields


def _received_fields(message: str) -> dict | None:
    fields: dict = {}
    if "prompt_token_ids: [" in message and (match := _PROMPT_IDS.search(message)):
        ids = match.group("ids").strip()
        fields["prompt_tokens"] = ids.count(",") + 1 if ids else 0
    if "max_tokens=" in message and (match := _MAX_TOKENS.search(message)):
        fields["max_tokens"] = int(match.group("n"))
    return fields or None
