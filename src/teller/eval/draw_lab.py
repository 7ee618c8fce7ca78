"""Drawing real lab cases with their parameters random, for recipes beyond one lab shape.

Every lab training case before lab-train-v2 ran at TP 2, 6 requests/s for 8 s with the fault
from 2.5 to 5.5 s, at one intensity per fault; a model trained on them learned that one load and
one window. A drawn lab recipe varies what the lab can vary per case: the tensor-parallel width
(2 or 3 ranks, which this 2-core machine can run), the arrival rate, how long requests arrive,
where the fault window sits and how long it lasts, the fault's intensity (within the range where
the fault acts and the run still finishes) and the guilty rank.

Held-out lab parameters stay out by construction: `RATE_RANGE` and `DURATION_RANGE` leave out the
rates and durations an evaluation recipe holds (lab-shapes-v1 runs at 3 and 10 requests/s), so a
model scored there meets arrival rates it never trained on.
"""

from __future__ import annotations

import numpy as np

from teller.faults import ENGINE_WIDE_FAULTS
from teller.lab.faults.catalog import LAB_FAULTS

TP_SIZES = (2, 3)
RATE_RANGE = (4.0, 8.0)  # requests per second, uniform
DURATION_RANGE = (6.0, 12.0)  # seconds of arrivals, uniform
WINDOW_LENGTH_RANGE = (2.0, 4.5)  # seconds
#: Per fault, the intensities at which it acts without stopping the run (see each fault's
#: module: the CPU share left, hog count, link rate, memory allowance, GC share, batch cap).
INTENSITY_RANGE: dict[str, tuple[float, float]] = {
    "cpu_contention": (0.3, 1.0),  # 1 to 4 hogs on the rank's core
    "straggler": (0.4, 0.9),  # 60% down to 10% of a CPU
    "net_throttle": (0.6, 0.97),  # 80 down to 6 Mbit/s
    "slow_operator": (1.0, 1.0),  # a switch: the math attention path
    "scheduler_misconfig": (0.6, 1.0),  # batch and token caps from 40% of normal to the minimum
    "host_stall": (0.3, 0.7),  # share of wall time in forced collections
    "memory_pressure": (0.7, 0.95),  # share of the rank's file pages taken away
    "workload_shift": (0.2, 0.6),  # burst rate and prompt length
}


def lab_faults() -> tuple[str, ...]:
    """Every lab fault, `none` first; each gets an intensity range above."""
    missing = sorted(set(LAB_FAULTS) - set(INTENSITY_RANGE) - {"none"})
    if missing:
        raise ValueError(f"no intensity range for lab faults {missing}")
    return tuple(LAB_FAULTS)


def draw_lab_cases(count: int, seed: int, prefix: str) -> list[dict]:
    """`count` recipe entries (`teller lab recipe` format), cycling through every lab fault so each
    appears count / 9 times; case i runs the workload seed seed + i."""
    rng = np.random.default_rng(seed)
    faults = lab_faults()
    return [
        _draw_case(rng, f"{prefix}-{i:03d}", seed + i, faults[i % len(faults)])
        for i in range(count)
    ]


def _draw_case(rng: np.random.Generator, stem: str, seed: int, fault: str) -> dict:
    tp = int(rng.choice(TP_SIZES))
    duration = round(float(rng.uniform(*DURATION_RANGE)), 1)
    args: dict = {
        "fault": fault,
        "tp": tp,
        "seed": seed,
        "duration": duration,
        "rate": round(float(rng.uniform(*RATE_RANGE)), 1),
    }
    if fault != "none":
        length = min(float(rng.uniform(*WINDOW_LENGTH_RANGE)), duration - 2.0)
        start = float(rng.uniform(1.0, duration - length - 0.5))
        args["window"] = f"{start:.1f}:{start + length:.1f}"
        low, high = INTENSITY_RANGE[fault]
        args["intensity"] = round(float(rng.uniform(low, high)), 2)
        args["rank"] = 0 if fault in ENGINE_WIDE_FAULTS else int(rng.integers(tp))  # no guilty rank
    return {"id": f"{stem}-tp{tp}-{fault}", "kind": "lab", "args": args}
