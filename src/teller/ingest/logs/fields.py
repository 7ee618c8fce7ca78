"""`key: value` pairs out of a log message, with keys normalised so every engine's stats read alike.

Engines print their periodic stats as comma-separated `Key: number unit` pairs (vLLM's `Running: 7
reqs`, SGLang's `#running-req: 8`, `gen throughput (token/s): 186.64`); one parser turns all of
them into `{"running_reqs": 7}`-style fields: lower case, `#` dropped, non-alphanumerics to `_`, the
unit appended where it tells the quantity apart (`_pct` for %, `_tokens_per_s`).
"""

from __future__ import annotations

import re

#: What follows a part's last `:`/`=`: a number (or bool), an optional unit, nothing else.
_VALUE = re.compile(
    r"""
    \s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|True|False)   # the number or flag
    \s*(%|tokens/s|reqs|ms|s|GiB|MiB|GB|MB)?               # its unit
    [\s.;)]*$                                            # trailing punctuation
    """,
    re.VERBOSE,
)
#: A key is the words after the last of these inside its part (`Engine 000: Avg …`, `[PG 0] …`).
_KEY_STARTS = (":", "]", ". ")
_NON_WORD = re.compile(r"[^a-z0-9]+")
_UNIT_SUFFIX = {"%": "_pct", "tokens/s": "_tokens_per_s", "ms": "_ms", "s": "_s"}
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")
#: Keys repeat on every stats line; normalising each once keeps the per-line cost down.
_KEY_CACHE: dict[tuple[str, str | None], str] = {}


def normalise_key(key: str) -> str:
    """`#running-req` → `running_req`, `gen throughput (token/s)` → `gen_throughput_token_s`."""
    return _NON_WORD.sub("_", key.lower()).strip("_")


def number(text: str) -> int | float | bool:
    if text in ("True", "False"):
        return text == "True"
    if "." in text or "e" in text or "E" in text:
        return float(text)
    return int(text)


def key_values(message: str) -> dict[str, int | float | bool]:
    """Every `key: number [unit]` part of a comma-separated message, in order; later keys win.

    Plain string cuts rather than one regex over the part: this runs on every stats and
    iteration line, and a regex that has to find where a key starts backtracks quadratically.
    """
    fields: dict[str, int | float | bool] = {}
    for part in message.split(","):
        cut = max(part.rfind(":"), part.rfind("="))
        if cut <= 0:
            continue
        match = _VALUE.match(part, cut + 1)
        if match is None:
            continue
        raw_key = part[:cut]
        for start in _KEY_STARTS:
            raw_key = raw_key.rsplit(start, 1)[-1]
        value, unit = match.groups()
        key = _KEY_CACHE.get((raw_key, unit))
        if key is None:
            stripped = raw_key.strip()
            key = normalise_key(stripped) if stripped[:1].isalpha() or stripped[:1] == "#" else ""
            if key and unit in _UNIT_SUFFIX and not key.endswith(_UNIT_SUFFIX[unit]):
                key += _UNIT_SUFFIX[unit]
            if len(_KEY_CACHE) < 10_000:
                _KEY_CACHE[(raw_key, unit)] = key
        if key:
            fields[key] = number(value)
    return fields


def loose_numbers(message: str) -> list[int | float]:
    """Standalone numbers in a message, for template-mined lines whose keys are unknown."""
    return [number(m) for m in _NUMBER.findall(message)]  # type: ignore[misc]
