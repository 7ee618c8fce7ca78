"""One line → one record: the engine reader whose header it matches, else the generic header.

Each engine reader is a header pattern and the function that builds a record from its match. The
line's first character picks which headers to try (a line is one of a few shapes, and this runs
once per line); a line no engine header matches gets the generic time/level header or none
(`templates.parse_generic`), and is template-mined later.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from teller.ingest.logs import pytorch, sglang, templates, trtllm, vllm
from teller.ingest.logs.table import LogRecord

EngineReader = tuple[re.Pattern[str], Callable[[re.Match[str], int], LogRecord]]

_VLLM: tuple[EngineReader, ...] = ((vllm.HEADER, vllm.from_header), (vllm.ACCESS, vllm.from_access))
_TRTLLM: tuple[EngineReader, ...] = ((trtllm.HEADER, trtllm.from_header),)
_SGLANG: tuple[EngineReader, ...] = ((sglang.HEADER, sglang.from_header),)
_PYTORCH: tuple[EngineReader, ...] = ((pytorch.HEADER, pytorch.from_header),)


def _candidates(text: str) -> tuple[EngineReader, ...]:
    """The engine readers whose header can start with the line's first character."""
    first = text[:1]
    if first == "[":
        if text.startswith("[TensorRT-LLM]"):
            return _TRTLLM
        return _SGLANG if text[1:2].isdigit() else _PYTORCH
    if first and first in "DIWEC":
        return _VLLM
    return ()


def parse_line(text: str, line: int) -> LogRecord:
    """The record for one line (collector and process prefixes already removed)."""
    for header, build in _candidates(text):
        if match := header.match(text):
            return build(match, line)
    return templates.parse_generic(text, line)
