"""Drawing simulated cases with every simulator knob random, for recipes that span what users run.

The shipped checkpoints learned from two shapes (1 × 4 GPUs TP4 for 40–60 steps, 2 × 2 TP4), and a
board re-drawn from those shapes measures the training distribution. A drawn recipe varies every
knob per case instead: the cluster (nodes 1–8, 1–8 GPUs each), tensor and pipeline parallelism
(TP 1/2/4/8, PP 1/2/4, as many replicas as the GPUs hold), decoder layers (4–80, log-uniform),
eager or CUDA-graph decode, Python frames or none, the scheduler's token and request budgets, the
KV cache, request rates from idle to saturated, step counts, fault windows anywhere, intensities
from barely visible to severe (log-uniform), the guilty rank anywhere and the kernel-regression
variant.

The layout is drawn first (each allowed TP × PP alike), then the replicas and how the GPUs sit
on nodes, then steps and layers within the size budget (the simulator writes about 330 events
per rank, step and decoder layer, so the budget bounds a case's events), then a fault among
those that can act on that cluster (a network fault needs a parallel group spanning nodes, a
collective fault tensor parallelism).

`hold_out` names shapes a recipe must not contain, so a training recipe can leave out what an
evaluation recipe holds (`"tp8"`: tensor parallelism of 8; `"pp"`: pipeline parallelism);
`only` keeps the drawn cases to those shapes instead, for the held-out evaluation recipe;
`hold_out_faults` leaves fault types out (the board's held-out fault row).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from teller.lab.sim.faults import SIM_FAULTS

#: Shapes a recipe can hold out (or keep to): name → whether a (tp, pp) has it.
SHAPES = {
    "tp8": lambda tp, pp: tp == 8,
    "pp": lambda tp, pp: pp > 1,
}
#: Faults acting on the network between nodes: they need a parallel group spanning nodes.
NETWORK_FAULTS = frozenset({"net_delay", "bandwidth_throttle"})
#: Faults acting on a collective among a tensor-parallel group: they need TP ≥ 2.
COLLECTIVE_FAULTS = frozenset({"straggler", "link_contention", "collective_hang"})
#: Faults whose guilty party is not a rank (the workload, the scheduler, the KV cache).
RUN_WIDE_FAULTS = frozenset({"none", "workload_shift", "scheduler_misconfig", "kv_pressure"})
DEFAULT_BUDGET = 8_000  # (rank, step, layer) triples: about 2.6 M events
TP_SIZES = (1, 2, 4, 8)
PP_SIZES = (1, 2, 4)
REPLICAS = (1, 1, 2, 2, 4)  # replicas of the parallel group: more often few than many
GPUS_PER_NODE = (1, 2, 4, 8)
MAX_NODES = 8
MAX_WORLD = 64
INTENSITY_RANGE = (0.1, 2.0)
LAYER_RANGE = (4, 80)
RATE_RANGE = (2.0, 400.0)  # requests per second
STEP_RANGE = (30, 120)


@dataclass(frozen=True)
class DrawRules:
    """What a drawn recipe may hold."""

    hold_out: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    hold_out_faults: tuple[str, ...] = ()
    budget: int = DEFAULT_BUDGET
    #: the most ranks a case may have (1: single-GPU runs only)
    max_world: int = MAX_WORLD

    def __post_init__(self) -> None:
        unknown = sorted(set(self.hold_out + self.only) - set(SHAPES))
        if unknown:
            raise ValueError(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
        unknown = sorted(set(self.hold_out_faults) - set(SIM_FAULTS))
        if unknown:
            raise ValueError(f"unknown faults {unknown}; known: {', '.join(SIM_FAULTS)}")

    def allows(self, tp: int, pp: int) -> bool:
        if tp * pp > self.max_world or any(SHAPES[name](tp, pp) for name in self.hold_out):
            return False
        return not self.only or any(SHAPES[name](tp, pp) for name in self.only)


def draw_cases(count: int, seed: int, prefix: str, rules: DrawRules) -> list[dict]:
    """`count` recipe entries (`teller lab recipe` format), case i with simulator seed seed + i."""
    rng = np.random.default_rng(seed)
    return [_draw_case(rng, f"{prefix}-{i:03d}", seed + i, rules) for i in range(count)]


def _draw_case(rng: np.random.Generator, stem: str, seed: int, rules: DrawRules) -> dict:
    layouts = [(tp, pp) for tp in TP_SIZES for pp in PP_SIZES if rules.allows(tp, pp)]
    if not layouts:
        raise ValueError("the rules leave no parallel layout to draw")
    while True:
        tp, pp = layouts[int(rng.integers(len(layouts)))]
        world = tp * pp * int(rng.choice(REPLICAS))
        node_sizes = [g for g in GPUS_PER_NODE if world % g == 0 and world // g <= MAX_NODES]
        if world > rules.max_world or not node_sizes:
            continue
        gpus_per_node = int(rng.choice(node_sizes))
        nodes = world // gpus_per_node
        steps = int(rng.integers(STEP_RANGE[0], STEP_RANGE[1] + 1))
        steps = min(steps, rules.budget // (world * LAYER_RANGE[0]))
        if steps < STEP_RANGE[0]:
            continue
        most_layers = min(LAYER_RANGE[1], rules.budget // (world * steps))
        layers = round(_log_uniform(rng, LAYER_RANGE[0], most_layers))
        faults = [
            f
            for f in SIM_FAULTS
            if f not in rules.hold_out_faults
            and not (f in NETWORK_FAULTS and tp * pp <= gpus_per_node)
            and not (f in COLLECTIVE_FAULTS and tp < 2)
        ]
        fault = str(rng.choice(faults))
        break
    args: dict = {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "tp": tp,
        "pp": pp,
        "steps": steps,
        "layers": layers,
        "fault": fault,
        "seed": seed,
        "rate": round(_log_uniform(rng, *RATE_RANGE), 1),
        "max_batched_tokens": int(rng.choice([512, 1024, 2048, 4096, 8192])),
        "max_seqs": int(rng.choice([16, 32, 64, 128, 256])),
        "kv_blocks": int(rng.choice([1024, 2048, 4096, 8192])),
    }
    if rng.random() < 0.3:
        args["eager"] = True
    if rng.random() < 0.3:
        args["no_python"] = True
    if fault != "none":
        length = int(rng.integers(3, max(4, steps // 3) + 1))
        start = int(rng.integers(2, steps - length))
        args["window"] = f"{start}:{start + length}"
        args["intensity"] = round(_log_uniform(rng, *INTENSITY_RANGE), 2)
        if fault not in RUN_WIDE_FAULTS:
            args["rank"] = int(rng.integers(world))
        if fault == "kernel_regression" and rng.random() < 0.5 and not args.get("eager"):
            args["variant"] = "graph_fallback"
    shape = f"{nodes}x{gpus_per_node}-tp{tp}" + (f"pp{pp}" if pp > 1 else "")
    return {"id": f"{stem}-{shape}-{fault}", "kind": "sim", "args": args}


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))
