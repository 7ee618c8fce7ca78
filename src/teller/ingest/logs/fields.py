"""`key: value` pairs out of a log message, with keys normalised so every engine's stats read alike.

Engines print their periodic stats as comma-separated `Key: number unit` pairs (vLLM's `Running: 7
reqs`, SGLang's `#running-req: 8`, `gen throughput (token/s): 186.64`); one parser turns all of
them into `{"running_reqs": 7}`-style fields: lower case, `#` dropped, non-alphanumerics to `_`, the
unit appended where it tells the quantity apart (`_pct` for %, `_tokens_per_s`).
"""

from __future__ import annotations

import re

#: One comma-separated part: `Key: number [unit]`, the key being the last words before the colon.
_PART = re.compile(
    r"(?P<key>[#A-Za-z][^:=,]*?)\s*[:=]\s*"
    r"(?P<value>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|True|False)"
    r"\s*(?P<unit>%|tokens/s|reqs|ms|s|GiB|MiB|GB|MB)?[\s.;)]*$"
)
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
    """Every `key: number [unit]` part of a comma-separated message, in order; later keys win."""
    fields: dict[str, int | float | bool] = {}
    for part in message.split(","):
        match = _PART.search(part)
        if match is None:
            continue
        raw_key, value, unit = match.groups()
        key = _KEY_CACHE.get((raw_key, unit))
        if key is None:
            key = normalise_key(raw_key)
            if unit in _UNIT_SUFFIX and key and not key.endswith(_UNIT_SUFFIX[unit]):
                key += _UNIT_SUFFIX[unit]
            if len(_KEY_CACHE) < 10_000:
                _KEY_CACHE[(raw_key, unit)] = key
        if key:
            fields[key] = number(value)
    return fields


def loose_numbers(message: str) -> list[int | float]:
    """Standalone numbers in a message, for template-mined lines whose keys are unknown."""
    return [number(m) for m in _NUMBER.findall(message)]  # type: ignore[misc]
