"""SGLang scheduler lines: `[date time TP0 EP0] Prefill batch. …` / `Decode batch, …`.

SGLang prints no request ids; its batch lines (every `--decode-log-interval` steps) carry the
running/queued request counts, token usage and throughput, which is what step-level alignment
needs. A decode step that found no free KV slot prints `KV cache pool is full. Retract
requests. #retracted_reqs: N, …`: a preemption of N requests. The bracket holds an optional
date, the time (no sub-second part) and rank tags (`TP0`, `EP0`, `DP1`, `PP0`); field names
changed across versions (`#token` vs `#full token`, `.` vs `,` after the batch kind), so
fields are parsed as generic `key: value` pairs.
"""

from __future__ import annotations

import re

from teller.ingest.logs.fields import key_values
from teller.ingest.logs.table import LogRecord, second_of_day
from teller.ingest.logs.vllm import ACCESS, fill_access

HEADER = re.compile(
    r"""
    ^\[(?:(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d)[ ])?    # an optional date
    (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)                         # the time, to the second
    (?P<tags>(?:[ ](?:TP|DP|EP|PP|CP|RANK)\d+)*)                # rank tags: TP0 EP0 …
    \][ ](?P<message>.*)$
    """,
    re.DOTALL | re.VERBOSE,
)
_TAG = re.compile(r"(TP|DP|EP|PP|CP|RANK)(\d+)")
_BATCH = re.compile(r"^(?P<kind>Prefill|Decode) batch[.,]")
#: The scheduler's word that a decode step found no free KV slot and sent running requests back
#: to the queue (`#retracted_reqs: N`): SGLang's preemption.
_RETRACT = re.compile(r"^KV cache pool is full\. Retract requests\.")
_LEVEL = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")


def from_header(header: re.Match[str], line: int) -> LogRecord:
    """The record of an SGLang line whose HEADER matched."""
    g = header.group
    year, tags = g("year"), g("tags").strip()
    dated = year is not None
    record = LogRecord(header.string, line, "sglang", process=tags, message=g("message"))
    record.clock = (
        int(year) if dated else None,
        int(g("month")) if dated else None,
        int(g("day")) if dated else None,
        second_of_day(g("h"), g("m"), g("s")),
        None,
    )
    tag_values = {name.lower(): int(value) for name, value in _TAG.findall(tags)}
    record.rank = tag_values.get("rank", tag_values.get("tp", -1))
    message = record.message
    if batch := _BATCH.match(message):
        kind = batch.group("kind").lower()
        record.event = f"{kind}_batch"
        record.template = f"sglang {kind} batch"
        record.level = "INFO"
        record.fields = {**tag_values, **key_values(message[batch.end() :])}
    elif retract := _RETRACT.match(message):
        record.event = "request_preempted"
        record.template = "sglang KV cache pool is full. Retract requests."
        record.level = "WARNING"
        record.fields = {**tag_values, **key_values(message[retract.end() :])}
    elif access := ACCESS.match(message):
        fill_access(record, access)
        record.level = access.group("level")
    elif level := _LEVEL.match(message):
        record.level = level.group("level")
    return record
