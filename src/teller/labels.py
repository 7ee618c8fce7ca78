"""The `labels.json` of a case: what fault was injected, where and when, and the reference verdict.

The real lab and the simulator write the same schema, so training, evaluation and the reports
treat their cases alike (DESIGN.md §4). Steps are the rank-local step ordinals that
`teller.callchain.build_tree` finds; with tensor parallelism every rank runs every step, so one
ordinal names the same iteration on all ranks. Where a run holds several engines (data-parallel
replicas), they count the guilty rank's engine's iterations, and `keyed_to` turns them into the
tree's step ids.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

from teller.atomic import write_text_atomic
from teller.errors import TraceError
from teller.faults import ENGINE_WIDE_FAULTS, FAULTS
from teller.layout import CaseDir


class StepIds(Protocol):
    """What `CaseLabels.keyed_to` needs of a step table (`teller.callchain.steps.StepTable`)."""

    def step_ids(self, rank: int | None, iterations: list[int]) -> list[int]: ...


SCHEMA = "teller.labels/1"


@dataclass
class CaseLabels:
    """Ground truth of one case (one injection run)."""

    case_id: str
    source: str  # "lab" or "sim"
    fault: str
    view: str  # "V", "H" or "-"
    guilty_rank: int | None
    guilty_operator: str | None  # a call-chain node name, as the readers name it
    window_ns: tuple[int, int] | None  # unix ns, [start, end)
    steps: list[int]  # rank-local step ordinals the fault acted on (its window, or less)
    intensity: float
    seed: int
    explanation: str  # one-sentence reference explanation
    params: dict = field(default_factory=dict)  # fault- and workload-specific settings
    schema: str = SCHEMA

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; known: {', '.join(FAULTS)}")
        if self.view != FAULTS[self.fault]:
            raise ValueError(
                f"fault {self.fault!r} is view {FAULTS[self.fault]!r}, not {self.view!r}"
            )
        if self.window_ns is not None:
            self.window_ns = (int(self.window_ns[0]), int(self.window_ns[1]))

    @property
    def is_fault(self) -> bool:
        return self.view != "-"

    def keyed_to(self, steps: StepIds) -> CaseLabels:
        """These labels with their steps as ids of `steps`, whose engines after the first are
        numbered apart (`teller.callchain.engines`): the guilty rank's engine's iterations."""
        ids = steps.step_ids(self.guilty_rank, self.steps)
        return self if ids == list(self.steps) else replace(self, steps=ids)

    def write(self, case_dir: str | Path) -> Path:
        """Write `labels.json` atomically into the case directory."""
        return write_text_atomic(CaseDir(Path(case_dir)).labels, json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, case_dir: str | Path) -> CaseLabels:
        path = Path(case_dir)
        path = CaseDir(path).labels if path.is_dir() else path
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise TraceError(path, "no labels.json: not a labelled case") from None
        except json.JSONDecodeError as error:
            raise TraceError(
                path, f"not valid JSON ({error.msg})", where=f"byte {error.pos}"
            ) from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise TraceError(path, f"expected a labels object with schema {SCHEMA!r}")
        try:
            return cls(**data)
        except (TypeError, ValueError) as error:
            raise TraceError(path, f"labels do not fit schema {SCHEMA}: {error}") from None


# -- what a trace cannot tell apart from the labelled guilty rank and operator --------------
#
# Ranks that a trace cannot tell apart from a case's labelled guilty rank.
#
# Some injected faults sit on something that several ranks share: a link of a tensor-parallel ring
# (`link_contention`: a ring all-reduce runs at its slowest link's pace, so every rank of the ring
# waits the same whichever of its links is contended; the simulator writes byte-identical traces
# for a contended link 0–1 and 2–3 of a four-rank ring), a node's network on a two-node ring (`net_delay`, `bandwidth_throttle`: every
# cross-node link touches both nodes, so throttling node 0 or node 1 slows exactly the same links),
# the one link of a two-rank lab run (`net_throttle` shapes the guilty rank's veth both ways, and all
# traffic between the two ranks crosses it). The timeline such a fault leaves is the same whichever of
# those ranks the label names, so no method can recover the label's choice among them; scoring that
# choice would score a coin toss. Naming any of these ranks therefore counts as naming the guilty one
# (DESIGN.md §5 talks of "link contention between a rank pair"). Every other fault keeps its one rank.
#
# Operators have the same problem in one place: a case's labels name one guilty operator, and a
# contended host (`host_cpu_contention`) delays the host's kernel launches, which are
# `cudaLaunchKernel` calls in eager steps and one `cudaGraphLaunch` in a step that replays a CUDA
# graph (such a step has no `cudaLaunchKernel` for its kernels at all). Either launch call is the
# guilty operator of that case (`equivalent_operators`).

#: Faults on a node's network (simulator): they slow every cross-node link that touches the node.
NODE_NETWORK_FAULTS = ("net_delay", "bandwidth_throttle")


def equivalent_ranks(labels: CaseLabels) -> frozenset[int]:
    """The labelled guilty rank plus every rank indistinguishable from it (empty without a rank)."""
    rank = labels.guilty_rank
    if rank is None:
        return frozenset()
    params = labels.params or {}
    if labels.fault == "link_contention" and params.get("peer") is not None:
        ring = _ring_of(rank, params.get("topology"))
        return frozenset({rank, int(params["peer"])} | ring)
    if labels.fault in NODE_NETWORK_FAULTS and isinstance(params.get("topology"), dict):
        return frozenset({rank} | _same_links_ranks(rank, params["topology"]))
    if labels.fault == "net_throttle" and int(params.get("tp", 0)) == 2:
        return frozenset({0, 1})
    return frozenset({rank})


#: Lab faults that take CPU time from the whole rank (a CPU quota, busy processes on its core):
#: the stall lands on whichever operator runs when the CPU is taken away, so the label's operator
#: is the likeliest place (the one that runs most), not the fault's. Scoring asks for the rank.
RANK_WIDE_LAB_FAULTS = frozenset({"cpu_contention", "straggler"})


def scored_operator(labels: CaseLabels) -> str | None:
    """The operator a finding must name to be right: the label's, except where the fault slows
    no operator in particular (`RANK_WIDE_LAB_FAULTS`)."""
    if labels.source == "lab" and labels.fault in RANK_WIDE_LAB_FAULTS:
        return None
    return labels.guilty_operator


def rank_scored(labels: CaseLabels) -> bool:
    """Whether a finding must name the guilty rank to be right: for horizontal faults (the
    method's job is to tell the rank from its waiting peers), and for faults of one rank whose
    operator is not scored (else a finding on any rank would do)."""
    if labels.guilty_rank is None:
        return False
    if labels.view == "H":
        return True
    return scored_operator(labels) is None and labels.fault not in ENGINE_WIDE_FAULTS


#: The host calls that launch GPU work: eagerly, kernel by kernel, or a captured CUDA graph at once.
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaGraphLaunch")


def equivalent_operators(labels: CaseLabels) -> frozenset[str]:
    """The labelled guilty operator plus the names it goes by in steps where it does not run
    (empty without an operator)."""
    operator = labels.guilty_operator
    if operator is None:
        return frozenset()
    if labels.fault == "host_cpu_contention" and operator in LAUNCH_CALLS:
        return frozenset(LAUNCH_CALLS)
    return frozenset({operator})


def _ring_of(rank: int, topology: object) -> set[int]:
    """The simulator's tensor-parallel group of `rank` (consecutive blocks of `tp` ranks), whose
    all-reduce ring holds the contended link; empty where the labels do not give the topology."""
    if not isinstance(topology, dict) or int(topology.get("tp", 0)) < 2:
        return set()
    tp = int(topology["tp"])
    first = rank - rank % tp
    return set(range(first, first + tp))


def _same_links_ranks(rank: int, topology: dict) -> set[int]:
    """Ranks on nodes whose network fault leaves the same trace as the guilty node's.

    A node's network fault slows the simulator's traffic that crosses its link: the
    tensor-parallel rings with a hop over it, each as a whole (a ring all-reduce runs at its
    slowest hop's pace, wherever that hop is, so every node on a ring that crosses nodes leaves
    the same trace), and the pipeline sends from each stage's rank to the next stage's, each pair
    its own. Nodes that touch the same rings and the same pairs cannot be told apart. The
    layout is the simulator's (`Topology.rank_of`: replica, then stage, then tensor index),
    restated here because labels are read where the simulator is not imported."""
    per_node = int(topology["gpus_per_node"])
    nodes = int(topology["nodes"])
    tp, pp = int(topology.get("tp", 1)), int(topology.get("pp", 1))
    world, replica_size = per_node * nodes, tp * pp
    stage_firsts = [(base, stage) for base in range(0, world, replica_size) for stage in range(pp)]
    rings = [list(range(base + s * tp, base + (s + 1) * tp)) for base, s in stage_firsts]
    sends = [
        (base + s * tp + t, base + (s + 1) * tp + t)
        for base, s in stage_firsts
        if s < pp - 1
        for t in range(tp)
    ]

    def node(r: int) -> int:
        return r // per_node

    def crosses_at(n: int, a: int, b: int) -> bool:
        return node(a) != node(b) and n in (node(a), node(b))

    def touched(n: int) -> tuple[frozenset[int], frozenset[tuple[int, int]]]:
        crossing_rings = frozenset(
            i
            for i, ring in enumerate(rings)
            if any(crosses_at(n, a, b) for a, b in zip(ring, ring[1:] + ring[:1], strict=True))
        )
        return crossing_rings, frozenset(p for p in sends if crosses_at(n, *p))

    guilty = touched(node(rank))
    same = [n for n in range(nodes) if touched(n) == guilty]
    return {r for n in same for r in range(n * per_node, (n + 1) * per_node)}
