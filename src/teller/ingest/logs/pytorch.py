"""PyTorch's own C++ log lines, above all the NCCL watchdog that reports a hung collective.

Shapes::

    [rank3]:[E1001 16:06:04.889919061 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 3] Timeout at NCCL work: 1, …
    [E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, …) ran for 600020 milliseconds before timing out.

The glog-style header gives severity, month/day and a nanosecond time (older builds print no time);
the watchdog message names the collective's sequence number and kind, which ties a hang to the
collective instance in the trace.
"""

from __future__ import annotations

import re

from teller.ingest.logs.table import LogRecord, second_of_day

#: glog's `[rank3]:[E1001 16:06:04.889919061 ProcessGroupNCCL.cpp:1709] message`.
HEADER = re.compile(
    r"""
    ^(?:\[rank(?P<rank>\d+)\]:)?                # torchrun's rank prefix
    \[(?P<severity>[IWEF])
    (?:(?P<month>\d\d)(?P<day>\d\d)             # month and day, then the time to the ns
       [ ](?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)\.(?P<frac>\d{1,9}))?
    (?:[ ]\d+)?                                 # a thread id
    [ ]?(?P<source>[\w./\-]+:\d+)\]
    [ ]?(?P<message>.*)$
    """,
    re.DOTALL | re.VERBOSE,
)
_SEVERITY = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
#: `[PG 0 (default_pg) Rank 3]` or `[Rank 3]`.
_MESSAGE_RANK = re.compile(
    r"""
    \[(?:PG[ ](?P<pg>\d+)[ ]\((?P<pg_name>[^)]*)\)[ ])?   # process group number and name
    Rank[ ](?P<rank>\d+)\]
    """,
    re.VERBOSE,
)
_WORK_COUNTERS = re.compile(
    r"""
    Timeout[ ]at[ ]NCCL[ ]work:[ ](?P<seq>-?\d+),[ ]
    last[ ]enqueued[ ]NCCL[ ]work:[ ](?P<enqueued>-?\d+),[ ]
    last[ ]completed[ ]NCCL[ ]work:[ ](?P<completed>-?\d+)
    """,
    re.VERBOSE,
)
#: `WorkNCCL(SeqNum=1, OpType=ALLREDUCE, …, Timeout(ms)=600000) ran for 600020 milliseconds`.
_WORK = re.compile(
    r"""
    WorkNCCL\(SeqNum=(?P<seq>\d+),[ ]OpType=(?P<op>\w+)
    (?:.*?Timeout\(ms\)=(?P<timeout>\d+))?\)            # the timeout, where printed
    (?:[ ]ran[ ]for[ ](?P<ran>\d+)[ ]milliseconds)?
    """,
    re.VERBOSE,
)


def from_header(header: re.Match[str], line: int) -> LogRecord:
    """The record of a PyTorch C++ log line whose HEADER matched."""
    g = header.group
    record = LogRecord(header.string, line, "pytorch", source=g("source"), message=g("message"))
    record.level = _SEVERITY[g("severity")]
    record.rank = int(g("rank")) if g("rank") else -1
    if frac := g("frac"):
        month, day = int(g("month")), int(g("day"))
        time_of_day = second_of_day(g("h"), g("m"), g("s"))
        record.clock = (None, month, day, time_of_day, int(frac.ljust(9, "0")[:9]))
    message = record.message
    tag = _MESSAGE_RANK.search(message)
    if record.rank < 0 and tag:
        record.rank = int(tag.group("rank"))
    if "Timeout at NCCL work" in message or "collective operation timeout" in message:
        record.event = "nccl_timeout"
        record.template = "pytorch NCCL watchdog timeout"
        fields: dict = {}
        if tag and tag.group("pg") is not None:
            fields["pg"], fields["pg_name"] = int(tag.group("pg")), tag.group("pg_name")
        if work := _WORK.search(message):
            fields["seq"] = int(work.group("seq"))
            fields["op_type"] = work.group("op").lower()
            if work.group("timeout"):
                fields["timeout_ms"] = int(work.group("timeout"))
            if work.group("ran"):
                fields["ran_for_ms"] = int(work.group("ran"))
        elif counters := _WORK_COUNTERS.search(message):
            fields["seq"] = int(counters.group("seq"))
            fields["last_enqueued_seq"] = int(counters.group("enqueued"))
            fields["last_completed_seq"] = int(counters.group("completed"))
        record.fields = fields or None
    return record
