"""Lines no engine parser knows: a generic time/level header, then template mining with drain3.

Unknown lines still carry structure (a fixed text with varying numbers and ids), so they get a
template (drain3, the maintained Drain implementation) whose *text* is hashed into the record's
template id: the same line shape gets the same id in every run, which drain's per-run cluster
counter would not give. Templates are read back only after every line was mined, so each record
gets its cluster's final, most general template, which depends on what else was read (a variant
line can generalise it). The masked line itself is hashed too, into a key that does not.
Numbers found in the line become fields.
"""

from __future__ import annotations

import re

from drain3 import TemplateMiner
from drain3.masking import MaskingInstruction
from drain3.template_miner_config import TemplateMinerConfig

from teller.ingest.logs.fields import key_values, loose_numbers
from teller.ingest.logs.table import LogRecord, second_of_day, template_id

#: `2025-02-27 04:46:39,123 INFO …`, `[2025-02-27T04:46:39.123Z] [WARN] …` and similar.
GENERIC_HEADER = re.compile(
    r"""
    ^\[?(?P<year>\d{4})-(?P<month>\d\d)-(?P<day>\d\d)       # an ISO date
    [ T](?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)                 # and time
    (?:[.,](?P<frac>\d{1,9}))?                              # sub-second part
    (?P<tz>Z|[+-]\d\d:?\d\d)?\]?                            # time zone
    [ ,:|-]*                                                # separators
    (?:\[?(?P<level>DEBUG|INFO|WARN|WARNING|ERROR|CRITICAL|FATAL)\]?[ :|-]+)?
    (?P<message>.*)$
    """,
    re.DOTALL | re.VERBOSE,
)
_LEVEL_ONLY = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<message>.*)$")
_LEVEL_NAMES = {"WARN": "WARNING", "FATAL": "CRITICAL"}

#: Ids, addresses and numbers are masked before mining so they never split a template.
MASKS: tuple[tuple[str, str], ...] = (
    (r"\b(?:chat)?cmpl-[\w-]+", "ID"),
    (r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b", "IP"),
    (r"\b0x[0-9a-fA-F]+\b", "HEX"),
    (r"\b[0-9a-f]{12,}\b", "HEX"),
    (r"(?<![A-Za-z_])-?\d+(?:\.\d+)?%?(?![A-Za-z_])", "NUM"),
)


def parse_generic(text: str, line: int) -> LogRecord:
    """Always a record: `generic` when a time was found at the start, else `unparsed`."""
    match = GENERIC_HEADER.match(text)
    if match is None:
        level_match = _LEVEL_ONLY.match(text)
        record = LogRecord(raw=text, line=line, format="unparsed", message=text)
        if level_match:
            record.level = level_match.group("level")
        record.fields = numeric_fields(text)
        return record
    g = match.group
    frac, tz = g("frac"), g("tz")
    time_of_day = second_of_day(g("h"), g("m"), g("s"))
    level = g("level") or ""
    record = LogRecord(
        raw=text,
        line=line,
        format="generic",
        level=_LEVEL_NAMES.get(level, level),
        message=g("message"),
        clock=(
            int(g("year")),
            int(g("month")),
            int(g("day")),
            None if time_of_day is None else time_of_day - _tz_seconds(tz),
            int(frac.ljust(9, "0")) if frac else None,
        ),
    )
    record.fields = numeric_fields(record.message)
    return record


def numeric_fields(message: str) -> dict | None:
    """Named `key: number` pairs if the line has them, else its bare numbers in order."""
    named = key_values(message)
    if named:
        return named
    numbers = loose_numbers(message)
    return {"numbers": numbers} if numbers else None


class Templates:
    """One drain3 miner for all the files of a read, so one shape gets one template across them."""

    def __init__(self) -> None:
        config = TemplateMinerConfig()
        config.masking_instructions = [MaskingInstruction(p, name) for p, name in MASKS]
        config.drain_sim_th = 0.5
        config.profiling_enabled = False
        self._miner = TemplateMiner(config=config)
        self._cache: dict[int, str] = {}
        self._keys: dict[str, int] = {}

    def add(self, message: str) -> tuple[int, int]:
        """Mine one message: (its cluster id, resolved with `template`; its masked text's key).

        The key hashes the message with ids and numbers masked, before drain generalises it, so
        it does not depend on what else was mined (the cluster's final template does).
        """
        masked = self._miner.masker.mask(message.strip() or "<empty>")
        key = self._keys.get(masked)
        if key is None:
            key = self._keys.setdefault(masked, template_id(masked))
        cluster, _ = self._miner.drain.add_log_message(masked)
        return cluster.cluster_id, key

    def template(self, cluster: int) -> str:
        """The cluster's final template text (call after every message was added)."""
        text = self._cache.get(cluster)
        if text is None:
            text = self._miner.drain.id_to_cluster[cluster].get_template()
            self._cache[cluster] = text
        return text


def _tz_seconds(tz: str | None) -> int:
    if not tz or tz == "Z":
        return 0
    sign = -1 if tz[0] == "-" else 1
    digits = tz[1:].replace(":", "")
    return sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)
