"""Find engine steps (scheduler iterations) in a call-chain forest.

A step is the unit TELLER diagnoses, so finding it reliably matters more than anything else in the
tree. Engines mark steps with annotations, and the batch composition they carry (how many prefill
and decode requests and tokens) is what later stages compare steps by:

* PyTorch `ProfilerStep#N` (any `profiler.step()` loop);
* vLLM `execute_[T_]context_N(…)_generation_M(…)` (the GPU model runner's step annotation; the
  lab writes the same shape);
* SGLang `step[EXTEND bs=15 toks=15360]`.

A user-supplied regex overrides them. Only the outermost match on a thread is a step; a nested
match (SGLang writes both shapes, one inside the other) enriches its batch facts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa

from teller.ingest.schema import LAYER_CODE

PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
VLLM_STEP = re.compile(
    r"^execute_(?:(?P<tokens>\d+)_)?context_(?P<ctx>\d+)\((?P<ctx_args>[^)]*)\)"
    r"_generation_(?P<gen>\d+)\((?P<gen_args>[^)]*)\)"
)
SGLANG_STEP = re.compile(
    r"^step\[(?P<mode>[A-Z_]+)?\s*(?:bs=(?P<bs>\d+))?\s*(?:toks=(?P<toks>\d+))?.*\]$"
)
_FIRST_NUMBER = re.compile(r"(\d+)")


@dataclass
class StepTable:
    """One row per step: which rank, where, and the batch composition its annotation states."""

    rank: np.ndarray
    index: np.ndarray  # ordinal of the step on its rank, in time order
    node: np.ndarray  # the step's annotation node
    start_ns: np.ndarray
    dur_ns: np.ndarray
    name: list[str]
    kind: list[str]  # prefill | decode | mixed | profiler_step | step
    context_requests: np.ndarray  # -1 when the annotation does not say
    context_tokens: np.ndarray
    generation_requests: np.ndarray
    generation_tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.rank)

    def to_arrow(self) -> pa.Table:
        return pa.table({f.name: getattr(self, f.name) for f in fields(self)})


@dataclass
class _StepFacts:
    kind: str = "step"
    context_requests: int = -1
    context_tokens: int = -1
    generation_requests: int = -1
    generation_tokens: int = -1

    def fill_from(self, other: _StepFacts) -> None:
        for f in fields(self):
            if f.name != "kind" and getattr(self, f.name) < 0:
                setattr(self, f.name, getattr(other, f.name))
        if self.kind in ("step", "profiler_step"):
            self.kind = other.kind


def parse_step_name(name: str, custom: re.Pattern[str] | None = None) -> _StepFacts | None:
    """Batch facts from a step annotation's name, or None if the name is not a step."""
    if custom is not None:
        return _StepFacts("step") if custom.search(name) else None
    if match := VLLM_STEP.match(name):
        ctx, gen = int(match["ctx"]), int(match["gen"])
        ctx_tokens = _tokens(match["ctx_args"], ctx)
        gen_tokens = _tokens(match["gen_args"], gen)
        return _StepFacts(_kind(ctx, gen), ctx, ctx_tokens, gen, gen_tokens)
    if match := SGLANG_STEP.match(name):
        mode = (match["mode"] or "").upper()
        bs = int(match["bs"]) if match["bs"] else -1
        toks = int(match["toks"]) if match["toks"] else -1
        if mode in ("DECODE", "IDLE"):
            return _StepFacts("decode", 0, 0, bs, toks)
        if mode in ("EXTEND", "PREFILL"):
            return _StepFacts("prefill", bs, toks, 0, 0)
        return _StepFacts("mixed" if mode == "MIXED" else "step", -1, toks, -1, -1)
    if PROFILER_STEP.match(name):
        return _StepFacts("profiler_step")
    return None


def _tokens(args: str, requests: int) -> int:
    """Token count from the parenthesised part: a bare count (lab) or vLLM's `sq<N>…` detail."""
    if requests == 0:
        return 0
    match = _FIRST_NUMBER.search(args)
    return int(match.group(1)) if match else -1


def _kind(context_requests: int, generation_requests: int) -> str:
    if context_requests and generation_requests:
        return "mixed"
    return "prefill" if context_requests else "decode"


def _assign_by_window(
    step: np.ndarray,
    rank: np.ndarray,
    start: np.ndarray,
    step_node: np.ndarray,
    step_start: np.ndarray,
    step_dur: np.ndarray,
) -> None:
    """Nodes outside any step's subtree (worker threads, unlaunched GPU work) join the step of
    their rank whose window contains their start, so a step's view holds all its rank's work."""
    orphans = np.flatnonzero(step < 0)
    if not len(orphans) or not len(step_node):
        return
    step_rank = rank[step_node]
    for r in np.unique(step_rank).tolist():
        ids = np.flatnonzero(step_rank == r)  # already in time order
        mine = orphans[rank[orphans] == r]
        if not len(mine):
            continue
        position = np.searchsorted(step_start[ids], start[mine], side="right") - 1
        valid = position >= 0
        candidate = ids[np.where(valid, position, 0)]
        inside = valid & (start[mine] < step_start[candidate] + step_dur[candidate])
        step[mine[inside]] = candidate[inside]


def find_steps(
    names: list[str],
    name: np.ndarray,
    layer: np.ndarray,
    rank: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    on_gpu: np.ndarray,
    step_regex: str | re.Pattern[str] | None = None,
) -> tuple[StepTable, np.ndarray]:
    """Return the step table and, per node, the index of the step it belongs to (-1 if none)."""
    custom = re.compile(step_regex) if isinstance(step_regex, str) else step_regex
    facts_by_name: dict[int, _StepFacts | None] = {}
    engine_code = LAYER_CODE["engine"]
    count = len(parent)
    step_of = [-1] * count
    parents = parent.tolist()
    is_engine = ((layer == engine_code) & ~on_gpu).tolist()
    name_ids = name.tolist()
    step_nodes: list[int] = []
    step_facts: list[_StepFacts] = []
    for i in range(count):
        p = parents[i]
        inherited = step_of[p] if p >= 0 else -1
        if is_engine[i]:
            name_id = name_ids[i]
            if name_id not in facts_by_name:
                facts_by_name[name_id] = parse_step_name(names[name_id], custom)
            facts = facts_by_name[name_id]
            if facts is not None:
                if inherited < 0:
                    step_of[i] = len(step_nodes)
                    step_nodes.append(i)
                    step_facts.append(_StepFacts(**facts.__dict__))
                    continue
                step_facts[inherited].fill_from(facts)
        step_of[i] = inherited
    node = np.asarray(step_nodes, dtype=np.int64)
    # number steps per rank in time order, and renumber nodes' step ids to match the sorted table
    order = np.lexsort((start[node], rank[node])) if len(node) else node
    renumber = np.empty(len(node), dtype=np.int64)
    renumber[order] = np.arange(len(node))
    step = np.asarray(step_of, dtype=np.int64)
    has_step = step >= 0
    step[has_step] = renumber[step[has_step]]
    node = node[order]
    _assign_by_window(step, rank, start, node, start[node], dur[node])
    facts_sorted = [step_facts[k] for k in order.tolist()]
    step_rank = rank[node].astype(np.int32)
    index = np.zeros(len(node), dtype=np.int64)
    for k in range(1, len(node)):
        index[k] = index[k - 1] + 1 if step_rank[k] == step_rank[k - 1] else 0
    table = StepTable(
        rank=step_rank,
        index=index,
        node=node,
        start_ns=start[node],
        dur_ns=dur[node],
        name=[names[name_ids[n]] for n in node.tolist()],
        kind=[f.kind for f in facts_sorted],
        context_requests=np.asarray([f.context_requests for f in facts_sorted], dtype=np.int64),
        context_tokens=np.asarray([f.context_tokens for f in facts_sorted], dtype=np.int64),
        generation_requests=np.asarray(
            [f.generation_requests for f in facts_sorted], dtype=np.int64
        ),
        generation_tokens=np.asarray([f.generation_tokens for f in facts_sorted], dtype=np.int64),
    )
    return table, step
