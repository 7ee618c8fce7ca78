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

A trace without them still has iterations. Steps are found by the first of these rules that
finds any (each step records which, in `StepTable.found_by`):

1. engine annotations and `ProfilerStep#N`, as above ("engine annotation", "ProfilerStep"), or the
   user's regex ("step regex");
2. a user/GPU annotation or NVTX range that repeats at one nesting level and is clearly the
   iteration (`ranges.py`: "repeated range 'NAME'"); every repeated range is offered by name in a
   warning either way, so a user can pass the right one as the step regex;
3. the period of the rank's top-level operation sequence (`periods.py`: "period of top-level
   sequence").

Rules 2 and 3 run only when rule 1 finds nothing in the whole run, so a trace with engine steps is
read exactly as before. A step found by its period has no annotation node: its `node` is the
iteration's first top-level operation, and its window runs to the next iteration's start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa

from teller.callchain.engines import (
    ENGINE_STEP_BASE,
    EnginePlace,
    StepNumbering,
    describe_engines,
    group_ranks,
    step_base,
)
from teller.callchain.periods import RankIterations, iterations_on_rank
from teller.callchain.ranges import (
    RepeatedRange,
    describe_candidates,
    instance_of_nodes,
    pick_iteration_ranges,
    repeated_ranges,
)
from teller.callchain.work import Forest, NodeWork, node_work
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
#: How a step was found (`StepTable.found_by`), in the order the rules are tried.
FOUND_BY_ENGINE = "engine annotation"
FOUND_BY_PROFILER_STEP = "ProfilerStep"
FOUND_BY_REGEX = "step regex"
FOUND_BY_PERIOD = "period of top-level sequence"
FOUND_BY_CAPTURE = "whole capture (nothing repeats)"
BUILT_IN_STEPS = "ProfilerStep#N, vLLM execute_…, SGLang step[…]"


def found_by_range(name: str) -> str:
    return f"repeated range '{name}'"


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
    found_by: list[str]  # FOUND_BY_* or found_by_range(name): which rule found the step
    engine: np.ndarray  # which engine's iteration the step is (`engines.py`); 0 in most runs
    #: engine e's steps are numbered from e × engine_base (`engines.step_base`)
    engine_base: int = ENGINE_STEP_BASE

    def __len__(self) -> int:
        return len(self.rank)

    def step_ids(self, rank: int | None, iterations: Iterable[int]) -> list[int]:
        """The ids of `rank`'s engine's `iterations` (as its logs and labels count them, from 0);
        engine 0's where `rank` is None or has no step."""
        engine = 0
        if rank is not None:
            hits = np.flatnonzero(self.rank == rank)
            if len(hits):
                engine = int(self.engine[hits[0]])
        return [engine * self.engine_base + int(i) for i in iterations]

    @classmethod
    def empty(cls) -> StepTable:
        none = np.zeros(0, dtype=np.int64)
        return cls(
            rank=none.astype(np.int32),
            index=none,
            node=none,
            start_ns=none,
            dur_ns=none,
            name=[],
            kind=[],
            context_requests=none,
            context_tokens=none,
            generation_requests=none,
            generation_tokens=none,
            found_by=[],
            engine=none,
        )

    def to_arrow(self) -> pa.Table:
        return pa.table(
            {f.name: getattr(self, f.name) for f in fields(self) if f.name != "engine_base"}
        )

    @classmethod
    def joined(cls, tables: list[StepTable], engine_base: int) -> StepTable:
        """Several tables' rows as one, in the order given (their `node`s index their own
        trees)."""
        columns: dict[str, object] = {}
        for f in fields(cls):
            if f.name == "engine_base":
                continue
            parts = [getattr(t, f.name) for t in tables]
            if isinstance(parts[0], list):
                columns[f.name] = [v for part in parts for v in part]
            else:
                columns[f.name] = np.concatenate(parts)
        return cls(**columns, engine_base=engine_base)


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


#: Step kinds an engine's batch defines: a step's time is predicted from its batch's composition.
#: Other kinds (a profiler step, a user range, a period, the whole capture) are compared with the
#: run's other steps of their kind.
BATCHED_STEP_KINDS = frozenset({"prefill", "decode", "mixed"})


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
    tree: Forest,
    step_regex: str | re.Pattern[str] | None = None,
    place: EnginePlace | None = None,
    numbering: StepNumbering | None = None,
) -> tuple[StepTable, np.ndarray, list[str]]:
    """The step table, per node the index of its step (-1 if none), and what the search found
    worth telling the user (which rule named the steps, which ranges could name them). With
    `place`, the tree is one engine of a larger run and its steps are numbered as that run's;
    with `numbering`, it is one time window of a run (`windows.py`), numbered likewise."""
    custom = re.compile(step_regex) if isinstance(step_regex, str) else step_regex
    table, step = _annotated_steps(
        tree.names,
        tree.name,
        tree.layer,
        tree.rank,
        tree.start,
        tree.dur,
        tree.parent,
        tree.stream >= 0,
        custom,
    )
    if len(table) or not len(tree):
        return table, step, number_engines(table, place, numbering)
    work = node_work(
        tree.names, tree.name, tree.layer, tree.rank, tree.stream, tree.dur, tree.parent, tree.depth
    )
    candidates = repeated_ranges(tree, work)
    offered = (
        f"repeated ranges that could name them: {describe_candidates(candidates)}"
        if candidates
        else "no annotation or NVTX range repeats"
    )
    if custom is not None:
        notes = [f"step regex {custom.pattern!r} matched no annotation or NVTX range; {offered}"]
        return table, step, notes
    missing = f"no step annotations found ({BUILT_IN_STEPS}); {offered}"
    notes = [f"{missing}; pass --step-regex to use one"]
    picked = pick_iteration_ranges(candidates, work.rank_has_gpu)
    found: list[_FoundSteps] = []
    for candidate in picked.values():
        found.append(_range_steps(tree, candidate, work))
        notes.append(
            f"rank {candidate.rank}: steps are the repeated range '{candidate.name}' "
            f"(×{candidate.count}, {candidate.work_share:.0%} of the work)"
        )
    for r in np.unique(tree.rank).tolist():
        if r in picked:
            continue
        iterations = iterations_on_rank(tree, r, work)
        if iterations is None:
            continue
        found.append(_period_steps(tree, iterations, work))
        anchor = tree.node_name(int(iterations.node[0]))
        notes.append(
            f"rank {r}: {len(iterations.node)} steps found from the period of the top-level "
            f"operation sequence (about {iterations.period.length} operations each, the first "
            f"'{anchor[:60]}'); check them with `teller tree --step N`, or name them with --step-regex"
        )
    if not found:
        notes = [
            f"{missing}; and the top-level operation sequence does not repeat as a loop does: "
            "the whole capture is one step on each rank (its layers and ranks are still compared); "
            "pass --step-regex naming the step's range"
        ]
        found = [_capture_step(tree, r) for r in np.unique(tree.rank).tolist()]
    table, step = _assemble(tree, found)
    return table, step, notes + number_engines(table, place, numbering)


def number_engines(
    table: StepTable, place: EnginePlace | None = None, numbering: StepNumbering | None = None
) -> list[str]:
    """Give each step its engine and offset the steps of every engine but the first
    (`engines.py`); the note a user gets when there is more than one. A tree that is `place`'s
    one engine gets that engine's number and offset instead. Also what numbers a split run's
    steps, joined from its files' own tables (`teller.callchain.split`). A time window's steps
    (`numbering`) count on from each rank's steps before the window, with the run's base."""
    if numbering is not None:
        table.index = table.index + numbering.shift(table.rank)
        table.engine_base = numbering.base
    engine_of = group_ranks(table.rank, table.name)
    if len(set(engine_of.values())) <= 1:
        if place is not None:
            table.engine = np.full(len(table), place.index, dtype=np.int64)
            table.engine_base = place.base
            table.index = table.index + place.index * place.base
        return []
    table.engine = np.asarray([engine_of[int(r)] for r in table.rank.tolist()], dtype=np.int64)
    table.engine_base = (
        numbering.base if numbering is not None else step_base(int(table.index.max()) + 1)
    )
    table.index = table.index + table.engine * table.engine_base
    return [describe_engines(engine_of, table.engine_base)]


@dataclass
class _FoundSteps:
    """Steps of one rank from rule 2 or 3, before the run's steps are numbered together."""

    node: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    name: list[str]
    found_by: str
    member_of: np.ndarray  # per node: which of these steps holds it, -1 for none


def _range_steps(tree: Forest, candidate: RepeatedRange, work: NodeWork) -> _FoundSteps:
    return _FoundSteps(
        node=candidate.nodes,
        start_ns=candidate.start_ns,
        end_ns=candidate.end_ns,
        name=[candidate.name] * candidate.count,
        found_by=found_by_range(candidate.name),
        member_of=instance_of_nodes(tree, candidate, work),
    )


def _period_steps(tree: Forest, iterations: RankIterations, work: NodeWork) -> _FoundSteps:
    """A top-level operation joins the window its start falls in, and its subtree joins with it."""
    tops = iterations.tops
    position = np.searchsorted(iterations.start_ns, tree.start[tops], side="right") - 1
    valid = position >= 0
    inside = valid & (tree.start[tops] < iterations.end_ns[np.maximum(position, 0)])
    iteration_of_top = np.full(len(tree), -1, dtype=np.int64)
    iteration_of_top[tops[inside]] = position[inside]
    has_top = work.top >= 0
    member_of = np.full(len(tree), -1, dtype=np.int64)
    member_of[has_top] = iteration_of_top[work.top[has_top]]
    return _FoundSteps(
        node=iterations.node,
        start_ns=iterations.start_ns,
        end_ns=iterations.end_ns,
        name=["iteration"] * len(iterations.node),
        found_by=FOUND_BY_PERIOD,
        member_of=member_of,
    )


def ordinal_per_rank(rank: np.ndarray) -> np.ndarray:
    """Each step's ordinal on its rank, for steps sorted by rank then time."""
    index = np.zeros(len(rank), dtype=np.int64)
    for k in range(1, len(rank)):
        index[k] = index[k - 1] + 1 if rank[k] == rank[k - 1] else 0
    return index


def _capture_step(tree: Forest, rank: int) -> _FoundSteps:
    """All of one rank's capture as one step: what a single forward (or a capture cut mid-loop)
    is, so that the comparisons inside a step, across its layers and ranks, still run."""
    mine = tree.rank == rank
    nodes = np.flatnonzero(mine)
    ends = tree.start[nodes] + tree.dur[nodes]
    member_of = np.where(mine, 0, -1).astype(np.int64)
    return _FoundSteps(
        node=nodes[:1],
        start_ns=np.asarray([tree.start[nodes].min()]),
        end_ns=np.asarray([ends.max()]),
        name=["whole capture"],
        found_by=FOUND_BY_CAPTURE,
        member_of=member_of,
    )


def _assemble(tree: Forest, found: list[_FoundSteps]) -> tuple[StepTable, np.ndarray]:
    """Number the steps per rank in time order and give every node its step."""
    node = np.concatenate([f.node for f in found]).astype(np.int64)
    start_ns = np.concatenate([f.start_ns for f in found]).astype(np.int64)
    dur_ns = np.concatenate([f.end_ns for f in found]).astype(np.int64) - start_ns
    name = [n for f in found for n in f.name]
    found_by = [f.found_by for f in found for _ in range(len(f.node))]
    rank = tree.rank[node].astype(np.int32)
    order = np.lexsort((start_ns, rank))
    renumber = np.empty(len(node), dtype=np.int64)
    renumber[order] = np.arange(len(node))
    step = np.full(len(tree), -1, dtype=np.int64)
    offset = 0
    for f in found:
        held = f.member_of >= 0
        step[held] = renumber[offset + f.member_of[held]]
        offset += len(f.node)
    node, start_ns, dur_ns, rank = node[order], start_ns[order], dur_ns[order], rank[order]
    _assign_by_window(step, tree.rank, tree.start, node, start_ns, dur_ns)
    index = ordinal_per_rank(rank)
    unknown = np.full(len(node), -1, dtype=np.int64)
    table = StepTable(
        rank=rank,
        index=index,
        node=node,
        start_ns=start_ns,
        dur_ns=dur_ns,
        name=[name[k] for k in order.tolist()],
        kind=["step"] * len(node),
        context_requests=unknown,
        context_tokens=unknown.copy(),
        generation_requests=unknown.copy(),
        generation_tokens=unknown.copy(),
        found_by=[found_by[k] for k in order.tolist()],
        engine=np.zeros(len(node), dtype=np.int64),
    )
    return table, step


def _annotated_steps(
    names: list[str],
    name: np.ndarray,
    layer: np.ndarray,
    rank: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    on_gpu: np.ndarray,
    custom: re.Pattern[str] | None,
) -> tuple[StepTable, np.ndarray]:
    """Rule 1: engine annotations, ProfilerStep#N, or the user's regex."""
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
    index = ordinal_per_rank(step_rank)
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
        found_by=[_found_by(names[name_ids[n]], custom) for n in node.tolist()],
        engine=np.zeros(len(node), dtype=np.int64),
    )
    return table, step


def _found_by(step_name: str, custom: re.Pattern[str] | None) -> str:
    if custom is not None:
        return FOUND_BY_REGEX
    return FOUND_BY_PROFILER_STEP if PROFILER_STEP.match(step_name) else FOUND_BY_ENGINE
