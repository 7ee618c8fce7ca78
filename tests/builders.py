"""Tiny two-rank Kineto runs built in code, whose answer is known by construction.

Used by the localizer and harness tests to pin mechanisms one at a time; real recorded cases
exercise the same code end to end elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path

STEPS = 12


def write_run(
    directory: Path,
    slow_mm: dict[tuple[int, int], float] | None = None,
    late: dict[tuple[int, int], int] | None = None,
    tokens: dict[int, int] | None = None,
) -> list[Path]:
    """Two ranks, each step: 4 layers of (mm, add) then an all-reduce that ends when both arrive.

    `slow_mm[(rank, step)]` multiplies that rank's mm time; `late[(rank, step)]` delays its arrival
    at the all-reduce (µs); `tokens[step]` sets the prefill size (mm time grows with it).
    """
    slow_mm, late, tokens = slow_mm or {}, late or {}, tokens or {}
    events: dict[int, list[dict]] = {0: [], 1: []}
    clock = 1000.0
    for step in range(STEPS):
        ctx = tokens.get(step, 64)
        compute_end = {}
        for rank in (0, 1):
            t = clock
            body = []
            for _layer in range(4):
                mm = (20.0 + ctx * 0.5) * slow_mm.get((rank, step), 1.0)
                body.append(("aten::mm", t, mm))
                t += mm + 1
                body.append(("aten::add", t, 5.0))
                t += 6
            t += late.get((rank, step), 0)
            compute_end[rank] = (t, body)
        done = max(end for end, _ in compute_end.values()) + 30.0
        for rank in (0, 1):
            end, body = compute_end[rank]
            name = f"execute_context_1({ctx})_generation_0(0)"
            events[rank].append(op(name, "user_annotation", clock, done + 2 - clock))
            events[rank].extend(op(n, "cpu_op", ts, dur) for n, ts, dur in body)
            events[rank].append(op("gloo:all_reduce", "user_annotation", end, done - end))
        clock = done + 10
    paths = []
    for rank, rank_events in events.items():
        path = directory / f"rank{rank}.pt.trace.json"
        document = {
            "distributedInfo": {"rank": rank, "world_size": 2},
            "baseTimeNanoseconds": 1,
            "traceEvents": rank_events,
        }
        path.write_text(json.dumps(document))
        paths.append(path)
    return paths


def op(name: str, cat: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def simulated_straggler(
    case: Path, topology: object, steps: int, rank: int, window: tuple[int, int]
) -> Path:
    """A simulated case (`teller lab sim`, 2 layers, no Python frames, seed 3) of `topology`
    with a full-intensity straggler on `rank` over the steps `window`, written to `case`."""
    from teller.lab.sim import FaultSpec, SimConfig, simulate

    config = SimConfig(
        topology,
        steps=steps,
        layers=2,
        python_frames=False,
        fault=FaultSpec("straggler", rank=rank, intensity=1.0, window=window),
        seed=3,
    )
    simulate(config, case)
    return case


def two_tp2_replicas(case: Path) -> Path:
    """A simulated run of two TP2 engines on one node (`teller lab sim`, 30 steps, 2 layers, no
    Python frames, seed 3), rank 3's GPU throttled over steps 12–17, written to `case`."""
    from teller.lab.sim import FaultSpec, SimConfig, simulate
    from teller.lab.sim.topology import Topology

    fault = FaultSpec("gpu_throttle", rank=3, intensity=1.0, window=(12, 18))
    config = SimConfig(
        Topology(1, 4, 2, 1), steps=30, layers=2, python_frames=False, fault=fault, seed=3
    )
    simulate(config, case)
    return case
