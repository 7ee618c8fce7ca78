"""Benchmark the localizer's candidate proposal: candidates for every step (what the root-cause
model reads, `candidate_z=-inf`) against the anchor, candidates for the flagged steps only
(z ≥ 3 and 3% over expected); and every step again on facts an anchor score already computed
(`RunFacts` shared, as when one run is scored twice).

    .venv/bin/python bench/localize.py                 # 2 generated simulator cases, 3 rounds
    .venv/bin/python bench/localize.py --case DIR ...  # recorded case directories instead

Each case is generated once (`teller.lab.sim.simulate`) into a temp dir and read into a call
tree once; rounds alternate the two configurations on that tree, and medians are reported.
Printed as Markdown, for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from teller.callchain.facts import RunFacts
from teller.eval.cases import Case
from teller.lab.sim import FaultSpec, SimConfig, Topology, simulate
from teller.labels import CaseLabels
from teller.localize import NumericLocalizer

#: (name, topology, steps, layers, fault): a one-node TP4 straggler and a two-node delayed link.
SIM_CASES = (
    (
        "sim TP4 1 node, straggler",
        Topology(1, 4, 4, 1),
        60,
        4,
        FaultSpec("straggler", rank=1, intensity=1.0, window=(25, 35)),
    ),
    (
        "sim TP4 2 nodes, net_delay",
        Topology(2, 2, 4, 1),
        50,
        4,
        FaultSpec("net_delay", rank=2, intensity=1.2, window=(20, 30)),
    ),
)


def anchor() -> NumericLocalizer:
    return NumericLocalizer(step_z=3.0, min_ratio=1.03, top_k=8)


def every_step() -> NumericLocalizer:
    return NumericLocalizer(step_z=3.0, min_ratio=1.03, top_k=8, candidate_z=float("-inf"))


def measure(name: str, case_dir: Path, rounds: int) -> str:
    tree = Case(case_dir, CaseLabels.read(case_dir)).tree()
    times: dict[str, list[float]] = {"flagged": [], "every": [], "shared": []}
    proposed: dict[str, int] = {}
    for _ in range(rounds):
        for label, make in (("flagged", anchor), ("every", every_step)):
            started = time.perf_counter()
            result = make().score(tree)
            times[label].append(time.perf_counter() - started)
            proposed[label] = sum(1 for found in result.candidates.values() if found)
        facts = RunFacts(tree)
        anchor().score(tree, facts)
        started = time.perf_counter()
        every_step().score(tree, facts)
        times["shared"].append(time.perf_counter() - started)
    flagged, every, shared = (statistics.median(times[k]) for k in ("flagged", "every", "shared"))
    return (
        f"| {name} | {len(tree.name):,} | {proposed['flagged']} | {flagged:.2f} | "
        f"{proposed['every']} | {every:.2f} | {every / flagged:.2f} | "
        f"{1e3 * every / max(proposed['every'], 1):.0f} | {shared:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs="*", default=[], help="recorded case directories")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}")
    print()
    print(
        "| case | nodes | steps proposed (anchor) | anchor s | steps proposed (every) | every s "
        "| ratio every/anchor | ms per proposed step | every s, facts shared |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="teller-bench-localize-") as tmp:
        cases = [(Path(c).name, Path(c)) for c in args.case]
        if not cases:
            for i, (name, topology, steps, layers, fault) in enumerate(SIM_CASES):
                out = Path(tmp) / f"case{i}"
                simulate(
                    SimConfig(
                        topology=topology, steps=steps, layers=layers, fault=fault, seed=5 + i
                    ),
                    out,
                )
                cases.append((name, out))
        for name, case_dir in cases:
            print(measure(name, case_dir, args.rounds), flush=True)


if __name__ == "__main__":
    main()
