"""A run of several engines cut into its engines, so each can be analysed on its own.

Data-parallel engines (replicas) share nothing an analysis compares: each schedules its own
batches, and their steps are only ever compared with their own ranks' (`engines.py`). A run of
many of them is too large to hold as one tree (64 ranks × 2,000 steps is about 10⁸ nodes), and
nothing forces it to be: each engine's tree can be built, analysed and let go in turn, so memory
is bounded by the largest engine, not the run (DESIGN.md §6, the per-rank map and its reduce).

Telling engines apart needs every rank's step names, which only a built tree has. So the split
reads every file once for them (`file_steps`, in the per-rank map's workers) and keeps its
step table and node counts; the tables joined are numbered and grouped into engines as the
whole run's steps are (`steps.number_engines`). The forests themselves are written to disk as
they are built (`kept_forest`), and each engine's are loaded back when it is analysed: memory
holds one engine, and no file is parsed twice.

Each engine keeps what the whole run's analysis gives it: its steps' ids (`EnginePlace`), its
nodes' indices, which are shifted by the other engines' nodes that the run's tree would order
before them (`EnginePart.run_nodes`: that tree sorts nodes by host or GPU side, then rank), and
the step models, fitted over every engine's iterations as the whole run fits them (a step's time
and batch are the same in its file's own tree).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from teller.callchain.engines import ENGINE_STEP_BASE, EnginePlace, StepNumbering
from teller.callchain.facts import Iterations, iterations_of_steps
from teller.callchain.kept_forest import keep_forest
from teller.callchain.per_rank import file_forest
from teller.callchain.steps import (
    FOUND_BY_ENGINE,
    FOUND_BY_PROFILER_STEP,
    FOUND_BY_REGEX,
    StepTable,
    number_engines,
)
from teller.callchain.tree import CallTree, FileForest, join_forests

#: Steps found by these rules carry the batch names that tell engines apart (`engines.py`).
NAMED_BY_ANNOTATION = (FOUND_BY_ENGINE, FOUND_BY_PROFILER_STEP, FOUND_BY_REGEX)

#: A node's side of the run's tree: host (CPU) nodes come before every GPU node.
NodeSide = tuple[bool, int]  # (on a GPU, rank)


@dataclass
class FileSteps:
    """What one file's own tree says about its engine: its ranks' steps, in time order."""

    path: Path
    steps: StepTable  # the file's own steps, numbered from 0 on each rank
    annotated: bool  # every step named by an annotation (rule 1 of `steps.py`) or the regex
    nodes_of_side: dict[NodeSide, int]  # how many nodes of each (GPU?, rank) the file has
    kept: Path | None  # where its forest was written (`kept_forest`); None: not written


def file_steps(path: Path, step_regex: str | None = None, keep_in: Path | None = None) -> FileSteps:
    """In a worker: one file read and built into its own tree, and only its step table and
    node counts kept; its forest written under `keep_in` where that folder exists here (a Ray
    worker on another machine does not see it, and that engine's files are read again)."""
    return forest_steps(file_forest(path), step_regex, keep_in)


def forest_steps(
    read: FileForest, step_regex: str | None = None, keep_in: Path | None = None
) -> FileSteps:
    """What `file_steps` keeps of a forest already built (a file's, or one time window of it:
    `windows.py`)."""
    path = read.path
    kept = keep_forest(read, keep_in) if keep_in is not None and keep_in.is_dir() else None
    forest = read.forest
    nodes_of_side = _nodes_of_side(forest.stream >= 0, forest.rank)
    steps = join_forests([forest], step_regex).steps
    annotated = bool(len(steps)) and all(how in NAMED_BY_ANNOTATION for how in steps.found_by)
    return FileSteps(path, steps, annotated, nodes_of_side, kept)


def _nodes_of_side(on_gpu: np.ndarray, rank: np.ndarray) -> dict[NodeSide, int]:
    """How many nodes each (GPU?, rank) has: a count per side, the ranks being few."""
    if not len(rank):
        return {}
    lowest = int(rank.min())
    side = (rank.astype(np.int64) - lowest) * 2 + on_gpu
    return {
        (bool(key % 2), key // 2 + lowest): int(count)
        for key, count in enumerate(np.bincount(side).tolist())
        if count
    }


@dataclass
class EnginePart:
    """One engine of a split run: its files and ranks, and where it sits in the run."""

    place: EnginePlace
    files: list[Path]
    kept: dict[Path, Path]  # a file's forest where the first pass wrote it (`kept_forest`)
    ranks: list[int]
    #: per (GPU?, rank) of this engine: the other engines' nodes the run's tree orders first
    shift_of_side: dict[NodeSide, int]
    nodes_of_side: dict[NodeSide, int]  # this engine's own nodes of each (GPU?, rank)

    def run_nodes(self, tree: CallTree, nodes: np.ndarray) -> np.ndarray:
        """This engine's `tree` node indices as the whole run's tree would number them."""
        nodes = np.asarray(nodes, dtype=np.int64)
        shifts = np.asarray(
            [
                self.shift_of_side.get((bool(tree.stream[n] >= 0), int(tree.rank[n])), 0)
                for n in nodes.tolist()
            ],
            dtype=np.int64,
        )
        return nodes + shifts

    def engine_node(self, run_node: int) -> int | None:
        """The node of this engine's tree that the run's tree numbers `run_node`; None where
        that is another engine's node."""
        first = 0
        for side in sorted(self.nodes_of_side):
            local = run_node - self.shift_of_side[side]
            if first <= local < first + self.nodes_of_side[side]:
                return local
            first += self.nodes_of_side[side]
        return None


@dataclass
class EngineSplit:
    """A run cut into its engines, and the note the whole run's analysis gives about them."""

    parts: list[EnginePart]
    note: str
    ranks: list[int]
    iterations: Iterations  # the whole run's, which its step models are fitted over


def split_by_engine(
    files: list[FileSteps], numbering: StepNumbering | None = None
) -> EngineSplit | None:
    """The run's engines, each with its files, or None where the run cannot be cut: one engine,
    steps not named by annotations (ranks found by repeats or periods name no batch), or a file
    that holds ranks of two engines. `numbering`: the files are one time window of a run."""
    if len(files) < 2 or not all(f.annotated for f in files):
        return None
    # the run's step table, numbered as the whole run's analysis numbers it
    by_rank = sorted(files, key=lambda f: int(f.steps.rank.min()))
    steps = StepTable.joined([f.steps for f in by_rank], ENGINE_STEP_BASE)
    notes = number_engines(steps, numbering=numbering)
    if not notes:
        return None
    engine_of = dict(zip(steps.rank.tolist(), steps.engine.tolist(), strict=True))
    engine_of_file: list[int] = []
    for file in files:
        found = {engine_of[r] for r in file.steps.rank.tolist()}
        if len(found) != 1:
            return None
        engine_of_file.append(found.pop())
    nodes_of_side: dict[NodeSide, int] = {}
    for file in files:
        for side, count in file.nodes_of_side.items():
            nodes_of_side[side] = nodes_of_side.get(side, 0) + count
    parts = []
    for engine in sorted(set(engine_of.values())):
        mine = {side for side in nodes_of_side if engine_of.get(side[1], -1) == engine}
        others = sorted(set(nodes_of_side) - mine)
        mine_files = [f for f, e in zip(files, engine_of_file, strict=True) if e == engine]
        shift_of_side = {
            side: sum(nodes_of_side[o] for o in others if o < side) for side in sorted(mine)
        }
        parts.append(
            EnginePart(
                place=EnginePlace(engine, steps.engine_base),
                files=[f.path for f in mine_files],
                kept={f.path: f.kept for f in mine_files if f.kept is not None},
                ranks=sorted(r for r, e in engine_of.items() if e == engine),
                shift_of_side=shift_of_side,
                nodes_of_side={side: nodes_of_side[side] for side in sorted(mine)},
            )
        )
    return EngineSplit(parts, notes[0], sorted(engine_of), iterations_of_steps(steps))
