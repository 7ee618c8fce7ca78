"""The engine-log quantities later stages read, as typed columns: one table of engine field names.

Engines print the same few facts under their own names and units: vLLM's `GPU KV cache usage:
45.2%`, SGLang's `token usage: 0.45` and TensorRT-LLM's free and total KV blocks all state the KV
cache's fill. `ENGINE_FIELDS` is the one place that knows those names: each row maps a field (as
`teller.ingest.logs.fields` normalises it) to a typed column, with the scale from the printed unit
to the column's. Alignment and the model read the columns; `fields` stays for display.

A field's name says what it holds whichever reader produced it, so every record is looked up by
name: a vLLM stats line behind a prefix no reader knows is template-mined, and its `GPU KV cache
usage` still fills `kv_cache_fill`. Where a record has several fields for one column, the first in
table order wins; a value of the wrong kind (a count that is not an integer, a flag) fills nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fraction(value: object, scale: float) -> float | None:
    """A share, clipped to [0, 1] (an engine's rounding can print 100.1%)."""
    return min(max(value * scale, 0.0), 1.0) if _is_number(value) else None  # type: ignore[operator]


def _count(value: object, scale: float) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _nanoseconds(value: object, scale: float) -> int | None:
    return round(value * scale) if _is_number(value) else None  # type: ignore[operator]


def _name(value: object, scale: float) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Quantity:
    """A typed column: its Arrow type, how a printed value becomes it, and what it holds."""

    type: pa.DataType
    convert: Callable[[object, float], object]
    meaning: str


#: The typed columns, in table order (null where the record does not state them).
QUANTITIES: dict[str, Quantity] = {
    "kv_cache_fill": Quantity(pa.float64(), _fraction, "share of the KV cache in use, 0-1"),
    "requests_running": Quantity(pa.int64(), _count, "requests the engine is running"),
    "requests_waiting": Quantity(pa.int64(), _count, "requests queued for admission"),
    "context_requests": Quantity(pa.int64(), _count, "requests in the step's prefill phase"),
    "generation_requests": Quantity(pa.int64(), _count, "requests in the step's decode phase"),
    "iteration_counter": Quantity(pa.int64(), _count, "the engine's own iteration number"),
    "iteration_elapsed_ns": Quantity(pa.int64(), _nanoseconds, "how long the iteration took"),
    "collective_seq": Quantity(pa.int64(), _count, "a collective's number in its process group"),
    "process_group": Quantity(
        pa.string(), _name, "the group's name (a trace's `Process Group Name`)"
    ),
    "process_group_desc": Quantity(pa.string(), _name, "its description: `default_pg`, `tp`"),
}


@dataclass(frozen=True)
class EngineField:
    """One engine's name for a quantity: the `fields` key, its column, and the unit's scale."""

    engine: str  # who prints it ("any": no one engine's name)
    field: str
    column: str  # a key of QUANTITIES
    scale: float = 1.0


ENGINE_FIELDS: tuple[EngineField, ...] = (
    # vLLM `GPU KV cache usage: 45.2%`, `KV cache usage: 45.2%`, SGLang `token usage: 0.45`,
    # `KV cache usage: 0.45`; TensorRT-LLM states blocks instead (KV_BLOCK_FIELDS)
    EngineField("vLLM", "gpu_kv_cache_usage_pct", "kv_cache_fill", 0.01),
    EngineField("any", "kv_cache_usage_pct", "kv_cache_fill", 0.01),
    EngineField("SGLang", "token_usage", "kv_cache_fill"),
    EngineField("any", "kv_cache_usage", "kv_cache_fill"),
    # vLLM `Running: 7 reqs`, SGLang `#running-req: 8`, TensorRT-LLM `"Active Request Count":249`
    EngineField("vLLM", "running", "requests_running"),
    EngineField("SGLang", "running_req", "requests_running"),
    EngineField("TensorRT-LLM", "active_request_count", "requests_running"),
    # vLLM V1 `Waiting: 0 reqs`, V0 `Pending: 0 reqs`, SGLang `#queue-req: 0`
    EngineField("vLLM", "waiting", "requests_waiting"),
    EngineField("vLLM", "pending", "requests_waiting"),
    EngineField("SGLang", "queue_req", "requests_waiting"),
    # vLLM `Iteration(42): 3 context requests, … 0 generation requests, … iteration elapsed time:
    # 187.32 ms`; TensorRT-LLM `"Context Requests":8`, `"Generation Requests":231`,
    # `"Iteration Counter":90`
    EngineField("vLLM, TensorRT-LLM", "context_requests", "context_requests"),
    EngineField("vLLM, TensorRT-LLM", "generation_requests", "generation_requests"),
    EngineField("vLLM", "iteration", "iteration_counter"),
    EngineField("TensorRT-LLM", "iteration_counter", "iteration_counter"),
    EngineField("vLLM", "iteration_elapsed_time_ms", "iteration_elapsed_ns", 1e6),
    # PyTorch's NCCL watchdog: `[PG 0 (default_pg) Rank 3]`, `WorkNCCL(SeqNum=1, …)` or
    # `Timeout at NCCL work: 1`
    EngineField("PyTorch", "seq", "collective_seq"),
    EngineField("PyTorch", "pg", "process_group"),
    EngineField("PyTorch", "pg_name", "process_group_desc"),
)

#: TensorRT-LLM's `"Free KV cache blocks":0`, `"Max KV cache blocks":2448`: the fill is
#: 1 − free/total, where no field of ENGINE_FIELDS states it.
KV_BLOCK_FIELDS = ("free_kv_cache_blocks", "max_kv_cache_blocks")

COLUMNS: tuple[str, ...] = tuple(QUANTITIES)
_Rule = tuple[str, str, Callable[[object, float], object], float]  # field, column, convert, scale
_RULES: dict[str, tuple[int, _Rule]] = {
    row.field: (order, (row.field, row.column, QUANTITIES[row.column].convert, row.scale))
    for order, row in enumerate(ENGINE_FIELDS)
}
#: A record's field names (one line shape's, nearly always) → the rules that apply, in table
#: order: every stats line of an engine shares one, so each is worked out once.
_PLANS: dict[tuple[str, ...], tuple[_Rule, ...]] = {}
_PLAN_CACHE_SIZE = 10_000


def typed_values(fields: dict | None) -> dict[str, object]:
    """column → value for each quantity the record's fields state (empty when none)."""
    if not fields:
        return {}
    names = tuple(fields)
    plan = _PLANS.get(names)
    if plan is None:
        plan = tuple(rule for _, rule in sorted(_RULES[k] for k in names if k in _RULES))
        if len(_PLANS) < _PLAN_CACHE_SIZE:
            _PLANS[names] = plan
    values: dict[str, object] = {}
    if not plan and KV_BLOCK_FIELDS[0] not in fields:
        return values
    for field, column, convert, scale in plan:
        if column not in values and (value := convert(fields[field], scale)) is not None:
            values[column] = value
    if "kv_cache_fill" not in values and KV_BLOCK_FIELDS[0] in fields:
        free, total = (fields.get(key) for key in KV_BLOCK_FIELDS)
        if _is_number(free) and _is_number(total) and total > 0:  # type: ignore[operator]
            values["kv_cache_fill"] = _fraction(1.0 - free / total, 1.0)  # type: ignore[operator]
    return values
