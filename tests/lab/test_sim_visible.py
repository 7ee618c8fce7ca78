"""A timed fault's labels hold only the window steps it visibly slowed (teller.lab.sim.visible).

Each test builds a small pipeline-parallel case, where a slower network link carries little in a
decode step, so some window steps are slowed by the fault and others barely at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import teller.lab.sim.run as sim_run
from teller.lab.sim import EngineConfig, FaultSpec, SimConfig, Topology, WorkloadConfig, simulate
from teller.lab.sim.visible import VISIBLE_FLOOR_NS, VISIBLE_SHARE, FaultFreeStep
from teller.labels import CaseLabels

WINDOW = (10, 30)


def config(fault: str, intensity: float = 1.0) -> SimConfig:
    return SimConfig(
        topology=Topology(2, 2, 2, 2),
        steps=40,
        layers=2,
        python_frames=False,
        engine=EngineConfig(kv_blocks=4096),
        workload=WorkloadConfig(rate_per_s=100.0, initial_requests=48),
        fault=FaultSpec(fault, rank=0, intensity=intensity, window=WINDOW),
        seed=0,
    )


def step_ends(out: Path) -> dict[int, int]:
    rows = map(json.loads, (out / "ground_truth" / "steps.jsonl").read_text().splitlines())
    return {row["step"]: row["end_ns"] for row in rows}


def test_the_replay_ends_where_the_fault_free_run_ends_and_labels_the_visible_steps(
    tmp_path, monkeypatch
):
    seen: list[tuple[FaultFreeStep, int]] = []
    judge = FaultFreeStep.visible

    def recording(self: FaultFreeStep, model, end_ns: int) -> bool:
        seen.append((self, self.added_ns(model, end_ns)))
        return judge(self, model, end_ns)

    monkeypatch.setattr(FaultFreeStep, "visible", recording)
    simulate(config("bandwidth_throttle"), tmp_path / "fault")
    simulate(config("none"), tmp_path / "none")
    assert len(seen) == WINDOW[1] - WINDOW[0]
    # up to the window both runs are the same, so the first window step's replay without the
    # fault must end exactly where the fault-free run's step did
    assert seen[0][0].end_ns == step_ends(tmp_path / "none")[WINDOW[0]]
    visible = [
        step
        for step, (fault_free, added) in zip(range(*WINDOW), seen, strict=True)
        if added >= max(VISIBLE_SHARE * (fault_free.end_ns - fault_free.start_ns), VISIBLE_FLOOR_NS)
    ]
    labels = CaseLabels.read(tmp_path / "fault")
    assert labels.steps == visible
    # this case holds both kinds: steps the throttled link visibly changed and steps it did not
    # (a decode step sends little between the stages)
    assert 0 < len(visible) < WINDOW[1] - WINDOW[0]


def test_a_fault_too_weak_to_slow_any_step_labels_none(tmp_path):
    simulate(config("net_delay", intensity=0.05), tmp_path / "case")
    labels = CaseLabels.read(tmp_path / "case")
    assert labels.fault == "net_delay" and labels.steps == []


def test_the_replay_leaves_the_written_case_unchanged(tmp_path, monkeypatch):
    simulate(config("bandwidth_throttle"), tmp_path / "replayed")
    monkeypatch.setattr(sim_run, "TIMED_FAULTS", frozenset())
    simulate(config("bandwidth_throttle"), tmp_path / "plain")
    for path in sorted((tmp_path / "plain").rglob("*")):
        if path.is_file() and path.name not in ("labels.json", "manifest.json"):
            replayed = tmp_path / "replayed" / path.relative_to(tmp_path / "plain")
            assert replayed.read_bytes() == path.read_bytes(), path.name
    assert CaseLabels.read(tmp_path / "plain").steps == list(range(*WINDOW))
