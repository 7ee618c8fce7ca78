"""Which ranks run one engine, so that a step is compared only with its own engine's ranks.

A trace folder can hold several data-parallel engines (replicas): each schedules its own batches,
so its n-th step has nothing to do with another engine's n-th step, and comparing them makes a
busy replica's prefill look like a slow step of an idle one. The ranks of one engine (its tensor-
and pipeline-parallel workers) run the same scheduler iterations, and the step annotations that
state a batch (vLLM's `execute_…`, SGLang's `step[…]`) name the same batch on each of them; other
engines' name other batches. Collectives cannot tell engines apart: each engine's process groups
restart their names and sequence numbers, so two engines' all-reduces join by key.

So ranks whose step names agree over their common steps are one engine; a rank that agrees with
none starts another. Names that state no batch (`ProfilerStep#N`, a repeated range, a period)
agree on every rank, which keeps such a run one engine, as before.

Each engine's steps keep their own numbers, offset by `ENGINE_STEP_BASE` times the engine's
position (a power of ten above every engine's step count), so a step id names one engine's
iteration and the rest of the pipeline, which matches steps across ranks by id, needs no change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Share of common steps whose names must agree for two ranks to be one engine. The ranks of one
#: engine agree on all of them; two engines' batch-naming annotations on few.
SAME_ENGINE_AGREEMENT = 0.9
#: Fewer common steps than this and ranks are not told apart (too few names to compare).
MIN_COMMON_STEPS = 4
#: Steps of the n-th engine are numbered from n × this, or the next power of ten above the longest
#: engine's step count when that is larger.
ENGINE_STEP_BASE = 1000


@dataclass(frozen=True)
class EnginePlace:
    """Where one engine sits in its run when it is analysed on its own (`teller.callchain.split`):
    its position among the run's engines and the run's step base, so its steps keep the ids the
    whole run's analysis gives them."""

    index: int
    base: int


@dataclass(frozen=True)
class StepNumbering:
    """How one time window of a run numbers its steps so that they keep the whole run's ids
    (`teller.callchain.windows`): each rank's steps from its first step's ordinal in the run,
    and the run's step base for engines after the first."""

    base: int
    first_of_rank: tuple[tuple[int, int], ...]  # (rank, ordinal of its first step here)

    def shift(self, rank: np.ndarray) -> np.ndarray:
        """Per row of `rank`, what its rank's ordinals start from."""
        first = dict(self.first_of_rank)
        return np.asarray([first.get(int(r), 0) for r in rank.tolist()], dtype=np.int64)


def group_ranks(rank: np.ndarray, name: list[str]) -> dict[int, int]:
    """Each rank's engine (0 for the lowest rank's), from the step table's ranks and names, rows
    sorted by rank then time."""
    names_of: dict[int, list[str]] = {}
    for r, step_name in zip(rank.tolist(), name, strict=True):
        names_of.setdefault(int(r), []).append(step_name)
    engine_of: dict[int, int] = {}
    founders: list[list[str]] = []  # per engine, the step names of its lowest rank
    for r in sorted(names_of):
        mine = names_of[r]
        for engine, theirs in enumerate(founders):
            if same_engine(mine, theirs):
                engine_of[r] = engine
                break
        else:
            engine_of[r] = len(founders)
            founders.append(mine)
    return engine_of


def same_engine(a: list[str], b: list[str]) -> bool:
    common = min(len(a), len(b))
    if common < MIN_COMMON_STEPS:
        return True
    agree = sum(x == y for x, y in zip(a[:common], b[:common], strict=True))
    return agree >= SAME_ENGINE_AGREEMENT * common


def step_base(steps_per_engine: int) -> int:
    """How far apart two engines' step numbers start."""
    base = ENGINE_STEP_BASE
    while base <= steps_per_engine:
        base *= 10
    return base


def describe_engines(engine_of: dict[int, int], base: int) -> str:
    """The note a run with several engines gets: which ranks each one holds, and its numbers."""
    parts = []
    for engine in sorted(set(engine_of.values())):
        ranks = [r for r, e in engine_of.items() if e == engine]
        shown = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_span(ranks)}"
        parts.append(f"engine {engine}: {shown}, steps from {engine * base}")
    return (
        f"{len(parts)} engines in one run (their step annotations differ: each names its own "
        "batches or iterations); each engine's steps are compared only with its own ranks' — "
        + "; ".join(parts)
    )


def _span(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}–{ranks[-1]}"
    return ", ".join(map(str, ranks))
